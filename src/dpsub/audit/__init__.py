"""Empirical privacy auditing: measured lower bounds on epsilon (docs/audit.md).

* :mod:`dpsub.audit.bounds`: from attack outcomes to epsilon (Clopper-Pearson, mu-GDP fit,
  the one-run bound of Steinke et al.);
* :mod:`dpsub.audit.whitebox`: the gradient-canary audit of any mechanism's real step;
* :mod:`dpsub.audit.onerun`: the one-run input-space audit (m canary examples, one run);
* :mod:`dpsub.cli.audit`: ``dpsub-audit`` (writes ``audit.json`` beside ``summary.json``).
"""
