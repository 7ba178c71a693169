"""The committed tables' folders are the tables' own: ``results/tables/<table>/<setting>``
names a table of ``conf/tables/`` and one of its settings (``paper`` or a declared one, with
``+override`` suffixes). A folder of a setting no table declares (the GPU kit's CPU-test
setting ``tiny``, once committed by accident) would sit beside real results unread."""

from __future__ import annotations

from pathlib import Path

from dpsub.experiments import tables

ROOT = Path(__file__).resolve().parents[2]
TABLES = ROOT / "results" / "tables"


def stray_folders(root: Path) -> list[str]:
    """Folders under ``root`` that are not ``<table>/<setting>[+override...]`` of a table."""
    out = []
    names = set(tables.table_names())
    for t in sorted(p for p in root.iterdir() if p.is_dir()):
        if t.name not in names:
            out.append(t.name)
            continue
        table = tables.load_table(t.name)
        declared = {"paper", *table.settings}
        out += [f"{t.name}/{s.name}" for s in sorted(t.iterdir())
                if s.is_dir() and s.name.split("+")[0] not in declared]  # fmt: skip
    return out


def test_every_committed_table_folder_is_a_declared_setting():
    assert stray_folders(TABLES) == []


def test_the_layout_check_finds_a_stray_setting(tmp_path):
    (tmp_path / "gep1-mnist" / "cpu+train.epochs=10" / "paper").mkdir(parents=True)
    (tmp_path / "gep1-mnist" / "tiny" / "paper").mkdir(parents=True)
    (tmp_path / "no-such-table").mkdir()
    assert stray_folders(tmp_path) == ["gep1-mnist/tiny", "no-such-table"]


def test_no_rendered_table_prints_nan():
    """An interval of a cell with one seed is left out, never rendered as ``[+nan, +nan]``
    (the gains rule's difference row did, with K = 4's first seed)."""
    import re

    for readme in sorted((ROOT / "results" / "tables").glob("*/*/README.md")):
        text = readme.read_text()
        assert not re.search(r"\bnan\b", text, re.I), readme
        assert not re.search(r"n/a\W+n/a", text), f"{readme}: a repeated n/a"
