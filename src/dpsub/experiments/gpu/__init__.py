"""The GPU kit (docs/gpu.md): staging for a GPU machine without network, one command that
checks, smoke-tests, benches and trains table cells there, and the harvest of its outputs.

* :mod:`dpsub.experiments.gpu.stage`: what travels (the carry list and its size), ``.gpu/`` staging;
* :mod:`dpsub.experiments.gpu.kit`: the steps (check, smoke, bench, cells), each bounded in time;
* :mod:`dpsub.experiments.gpu.cells`: GEP Table 1 CIFAR-10 cells by priority, across commands;
* :mod:`dpsub.experiments.gpu.harvest`: ``$OUT``'s tars back into ``results/`` and ``.gpu/cells``;
* :mod:`dpsub.experiments.gpu.authors`: optional timing of one step of the GEP authors' code.

Nothing here imports torch or hydra at import time: the kit installs them first.
"""
