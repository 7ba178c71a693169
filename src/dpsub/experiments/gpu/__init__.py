"""The GPU kit (docs/gpu.md): staging for a GPU machine without network, one command that
checks, smoke-tests, benches and trains table cells there, and the harvest of its outputs.

* :mod:`dpsub.gpu.stage`: what travels (the carry list and its size), ``.gpu/`` staging;
* :mod:`dpsub.gpu.kit`: the steps (check, smoke, bench, cells), each bounded in time;
* :mod:`dpsub.gpu.cells`: GEP Table 1 CIFAR-10 cells by priority, across commands;
* :mod:`dpsub.gpu.harvest`: ``$OUT``'s tars back into ``results/`` and ``.gpu/cells``;
* :mod:`dpsub.gpu.authors`: optional timing of one step of the GEP authors' code.

Nothing here imports torch or hydra at import time: the kit installs them first.
"""
