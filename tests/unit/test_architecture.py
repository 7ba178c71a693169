"""The layering contract of ``src/dpsub``: no import runs up a layer.

Three tiers: the library core (privacy, grads, subspace, mechanisms, data, models,
training, features, audit, pate...) <- the Python API (``dpsub.api``) <- the front ends:
the command line (``dpsub.cli``) and the research tooling (``dpsub.experiments``). No core
module imports the API or a front end; the API imports no front end.

Within the core, every package (or top-level module) of dpsub has a rank; a module may import its own
package and packages of a lower rank only, lazily (inside a function) or under
``TYPE_CHECKING`` included. So ``grads`` and ``subspace`` no longer import each other,
evaluation does not import training, and the privacy core imports nothing above it.

Beside the layers: the code reads the validated, typed Settings (never the raw config with
defaults of its own), the accountant is chosen by one registry lookup, Hydra composes a
config in one place, and each enumeration of :mod:`dpsub.choices` has its implementations.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src" / "dpsub"

#: Lower ranks are imported by higher ones, never the reverse.
LAYERS = {
    "choices": 0,  # enumerations a config chooses from (torch-free)
    "declare": 1,  # opt(): an option's default, range and help, and their check (torch-free)
    "errors": 0,
    "paths": 0,
    "privacy": 1,  # noise, sampling, calibration, the account: needs only errors
    "data": 2,
    "models": 2,
    "tracking": 2,  # metrics.jsonl and Weights & Biases (a run's tracking)
    "grads": 3,  # per-example gradients and clipping (Sensitive values)
    "features": 3,  # frozen feature extractors and their cache (uses data)
    "subspace": 4,  # bases, carriers, the low-rank reparametrization
    "mechanisms": 5,
    "config": 6,  # validates the declarations of mechanisms, data and models
    "eval": 6,  # evaluations of a trained model (not of the training loop)
    "training": 7,
    "overrides": 1,  # command-line overrides checked against conf/ (torch-free)
    "audit": 10,  # privacy audits of the real training step and of PATE's aggregators
    "rundir": 0,  # a run folder's file names and loading (no torch)
    "pate": 9,  # PATE: teachers, aggregators, its own ledger and entry point
    "api": 20,  # the Python API (tier 2)
    "cli": 30,  # the command line: dpsub-train, -audit, -pate, sweeps (tier 3)
    # the research tooling (tier 3): paper tables, studies, costs, statistics, the benchmark,
    # the GPU kit, the installed dpsub-reproduce / -table / -summarize / -plot / -mia; it
    # drives the command line's runs (reproduce runs its jobs as dpsub-train's sweeps do)
    "experiments": 31,
}

#: The three tiers, by the rank a package has above: the core, the API, the front ends.
TIERS = {"core": range(0, 20), "api": range(20, 30), "front": range(30, 50)}
#: The front ends' packages (the command line, the research tooling) and nothing else.
FRONT = {"cli", "experiments"}

#: Modules that are one concern with another.
SAME_ROOM: dict[str, str] = {}


def _room(name: str) -> str:
    return SAME_ROOM.get(name, name)


def _package(module: str) -> str | None:
    parts = module.split(".")
    return _room(parts[1]) if parts[0] == "dpsub" and len(parts) > 1 else None


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) of every import of ``path``, relative ones resolved."""
    rel = path.relative_to(SRC.parent).with_suffix("")
    init = path.name == "__init__.py"
    here = list(rel.parts[:-1] if init else rel.parts)  # a package stands for its __init__
    tree = ast.parse(path.read_text(), str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the module's package (a package: itself) up
                base = here[: len(here) - node.level + init]
                mod = ".".join([*base, node.module] if node.module else base)
            else:
                mod = node.module or ""
            out.append((node.lineno, mod))
    return out


def _violations() -> list[str]:
    bad = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC)
        own = _room(rel.parts[0].removesuffix(".py"))
        if own == "__init__":
            continue
        assert own in LAYERS, f"src/dpsub/{own} has no layer in tests/unit/test_architecture.py"
        for line, mod in _imports(path):
            other = _package(mod)
            if other is None or other == own:
                continue
            assert other in LAYERS, f"{rel}:{line} imports dpsub.{other}, which has no layer"
            if LAYERS[other] >= LAYERS[own]:
                bad.append(
                    f"src/dpsub/{rel}:{line} ({own}, layer {LAYERS[own]}) imports {mod} "
                    f"(layer {LAYERS[other]})"
                )
    return bad


