"""``pate.*`` options (conf/pate/): checked torch-free, one line naming the key."""

from __future__ import annotations

from dpsub.errors import ConfigError
from dpsub.pate.aggregators import AGGREGATORS
from dpsub.pate.votes import PARTITIONS

KEYS = {
    "aggregator", "teachers", "sigma1", "sigma2", "threshold", "laplace_scale", "public_size",
    "max_queries", "checkpoint_every", "teacher", "student", "data_dependent", "votes_cache",
    "holdout", "teacher_seed", "partition", "release", "smooth_sensitivity",
}  # fmt: skip
TEACHER_KEYS = {"epochs", "batch_size", "lr", "momentum", "chunk"}
STUDENT_KEYS = {"epochs", "batch_size", "lr", "momentum", "semi_supervised", "unlabeled_ratio",
                "confidence", "unlabeled_weight"}  # fmt: skip
SS_KEYS = {"order", "beta", "sigma"}
#: ``pate.<group>.<key>``: the nested groups and their keys
GROUPS = {"teacher": TEACHER_KEYS, "student": STUDENT_KEYS, "smooth_sensitivity": SS_KEYS}
RELEASES = ("smooth_sensitivity",)
NEEDS = {"lnmax": ("laplace_scale",), "gnmax": ("sigma2",), "confident": ("sigma1", "sigma2")}


def _positive(value, key: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ConfigError(f"{key}: must be > 0, got {value!r}")


def check_options(p) -> None:
    """Raise ConfigError on an unknown key or a bad value of ``pate``."""
    for key in p:
        if key not in KEYS:
            raise ConfigError(f"pate.{key}: unknown key; valid keys: {', '.join(sorted(KEYS))}")
    if p.aggregator not in AGGREGATORS:
        raise ConfigError(f"pate.aggregator: must be one of {AGGREGATORS}, got {p.aggregator!r}")
    for key in NEEDS[p.aggregator]:
        _positive(p.get(key), f"pate.{key}")
    if p.aggregator == "confident" and not isinstance(p.get("threshold"), int | float):
        raise ConfigError(f"pate.threshold: must be a number, got {p.get('threshold')!r}")
    for key in ("teachers", "public_size", "checkpoint_every"):
        if not isinstance(p[key], int) or p[key] <= 0:
            raise ConfigError(f"pate.{key}: must be a positive integer, got {p[key]!r}")
    if p.max_queries is not None and (not isinstance(p.max_queries, int) or p.max_queries <= 0):
        raise ConfigError(
            f"pate.max_queries: must be null or a positive integer, got {p.max_queries!r}"
        )
    hold = p.get("holdout")
    if hold is not None and (isinstance(hold, bool) or not isinstance(hold, int) or hold <= 0):
        raise ConfigError(f"pate.holdout: must be null or a positive integer, got {hold!r}")
    ts = p.get("teacher_seed")
    if ts is not None and (isinstance(ts, bool) or not isinstance(ts, int)):
        raise ConfigError(f"pate.teacher_seed: must be null or an integer, got {ts!r}")
    cache = p.get("votes_cache")
    if cache is not None and not (isinstance(cache, str) and cache):
        raise ConfigError(f"pate.votes_cache: must be null or a directory, got {cache!r}")
    if not isinstance(p.get("data_dependent", False), bool):
        raise ConfigError(f"pate.data_dependent: must be true or false, got {p.data_dependent!r}")
    if p.get("partition") not in (None, *PARTITIONS):
        raise ConfigError(f"pate.partition: must be one of {PARTITIONS}, got {p.partition!r}")
    _check_groups(p)
    _check_release(p)


def _check_groups(p) -> None:
    for group, keys in GROUPS.items():
        for key in p.get(group) or {}:
            if key not in keys:
                raise ConfigError(
                    f"pate.{group}.{key}: unknown key; valid keys: {', '.join(sorted(keys))}"
                )
            _check_value(p[group][key], f"pate.{group}.{key}")


def _check_value(value, key: str) -> None:
    """A nested option's value: momentum any number, flags true or false, a probability in
    (0, 1], a count a positive integer, the rest > 0."""
    name = key.rsplit(".", 1)[1]
    if name == "momentum":
        return
    if name == "semi_supervised":
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: must be true or false, got {value!r}")
        return
    if name == "unlabeled_ratio" and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigError(f"{key}: must be a positive integer, got {value!r}")
    _positive(value, key)
    if name == "confidence" and value > 1:
        raise ConfigError(f"{key}: must be in (0, 1], got {value!r}")


def _check_release(p) -> None:
    """``pate.release``: null, or smooth_sensitivity with a usable order, beta and sigma."""
    from dpsub.pate.accounting import ORDERS
    from dpsub.pate.smooth import max_order

    release = p.get("release")
    if release is None:
        return
    if release not in RELEASES:
        raise ConfigError(f"pate.release: must be null or one of {RELEASES}, got {release!r}")
    if p.aggregator == "lnmax":
        raise ConfigError("pate.release: the data-dependent bound (and its release) is GNMax's")
    ss = p.get("smooth_sensitivity") or {}
    for key in sorted(SS_KEYS):
        _positive(ss.get(key), f"pate.smooth_sensitivity.{key}")
    order, beta = float(ss["order"]), float(ss["beta"])
    if not any(abs(order - o) < 1e-9 for o in ORDERS) or order <= 1:
        raise ConfigError(
            f"pate.smooth_sensitivity.order: must be one of the ledger's orders > 1 "
            f"(1.1 to 10.9 by 0.1, 12 to 63, 80, 100, 128, 200, 256, 512), got {order}"
        )
    if not order < max_order(beta):
        raise ConfigError(
            f"pate.smooth_sensitivity.beta: the release needs order < 1 / (1 - e^(-2 beta)) "
            f"(about 1 / (2 beta)), got order {order} and beta {beta}"
        )
