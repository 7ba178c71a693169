"""The layering contract of ``src/dpsub``: no import runs up a layer.

Every package (or top-level module) of dpsub has a rank; a module may import its own
package and packages of a lower rank only, lazily (inside a function) or under
``TYPE_CHECKING`` included. So ``grads`` and ``subspace`` no longer import each other,
evaluation does not import training, and the privacy core imports nothing above it.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "dpsub"

#: Lower ranks are imported by higher ones, never the reverse.
LAYERS = {
    "choices": 0,  # enumerations a config chooses from (torch-free)
    "errors": 0,
    "paths": 0,
    "privacy": 1,  # noise, sampling, calibration, the account: needs only errors
    "data": 2,
    "models": 2,
    "logging": 2,
    "grads": 3,  # per-example gradients and clipping (Sensitive values)
    "subspace": 4,  # bases, carriers, the low-rank reparametrization
    "mechanisms": 5,
    "config": 6,  # validates the declarations of mechanisms, data and models
    "eval": 6,  # evaluations of a trained model (not of the training loop)
    "training": 7,
    "tables": 7,  # study tables (dpsub-reproduce, sweeps)
    "train": 8,  # the command line
    "overrides": 1,  # command-line overrides checked against conf/ (torch-free)
    "commands": 8,  # console commands that run the scripts
    "audit": 10,  # privacy audits of the real training step and of PATE's aggregators
    "runs": 0,  # a run folder's file names and loading (no torch)
    "stats": 0,  # intervals and tests over seeds (no torch)
    "studies": 7,  # the studies' tables rendered from run folders
    "gpu": 9,  # the GPU kit (staging, smoke, bench, table cells): drives the CLI
    "pate": 9,  # PATE: teachers, aggregators, its own ledger and entry point
}


#: Modules that are one concern with another (the command line and its sweeps call each other).
SAME_ROOM = {"sweeps": "train"}


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


TESTS = Path(__file__).resolve().parents[1]


def test_tests_live_in_their_tier_and_only_e2e_is_slow():
    """tests/unit (no training loop), tests/integration (runs, CLIs), tests/e2e (slow: every
    test there is marked slow by conftest.py, and no test elsewhere is)."""
    loose = sorted(p.name for p in TESTS.glob("test_*.py"))
    assert not loose, f"test files outside unit/, integration/, e2e/: {loose}"
    for tier in ("unit", "integration"):
        for path in (TESTS / tier).glob("*.py"):
            marked = "pytest.mark." + "slow"  # (spelled so that this file passes its own check)
            assert marked not in path.read_text(), f"{path}: slow tests go to tests/e2e/"
