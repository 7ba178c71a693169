"""Every documented ``dpsub-audit`` / ``dpsub-pate`` line passes the command line's checks,
also with one more override (issue 36: ``dpsub-audit audit=onerun seed=1`` was refused with
Hydra's "No match in the defaults list", the override check composing ``config`` instead of
``dpsub_audit``; ``audit.kind=onerun`` crashed with a traceback).

Each line is checked as the command checks it before anything runs (the override check,
Hydra's composition of its config, the audit's / PATE's option checks), in-process: no
audit or PATE run is started.
"""

from __future__ import annotations

import re
import shlex

import pytest
from omegaconf import OmegaConf

from dpsub.overrides import compose

from conftest import REPO

#: command (or ``-m`` module) -> its top-level config
CONFIGS = {"dpsub-audit": "dpsub_audit", "dpsub-pate": "dpsub_pate",
           "dpsub.cli.audit": "dpsub_audit", "dpsub.cli.pate": "dpsub_pate"}  # fmt: skip
COMMAND = re.compile(r"(?:^|[\s`])(?:-m\s+)?(dpsub-audit|dpsub-pate|dpsub\.cli\.(?:audit|pate))\b")
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")),
         REPO / "conf" / "dpsub_audit.yaml", REPO / "conf" / "dpsub_pate.yaml"]  # fmt: skip
EXTRA = "seed=1"


def documented() -> list[tuple[str, str, tuple[str, ...]]]:
    """(page, command, overrides) of every line that runs dpsub-audit / dpsub-pate with
    overrides (code blocks, inline code, config comments); ``resume=`` lines aside."""
    found = []
    for page in PAGES:
        text = page.read_text().replace("\\\n", " ")
        for line in text.splitlines():
            for m in COMMAND.finditer(line):
                rest = re.split(r"\s#|`", line[m.end() :])[0]
                words = tuple(w for w in shlex.split(rest) if "=" in w)
                if words and not any(w.startswith("resume=") for w in words):
                    found.append((page.name, m.group(1), words))
    return found


LINES = documented()


def test_the_documented_lines_are_found():
    names = {" ".join(words) for _, _, words in LINES}
    assert "dataset=mnist dataset.train_size=10000 audit=onerun train.epochs=10" in names
    assert "pate=confident dataset=mnist privacy.epsilon=2" in names
    assert len(LINES) >= 8


def check(command: str, overrides: list[str], monkeypatch) -> None:
    """What the command checks before it runs anything: its ``cli()`` up to Hydra's main
    (which is replaced), then Hydra's composition and the audit's / PATE's option checks."""
    import importlib
    import sys

    config_name = CONFIGS[command]
    module = importlib.import_module(f"dpsub.cli.{config_name.split('_')[1]}")
    monkeypatch.setattr(module, "main", lambda: None)
    monkeypatch.setattr(sys, "argv", [command, *overrides])
    module.cli()  # a refusal: one line on stderr and SystemExit(2)
    cfg = compose(overrides, config_name=config_name)
    split = (
        module.split
        if config_name == "dpsub_audit"
        else importlib.import_module("dpsub.pate.run").split
    )
    split(OmegaConf.merge(cfg, {"data": {"root": "unused"}}))


@pytest.mark.parametrize("page, command, words", LINES, ids=[" ".join(w) for *_, w in LINES])
def test_a_documented_line_passes_with_one_more_override(page, command, words, monkeypatch):
    check(command, [*words, EXTRA], monkeypatch)


@pytest.mark.parametrize(
    "command, overrides, needles",
    [
        ("dpsub-audit", ["audit.kind=onerun"], ["audit.kind", "audit=OPTION", "onerun"]),
        ("dpsub-audit", ["audit=onerun", "audit.guesse=3"], ["audit.guesse", "audit.guesses"]),
        ("dpsub-audit", ["audit.guesses=3"], ["audit.guesses", "audit=onerun"]),
        ("dpsub-audit", ["pate=gnmax"], ["pate", "dpsub-pate"]),
        ("dpsub-pate", ["pate.teacher.foo=1"], ["pate.teacher.foo", "epochs"]),
        ("dpsub-pate", ["pate=gnmx"], ["pate=gnmx", "gnmax"]),
        ("dpsub-pate", ["audit=onerun", "seed=1"], ["audit", "dpsub-audit"]),
    ],
)
def test_a_bad_audit_or_pate_override_is_one_line(command, overrides, needles, monkeypatch, capsys):
    with pytest.raises(SystemExit) as e:
        check(command, overrides, monkeypatch)
    assert e.value.code == 2
    line = capsys.readouterr().err.strip()
    assert len(line.splitlines()) == 1 and line.startswith("dpsub: invalid config: "), line
    for needle in needles:
        assert needle in line, (needle, line)
