"""White-box audit of PATE's noisy aggregators (``audit=pate``; docs/audit.md, section 3).

The aggregator's input is a vote histogram; one training example changes one teacher's
vote (:mod:`dpsub.pate.votes`), so neighbouring inputs are two histograms that differ by
one vote moved from class ``a`` to class ``b``. The auditor controls the other teachers'
votes (white box): ``H = (x, T - x, 0, ...)`` against ``H' = (x - 1, T - x + 1, 0, ...)``,
``x`` the lead of class ``a``. Each trial calls the real aggregator
(:func:`dpsub.pate.aggregators.build_aggregator`) once on ``H`` or ``H'`` with a fresh
generator state and records its output (a label, or -1 when Confident-GNMax refuses).

The test "H' if the output is o" (or "... is not o") has rates FPR = P_H[o] and
FNR = 1 - P_H'[o]. The pair (x, o, side) is chosen on *pilot* trials; the rates are then
counted on fresh trials that never influenced the choice, and Clopper-Pearson turns them
into a valid lower bound (:func:`dpsub.audit.bounds.clopper_pearson_epsilon`). The claimed
epsilon is what the PATE ledger charges one query of that aggregator (its worst case).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dpsub.audit.bounds import clopper_pearson_epsilon
from dpsub.pate.accounting import ORDERS, record_rdp
from dpsub.pate.aggregators import build_aggregator
from dpsub.privacy.accountants import rdp_to_epsilon

REFUSED = -1


@dataclass(frozen=True)
class AggregatorAuditOptions:
    teachers: int = 50
    num_classes: int = 10
    leads: tuple[int, ...] = ()  # x values tried on the pilot (empty: every x in 1..teachers)
    pilot_trials: int = 10_000  # per hypothesis and lead
    trials: int = 200_000  # per hypothesis, counted
    alpha: float = 0.05
    seed: int = 0


def neighbours(teachers: int, num_classes: int, lead: int) -> tuple[np.ndarray, np.ndarray]:
    """(H, H'): ``lead`` votes for class 0, the rest for class 1; H' moves one to class 1."""
    if not 1 <= lead <= teachers:
        raise ValueError(f"lead must be in [1, {teachers}], got {lead}")
    h = np.zeros(num_classes, dtype=np.int64)
    h[0], h[1] = lead, teachers - lead
    h2 = h.copy()
    h2[0] -= 1
    h2[1] += 1
    return h, h2


def sample_outputs(agg, counts: np.ndarray, trials: int, rng: np.random.Generator) -> np.ndarray:
    """``trials`` outputs of the real aggregator on ``counts`` (-1: refused)."""
    out = np.empty(trials, dtype=np.int64)
    for i in range(trials):
        label = agg(counts, rng).label
        out[i] = REFUSED if label is None else label
    return out


def _event_bound(o_h, o_h2, event, side, delta, alpha) -> tuple[float, int, int]:
    """Bound of the test "H' iff (output == event) == side"; (eps, false pos, false neg)."""
    fp = int(((o_h == event) == side).sum())
    fn = int(((o_h2 == event) != side).sum())
    return clopper_pearson_epsilon(fp, len(o_h), fn, len(o_h2), delta, alpha), fp, fn


def _best_test(o_h, o_h2, n_eval: int, delta, alpha) -> tuple[float, int, bool]:
    """The (event, side) whose bound would be largest on ``n_eval`` trials per hypothesis
    if the evaluated rates equaled these pilot rates (half a count where none was seen)."""
    best = (-1.0, REFUSED, True)
    scale = n_eval / len(o_h)
    for event in np.union1d(o_h, o_h2):
        for side in (True, False):
            fp = ((o_h == event) == side).sum()
            fn = ((o_h2 == event) != side).sum()
            fp, fn = (round(scale * max(c, 0.5)) for c in (fp, fn))
            eps = clopper_pearson_epsilon(fp, n_eval, fn, n_eval, delta, alpha)
            best = max(best, (eps, int(event), side))
    return best


def claimed_epsilon(agg, delta: float) -> float:
    """What the PATE ledger charges one query of ``agg`` (data-independent, worst case)."""
    rdp = sum((record_rdp(r) for r in agg.worst_case()), np.zeros(len(ORDERS)))
    return rdp_to_epsilon(rdp, delta, ORDERS)


def audit_aggregator(pate_opts, opts: AggregatorAuditOptions, delta: float) -> dict:
    """Pilot over the leads, then the chosen test on fresh trials; the report."""
    agg = build_aggregator(pate_opts)
    rng = np.random.default_rng(np.random.SeedSequence([opts.seed, 0xA0D17]))
    t = opts.teachers
    leads = tuple(opts.leads) or tuple(range(1, t + 1))
    pilot = []
    for lead in leads:
        h, h2 = neighbours(t, opts.num_classes, lead)
        o_h = sample_outputs(agg, h, opts.pilot_trials, rng)
        o_h2 = sample_outputs(agg, h2, opts.pilot_trials, rng)
        pilot.append((*_best_test(o_h, o_h2, opts.trials, delta, opts.alpha), lead))
    _, event, side, lead = max(pilot)
    h, h2 = neighbours(t, opts.num_classes, lead)
    o_h = sample_outputs(agg, h, opts.trials, rng)
    o_h2 = sample_outputs(agg, h2, opts.trials, rng)
    eps, fp, fn = _event_bound(o_h, o_h2, event, side, delta, opts.alpha)
    return {
        "kind": "pate",
        "mechanism": agg.name,
        "neighbours": {"H": h.tolist(), "H_prime": h2.tolist()},
        "test": {"output": "refused" if event == REFUSED else event, "when": side},
        "lower_bound": {"epsilon": eps, "confidence": 1 - opts.alpha, "alpha": opts.alpha,
                        "false_pos": fp, "false_neg": fn, "n_out": len(o_h), "n_in": len(o_h2)},
        "trials": {"in": len(o_h2), "out": len(o_h), "pilot_per_lead": opts.pilot_trials,
                   "leads": list(leads)},
        "epsilon_upper": claimed_epsilon(agg, delta),
        "accountant": "rdp (data-independent, one PATE query)",
        "delta": delta,
    }  # fmt: skip


AGGREGATOR_KEYS = ("aggregator", "sigma1", "sigma2", "threshold", "laplace_scale")


def check_options(audit) -> None:
    """ConfigError naming the key: the aggregator's options as ``pate.*`` checks them."""
    from dpsub.errors import ConfigError
    from dpsub.pate.aggregators import AGGREGATORS
    from dpsub.pate.options import NEEDS, _positive

    if audit.aggregator not in AGGREGATORS:
        raise ConfigError(
            f"audit.aggregator: must be one of {AGGREGATORS}, got {audit.aggregator!r}"
        )
    for key in NEEDS[audit.aggregator]:
        _positive(audit.get(key), f"audit.{key}")
    if audit.aggregator == "confident" and not isinstance(audit.get("threshold"), int | float):
        raise ConfigError(f"audit.threshold: must be a number, got {audit.get('threshold')!r}")
    if audit.get("teachers", 2) < 2:
        raise ConfigError(f"audit.teachers: must be >= 2, got {audit.teachers!r}")


def audit_from_config(audit, delta: float) -> dict:
    """:func:`audit_aggregator` from the ``audit`` group of ``conf/audit/pate.yaml``."""
    agg = {k: audit.get(k) for k in AGGREGATOR_KEYS}
    opts = AggregatorAuditOptions(
        teachers=int(audit.teachers), leads=tuple(int(x) for x in audit.leads),
        pilot_trials=int(audit.pilot_trials), trials=int(audit.trials),
        alpha=float(audit.alpha), seed=int(audit.seed),
    )  # fmt: skip
    report = audit_aggregator(agg, opts, delta)
    report["exceeds_upper"] = report["lower_bound"]["epsilon"] > report["epsilon_upper"]
    return report
