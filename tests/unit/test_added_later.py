"""A key added to dpsub later must not make the runs made before it count as changed.

The table harness sets a finished run aside and runs it again when its config differs from the
job's (``stale``), and a resume refuses any changed key. A config saved before a key existed
lacks it; that is the same setting as the key's "off" value (null, false, "none") or, for a key
whose default is something else, the value listed in ``checkpoint.ADDED_LATER``. Adding
``dataset.validation_pick`` (default ``balanced``) without that entry once made every committed
run stale: the harness moved the finished tuning grid aside and started it again."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from dpsub.config import SCHEMAS, declared_defaults
from dpsub.declare import check_value
from dpsub.training.checkpoint import ADDED_LATER, changed_flat_keys, changed_keys, flatten_config

ROOT = Path(__file__).resolve().parents[2]
_LOAD = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def test_a_config_without_the_key_equals_its_old_behaviour_only():
    old = {"dataset": {"name": "cifar10"}, "privacy": {"epsilon": 2.0}}
    with_key = {**old, "dataset": {"name": "cifar10", "validation_pick": "balanced"}}
    assert changed_keys(old, with_key) == [] and changed_keys(with_key, old) == []
    uniform = {**old, "dataset": {"name": "cifar10", "validation_pick": "uniform"}}
    assert changed_keys(old, uniform) == ["dataset.validation_pick"]
    # GEP's residual was formed before the option existed: book-keeping is a change
    gep = {"mechanism": {"name": "gep"}}
    assert changed_keys(gep, {"mechanism": {"name": "gep", "residual": "materialize"}}) == []
    assert changed_keys(gep, {"mechanism": {"name": "gep", "residual": "bookkeeping"}}) == [
        "mechanism.residual"
    ]


def _declarations() -> dict[str, dataclasses.Field]:
    from dpsub.mechanisms.options import SPECS

    out = {}
    for group, cls in SCHEMAS.items():
        out.update({f"{group}.{f.name}": f for f in dataclasses.fields(cls)})
    for spec in SPECS.values():
        out.update({f"mechanism.{f.name}": f for f in dataclasses.fields(spec.options)})
    return out


#: where the old behaviour is not today's default (GEP formed its residual before book-keeping;
#: public_train picked class-balanced, with every private label, before the hash)
NOT_THE_DEFAULT = {"mechanism.residual", "aux.pick"}


def _aux_defaults() -> dict:
    from dpsub.data.aux_options import AUX_SOURCES

    return {f"aux.{k}": v for src in AUX_SOURCES.values() for k, v in src.defaults.items()}


def test_every_old_behaviour_is_its_keys_default_or_a_named_exception():
    fields, aux = _declarations(), _aux_defaults()
    for key, value in ADDED_LATER.items():
        if key in aux:  # an aux source's option (declared in dpsub.data.aux_options)
            assert (value == aux[key]) != (key in NOT_THE_DEFAULT), key
            continue
        assert key in fields, f"{key}: not a declared option"
        check_value(key, value, fields[key])
        assert (value == fields[key].default) != (key in NOT_THE_DEFAULT), key


def _expected(cfg: dict, schema_defaults: dict, groups: dict) -> dict:
    """The declared defaults a run of ``cfg``'s options would hold today (flat keys); of the
    optimizer's, those its option file sets (adam has no momentum)."""
    optim = ROOT / "conf" / "optim" / f"{(cfg.get('optim') or {}).get('name', 'sgd')}.yaml"
    own = flatten_config({"optim": yaml.load(optim.read_text(), Loader=_LOAD)})
    out = {k: v for k, v in schema_defaults.items() if not k.startswith("optim.") or k in own}
    for group in ("mechanism", "dataset", "aux"):
        name = (cfg.get(group) or {}).get("name")
        out.update({f"{group}.{k}": v for k, v in groups[group].get(name, {}).items()})
    return out


def _committed_configs() -> list[Path]:
    return sorted((ROOT / "results").glob("**/config.yaml"))


@pytest.mark.skipif(not _committed_configs(), reason="no committed runs")
def test_no_committed_run_lacks_a_key_whose_default_would_change_it():
    """Every committed run's config, against today's declared defaults for its options: a key
    it lacks must be "off" by default or listed in ADDED_LATER with the value it ran with."""
    schema_defaults = {
        f"{g}.{f.name}": f.default
        for g, cls in SCHEMAS.items()
        if g != "dataset"  # per dataset: declared_defaults()["dataset"]
        for f in dataclasses.fields(cls)
        if f.default is not dataclasses.MISSING
    }
    groups = declared_defaults()
    missing: dict[str, str] = {}
    for path in _committed_configs():
        cfg = yaml.load(path.read_text(), Loader=_LOAD)
        if not isinstance(cfg, dict) or "mechanism" not in cfg or "privacy" not in cfg:
            continue  # not a training run's config
        flat = flatten_config(cfg)
        for key, default in _expected(cfg, schema_defaults, groups).items():
            if key in flat or key in ADDED_LATER or key in missing:
                continue
            if changed_flat_keys({key: default}, {}):
                missing[key] = str(path.relative_to(ROOT))
    assert not missing, (
        "keys that committed runs lack and whose default is not off; add each to "
        f"checkpoint.ADDED_LATER with the value those runs ran with: {missing}"
    )


def test_where_features_are_cached_is_not_a_change():
    """The feature cache is keyed by its inputs: a run made with DPSUB_CACHE set elsewhere is
    the same run (the harness once found 600 committed feature runs stale by it)."""
    a, b = {"features": {"cache_dir": "/a/cache"}}, {"features": {"cache_dir": "outputs/cache"}}
    assert changed_keys(a, b) == []
    assert changed_keys(a, {"features": {"cache_dir": "x", "norm": "public"}}) == ["features.norm"]
