"""PATE: private aggregation of teacher ensembles (Papernot et al. 2017, 2018).

A different kind of mechanism from gradient perturbation: teachers trained without
privacy on disjoint partitions of the private data vote on unlabeled public queries; a
noisy aggregator answers some queries; a student learns from the answers only.

* :mod:`dpsub.pate.votes`: the disjoint partition and the vote histograms (torch-free).
* :mod:`dpsub.pate.aggregators`: LNMax, GNMax, Confident-GNMax (torch-free).
* :mod:`dpsub.pate.accounting`: data-independent RDP (the run's epsilon) and the
  data-dependent bound of the 2018 paper (reported, not a guarantee).
* :mod:`dpsub.pate.smooth`: the 2018 paper's release of the data-dependent bound with
  smooth sensitivity (noisy, its cost charged).
* :mod:`dpsub.pate.teachers`, :mod:`dpsub.pate.student`, :mod:`dpsub.cli.pate`: the
  ``dpsub-pate`` entry point (docs/pate.md).
"""