def test_no_import_runs_up_a_layer():
    assert _violations() == []


def _tier(package: str) -> str:
    return next(t for t, ranks in TIERS.items() if LAYERS[package] in ranks)


def test_three_tiers_core_api_front_ends():
    """Every package is in one tier; the front ends are exactly the command line and the
    research tooling; nothing but a front end imports ``dpsub.cli``."""
    assert {p for p in LAYERS if _tier(p) == "front"} == FRONT
    assert {p for p in LAYERS if _tier(p) == "api"} == {"api"}
    rooms = {p: _room(p.relative_to(SRC).parts[0].removesuffix(".py")) for p in SRC.rglob("*.py")}
    users = [
        f"{path.relative_to(SRC)}:{line}"
        for path, room in sorted(rooms.items())
        if room == "__init__" or _tier(room) != "front"
        for line, mod in _imports(path)
        if _package(mod) == "cli"
    ]
    assert users == []


def test_the_contract_catches_an_upward_import(tmp_path, monkeypatch):
    """A grads module importing subspace (the old RGP surgery) is reported."""
    fake = tmp_path / "dpsub"
    (fake / "grads").mkdir(parents=True)
    (fake / "grads" / "bad.py").write_text(
        "from dpsub.subspace.lowrank import carrier_projection\n"
    )
    (fake / "eval").mkdir()
    (fake / "eval" / "bad.py").write_text("def f():\n    from ..training import run\n")
    monkeypatch.setattr(sys.modules[__name__], "SRC", fake)
    found = _violations()
    assert len(found) == 2
    assert "grads/bad.py:1" in found[0] or "grads/bad.py:1" in found[1]
    assert any("dpsub.training" in v for v in found)


