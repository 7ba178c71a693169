"""Every option's default is written once: in its Python declaration.

``conf/mechanism``, ``conf/dataset`` and ``conf/aux`` take their options' defaults from the
declarations (``declared/<group>/<option>``, registered by :mod:`dpsub.config`) and write
only ``name``, comments, their defaults list and the values that differ (presets such as
``mechanism=gep_authors``). A default written into a YAML file again fails here.
"""

from __future__ import annotations

import dataclasses

import pytest
from omegaconf import OmegaConf

from dpsub.config import DatasetSchema, compose, config_context, declared_defaults
from dpsub.data.aux_options import AUX_SOURCES
from dpsub.data.registry import REGISTRY
from dpsub.errors import ConfigError
from dpsub.mechanisms.options import SPECS
from dpsub.overrides import DECLARED, check_overrides, option_keys
from dpsub.paths import conf_dir

GROUPS = ("mechanism", "dataset", "aux")
#: each group's options without a declaration of their own (nothing to take)
UNDECLARED = {"aux": {"none"}}


def _same(value, default) -> bool:
    return value == default and isinstance(value, bool) == isinstance(default, bool)


def _base(group: str, node) -> str | None:
    """The declared option a YAML file builds on: its ``/declared/...`` entry, or that of the
    option of its group it extends (``mechanism=gep_authors``: ``gep``)."""
    for entry in node.get("defaults") or []:
        if not isinstance(entry, str):
            continue
        path, _, package = entry.partition("@")
        if path.startswith(f"/declared/{group}/") and package == "_here_":
            return path.rpartition("/")[2]
        if "/" not in path and not package and entry != "_self_":
            return _base(group, OmegaConf.load(conf_dir() / group / f"{path}.yaml"))
    return None


def written_twice(group: str, folder=None) -> list[str]:
    """``written twice: conf/<group>/<file> <key>`` for each key of a YAML file of ``group``
    whose value is its declared default; ``... declares nothing`` for a file that does not
    take its declared defaults."""
    folder = folder or conf_dir() / group
    out = []
    for path in sorted(folder.glob("*.yaml")):
        node = OmegaConf.load(path)
        if path.stem in UNDECLARED.get(group, ()):
            continue
        base = _base(group, node)
        where = f"conf/{group}/{path.name}"
        if base is None:
            out.append(f"{where} does not take its declared defaults (/declared/{group}/...)")
            continue
        raw = OmegaConf.to_container(node, resolve=False)
        for key, value in raw.items():
            if key not in ("name", "defaults") and _same(value, DECLARED[group][base].get(key)):
                out.append(f"written twice: {where} {key}")
    return out


@pytest.mark.parametrize("group", GROUPS)
def test_no_default_is_written_twice(group):
    assert written_twice(group) == []


def test_a_default_put_back_into_a_yaml_is_reported(tmp_path):
    folder = tmp_path / "mechanism"
    folder.mkdir()
    gep = (conf_dir() / "mechanism" / "gep.yaml").read_text()
    (folder / "gep.yaml").write_text(gep + "num_bases: 1000\nclip_residual: 3.0\n")
    (folder / "bare.yaml").write_text("name: dpsgd\nclip: 1.0\n")
    assert written_twice("mechanism", folder) == [
        "conf/mechanism/bare.yaml does not take its declared defaults (/declared/mechanism/...)",
        "written twice: conf/mechanism/gep.yaml num_bases",
    ]


def test_the_declared_nodes_are_the_declarations():
    nodes = declared_defaults()
    assert nodes == DECLARED  # what dpsub.config registered at import
    fields = {f.name for f in dataclasses.fields(DatasetSchema)}
    for name, spec in REGISTRY.items():
        assert set(spec.options) <= fields - {"name", "validation_size"}, name
        assert list(nodes["dataset"][name])[0] == "name"
    for name, spec in SPECS.items():
        assert set(nodes["mechanism"][name]) == {"name", *spec.option_names}
    for name, source in AUX_SOURCES.items():
        assert nodes["aux"][name] == {"name": name, **source.defaults}


@pytest.mark.parametrize("group", GROUPS)
def test_every_declared_option_is_in_its_group(group):
    """Each file gives its group every declared key (so ``mechanism.num_bases=500`` needs no
    ``+``), and nothing else."""
    for path in sorted((conf_dir() / group).glob("*.yaml")):
        if path.stem in UNDECLARED.get(group, ()):
            continue
        name = OmegaConf.load(path).get("name") or _base(group, OmegaConf.load(path))
        assert option_keys(group, path.stem) == set(DECLARED[group][name]), path.name


def test_composed_presets_hold_every_option_with_its_value():
    with config_context():
        cfg = compose(["mechanism=gep_authors", "dataset=npz", "aux=public_train"])
        rgp = compose(["mechanism=rgp_authors", "mechanism.rank=4"])
    assert dict(cfg.mechanism) == {**DECLARED["mechanism"]["gep"], "grouping": "chunks"}
    assert dict(cfg.dataset) == DECLARED["dataset"]["npz"]
    assert dict(cfg.aux) == {**DECLARED["aux"]["public_train"]}
    assert cfg.aux.labels == "true" and cfg.aux.num_samples == 100
    assert rgp.mechanism.rank == 4 and rgp.mechanism.head_scale == 0.01
    check_overrides(["mechanism=gep", "mechanism.num_bases=500", "dataset=mnist",
                     "dataset.train_size=100", "aux=natural", "aux.seed=1"])  # fmt: skip


def test_a_key_of_other_options_names_them_all():
    """The owners of a key are found through the declared defaults, presets included."""
    with pytest.raises(ConfigError) as e:
        check_overrides(["mechanism.num_bases=5"])
    assert "mechanism=bgep, gep, gep_authors, gep_tracked, pdpsgd, rpdpsgd" in str(e.value)


def test_composing_without_the_declarations_says_so(monkeypatch):
    import dpsub.overrides

    monkeypatch.setattr(dpsub.overrides, "DECLARED", {})
    with pytest.raises(RuntimeError, match="import dpsub.config"):
        compose([])
