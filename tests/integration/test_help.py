"""`dpsub-train --help` (conf/hydra/help/dpsub.yaml): it renders, lists every config
group, and every key it documents exists in the composed config."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from dpsub.config import compose
from dpsub.overrides import option_keys

from conftest import run_in_process

REPO = Path(__file__).resolve().parents[2]
CONF = REPO / "conf"


@pytest.fixture(scope="module")
def help_text() -> str:
    """``python -m dpsub.cli.train hydra/help=dpsub --help``'s output (its cli() in this process)."""
    env = {**os.environ, "DPSUB_DATA": "/nonexistent"}
    proc = run_in_process("dpsub.cli.train", ["hydra/help=dpsub", "--help"], env)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _section(text: str, title: str) -> str:
    """The lines after the heading ``== title ... ==``, up to the next heading."""
    return "\n" + text.split(f"== {title}")[1].split("\n", 1)[1].split("\n== ")[0]


def test_help_renders_every_group_and_the_examples(help_text: str) -> None:
    assert help_text.startswith("dpsub-train: ") and "${" not in help_text
    groups = _section(help_text, "Config groups")
    # conf/paper holds paper tables (dpsub-reproduce), not a group: paper=... is refused;
    # audit/ and pate/ are dpsub-audit's and dpsub-pate's groups, which dpsub-train refuses
    others = ("hydra", "paper", "audit", "pate")
    for group in (p for p in CONF.iterdir() if p.is_dir() and p.name not in others):
        options = ", ".join(sorted(f.stem for f in group.glob("*.yaml")))
        assert f"\n{group.name}: {options}\n" in groups, group.name
    assert "\npaper:" not in groups and "dpsub-reproduce TABLE" in help_text
    assert "\naudit:" not in groups and "\npate:" not in groups
    examples = [line for line in _section(help_text, "Examples").splitlines() if line.strip()]
    assert len(examples) == 4 and all(e.startswith("dpsub-train ") for e in examples)
    assert "--multirun,-m" in _section(help_text, "Flags")  # Hydra's $FLAGS_HELP


def test_documented_keys_exist(help_text: str) -> None:
    keys = _section(help_text, "Main keys")
    cfg = compose()
    documented = [line.split()[0] for line in keys.splitlines() if line[:1].strip()]
    assert {
        "privacy.epsilon", "train.batch_size", "train.max_steps", "mechanism.*", "aux.*", "resume"
    } <= set(documented)  # fmt: skip
    for key in documented:
        assert OmegaConf.select(cfg, key.removesuffix(".*"), default="missing") != "missing", key
    # the options named for mechanism.* and aux.* are keys of some option of their group
    for group, option in re.findall(r"\b(mechanism|aux)\.([a-z_]+)\b", keys):
        names = (f.stem for f in (CONF / group).glob("*.yaml"))
        assert any(option in option_keys(group, n) for n in names), f"{group}.{option}"