def test_accounting_policy_is_compared_only_in_privacy():
    """ "planned / measured / nominal" are the privacy account's business."""
    pattern = re.compile(r"accounting\s*[!=]=")
    hits = [
        f"{p.relative_to(SRC)}:{i}"
        for p in sorted(SRC.rglob("*.py"))
        if p.relative_to(SRC).parts[0] != "privacy"
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert hits == []


TESTS = REPO / "tests"


def test_tests_live_in_their_tier_and_only_e2e_is_slow():
    """tests/unit (no training loop), tests/integration (runs, CLIs), tests/e2e (slow: every
    test there is marked slow by conftest.py, and no test elsewhere is)."""
    loose = sorted(p.name for p in TESTS.glob("test_*.py"))
    assert not loose, f"test files outside unit/, integration/, e2e/: {loose}"
    for tier in ("unit", "integration"):
        for path in (TESTS / tier).glob("*.py"):
            marked = "pytest.mark." + "slow"  # (spelled so that this file passes its own check)
            assert marked not in path.read_text(), f"{path}: slow tests go to tests/e2e/"


def _grep(pattern: str, files, skip=()) -> list[str]:
    rx = re.compile(pattern)
    return [
        f"{p.relative_to(REPO)}:{i}"
        for p in sorted(files)
        if p.relative_to(REPO).as_posix() not in skip
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if rx.search(line)
    ]


def _py(*folders: str):
    return [p for f in folders for p in (REPO / f).rglob("*.py")]


def test_the_code_reads_typed_settings_not_the_raw_config_with_defaults():
    """No ``cfg.get(key, default)`` / ``OmegaConf.select`` after validation: a default lives
    in the schema (config.py) or the option's declaration, once."""
    folders = (
        "src/dpsub/training",
        "src/dpsub/mechanisms",
        "src/dpsub/grads",
        "src/dpsub/subspace",
    )
    raw = r"\bcfg\b(\.\w+)*\.get\(|OmegaConf\.select\("
    assert _grep(raw, _py(*folders)) == []
    # a mechanism takes its parsed options (Settings.mechanism), never a config
    assert _grep(r"\bcfg\b|DictConfig", _py("src/dpsub/mechanisms")) == []


def test_every_ranged_schema_field_is_declared_with_opt():
    """Numbers and enumerations of the config schemas carry their range in ``opt()``."""
    import dataclasses

    from dpsub.config import SCHEMAS, ScheduleSchema

    missing = [
        f"{group}.{f.name}"
        for group, cls in [*SCHEMAS.items(), ("optim.schedule", ScheduleSchema)]
        for f in dataclasses.fields(cls)
        if f.type in ("int", "float", "int | None", "float | None", "str") and not f.metadata
    ]
    free = {"data.root", "logger.name", "logger.project"}  # no range to declare
    assert sorted(set(missing) - free) == []


def test_the_accountant_is_chosen_by_one_registry_lookup():
    """No comparison with an accountant's name anywhere; one lookup in the registry."""
    names = r"(==|!=)\s*[\"'](rdp|prv)[\"']|[\"'](rdp|prv)[\"']\s*(==|!=)|accountant\s*[!=]="
    assert _grep(names, _py("src/dpsub")) == []
    assert len(_grep(r"ACCOUNTANT_CLASSES\[", _py("src/dpsub"))) == 1


def test_hydra_composes_a_config_in_one_place():
    """Scripts, tests and the library call ``dpsub.config.compose`` (defined in overrides.py;
    no hand-written Hydra initialization, no stale resolver imports)."""
    files = _py("src", "scripts", "tests")
    me = "tests/unit/test_architecture.py"
    assert (
        _grep(r"initialize_config_dir|from hydra import", files, {"src/dpsub/overrides.py", me})
        == []
    )
    assert _grep(r"import dpsub\.train\s+#.*resolvers", files, {me}) == []


def test_each_enumeration_has_its_implementations():
    from dpsub import choices
    from dpsub.data.datasets import LOADERS
    from dpsub.grads.engine import BACKEND_CLASSES
    from dpsub.privacy.accountants import ACCOUNTANT_CLASSES
    from dpsub.privacy.sampling import build_sampler

    assert tuple(ACCOUNTANT_CLASSES) == choices.ACCOUNTANTS
    assert tuple(BACKEND_CLASSES) == choices.BACKENDS
    from dpsub.data.registry import REGISTRY

    assert set(LOADERS) == set(REGISTRY)
    for kind in choices.SAMPLINGS:
        assert build_sampler(kind, 10, 2, lambda n: None) is not None


def test_run_dir_file_names_come_from_runs():
    """``summary.json``, ``config.yaml``... are named in dpsub/rundir.py (RunDir), not spelled
    out across the code (PATE's and the GPU kit's own writers aside, for now)."""
    names = r"[\"'](summary\.json|metrics\.jsonl|train\.log|checkpoint\.pt|mia\.json|validation\.json)[\"']"
    pending = {"src/dpsub/rundir.py", "src/dpsub/cli/pate.py", "src/dpsub/experiments/gpu/cells.py",
               "src/dpsub/experiments/pdpsgd_study.py"}  # fmt: skip
    assert _grep(names, _py("src/dpsub", "scripts"), pending) == []


def test_test_file_names_are_unique_across_the_tiers():
    """pytest imports test files by their base name (no packages): two alike collide."""
    names = [p.name for p in TESTS.glob("*/test_*.py")]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)


def _module_level_thread_calls(path: Path) -> list[int]:
    """Lines of ``path`` that call ``torch.set_num_threads`` outside any function or class."""
    calls = []
    for node in ast.parse(path.read_text()).body:
        for sub in ast.walk(node) if not isinstance(node, (ast.FunctionDef, ast.ClassDef)) else ():
            f = getattr(sub, "func", None)
            if isinstance(f, ast.Attribute) and f.attr in (
                "set_num_threads",
                "set_num_interop_threads",
            ):
                calls.append(sub.lineno)
    return calls


def test_no_test_module_sets_torch_threads_at_import(tmp_path):
    """conftest.py gives each xdist worker its share of the cores. A test file that set two
    threads at import overrode it for the rest of its worker's files, and two workers then
    ran four threads on two cores: the six files that did so took 58 s side by side
    against 21 s without (docs/architecture.md, "Test-suite time")."""
    found = [
        f"{p.relative_to(REPO)}:{line}"
        for p in sorted(TESTS.rglob("test_*.py"))
        for line in _module_level_thread_calls(p)
    ]
    assert not found, f"set threads inside a test or fixture, never at import: {found}"
    bad = tmp_path / "test_bad.py"  # the check itself can fail
    bad.write_text("import torch\n\ntorch.set_num_threads(2)\n")
    assert _module_level_thread_calls(bad) == [3]
