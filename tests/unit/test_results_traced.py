"""Every number in a README results table traces to a run folder or a generated file.

A *results table* is a Markdown table with a decimal number (``96.24``, ``0.8313``) in
README.md's "Results" and "Reproducing" sections or anywhere in ``results/**/README.md``.
Its *sources* are the existing files and folders that the text of its section (from the
previous heading to the table) names, as a path in backticks or a link, relative to the
README or to the repository root. The table passes when it has a source and every decimal
number in it is found in the sources (recursively: run folders' summary.json,
metrics.jsonl, config.yaml, generated .md / .json / .csv), literally or as a stored value
rounded to the digits shown (also x100, for accuracies in percent), or among the papers'
values (``conf/paper/``, the study scripts' constants).

A table that a script generates is checked by generating it again instead: a table of
``results/tables/<table>/<setting>/README.md`` must equal what ``scripts/make_table.py``
renders from the runs beside it, and one of ``results/<study>/README.md`` (speed, rgp,
dphero) what ``make_table.py --study <study>`` prints from ``results/<study>/runs``.
A rendered table's README.md as a whole (header, hardware, run counts) must also be what
``make_table.py --dry-run`` would write from its runs and recorded provenance now.

A table with no files behind it is allowed only under an explicit marker on the line
before it: ``<!-- historical: <why> -->`` (made by code or runs that are gone) or
``<!-- cited: <source> -->`` (a paper's values, no run of ours); the marker must say why.

README.md is edited by its owner only: its tables that fail are listed in ``PENDING``
(expected failures, named) until they are traced or marked there.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HISTORICAL = re.compile(r"<!--\s*(historical|cited):\s*\S.*-->")
NUMBER = re.compile(r"(?<![\w.])[-+]?\d+\.\d+(?![\w.])")
PATHLIKE = re.compile(r"`+([^`]+)`+|\]\(([^)\s#]+)")  # code spans (words inside) and links
TEXT = {".md", ".json", ".jsonl", ".csv", ".yaml", ".txt", ".log", ".py"}
#: The papers' values, which tables print beside the measured ones.
REFERENCES = ("conf/paper", "src/dpsub/experiments/studies.py", "scripts/pdpsgd_study.py")
#: README.md sections whose tables are results (the others are options and commands).
README_RESULTS = ("Results", "Reproducing")
#: README.md tables known to fail (no file behind some numbers), by their header row.
PENDING: dict[str, str] = {}  # (the reproduction-cost table moved to docs/tables.md, marked)


def pending(readme: Path, table: list[str]) -> str | None:
    if readme == ROOT / "README.md":
        return next((why for head, why in PENDING.items() if table[0].startswith(head)), None)
    return None


def readmes() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "results").rglob("README.md"))]


def tables(readme: Path):
    """(first line number, table lines, section text before it, historical?) per table."""
    lines = readme.read_text().splitlines()
    section, top, i, fence = [], "", 0, False
    while i < len(lines):
        line = lines[i]
        fence ^= line.startswith("```")
        if line.startswith("#") and not fence:
            section = []
            if line.startswith("## "):
                top = line
        if line.startswith("|"):
            start = i
            while i < len(lines) and lines[i].startswith("|"):
                i += 1
            marked = start > 0 and bool(HISTORICAL.search(lines[start - 1]))
            if readme != ROOT / "README.md" or any(s in top for s in README_RESULTS):
                yield start + 1, lines[start:i], "\n".join(section), marked
            section.append("\n".join(lines[start:i]))
            continue
        section.append(line)
        i += 1


def sources(readme: Path, text: str) -> list[Path]:
    found = []
    words = [w for a, b in PATHLIKE.findall(text) for w in (a or b).split()]
    for word in words:
        raw = word.split("::")[0].rstrip(".,;:")
        raw = re.sub(r"\{[^}]*\}.*", "", raw)  # a brace pattern: its parent folder
        for base in (readme.parent, ROOT):
            p = (base / raw).resolve()
            inside = any(b in [p, *p.parents] for b in (ROOT, readme.parent))
            if raw and p.exists() and p != ROOT and inside and p not in found:
                found.append(p)
                break
    return found


@cache
def numbers_in(path: Path) -> frozenset[str]:
    """Every decimal rendering a table could take of the numbers stored under ``path``."""
    files = [path] if path.is_file() else [f for f in path.rglob("*") if f.is_file()]
    token = re.compile(r"[-+]?\d+\.\d+(?:[eE][-+]?\d+)?|\d+(?:[eE][-+]?\d+)?")
    tokens: set[str] = set()  # each distinct token once (runs repeat most of theirs)
    for f in files:
        if f.suffix in TEXT and f.stat().st_size <= 5_000_000:
            tokens.update(token.findall(f.read_text(errors="ignore")))
    out = {tok.lstrip("+") for tok in tokens}
    for v in {float(tok) for tok in tokens}:
        for d in range(0, 5):
            out.add(f"{v:.{d}f}")
            out.add(f"{100 * v:.{d}f}")
    return frozenset(out)


@cache
def generated(readme: Path) -> frozenset[str]:
    """The table lines a script generates for ``readme`` now (empty if none does)."""
    from types import SimpleNamespace

    from dpsub.experiments import studies, tables

    rel = readme.relative_to(ROOT).parts
    if rel[0] == "results" and len(rel) == 5 and rel[2] in tables.table_names():
        from dpsub.experiments import make_table

        setting, *extra = rel[3].split("+")
        table = tables.load_table(rel[2])
        args = SimpleNamespace(setting=setting, extra=extra, runs=ROOT / rel[0] / rel[1])
        found = make_table.collect(table, args)
        found["simulated"] = make_table.simulation_marks(table, found, setting)
        lines = (
            make_table.markdown_table(table, found, setting)
            + make_table.tuning_lines(table, found, setting)
            + make_table.run_sections(table, args, found)  # rules, checks, EMA, curves
        )
        return frozenset(lines)
    if rel[0] == "results" and len(rel) == 3 and rel[1] in studies.STUDIES:
        return frozenset(studies.render(rel[1]).splitlines())
    return frozenset()


def missing_numbers(table: list[str], srcs: list[Path]) -> list[str]:
    known = set().union(*(numbers_in(p) for p in srcs), *(numbers_in(ROOT / r) for r in REFERENCES))
    cells = "\n".join(table)
    return [
        n
        for n in NUMBER.findall(cells)
        if n.lstrip("+") not in known and n.lstrip("+-") not in known
    ]


CASES = [
    pytest.param(
        readme,
        line,
        table,
        text,
        marked,
        id=f"{readme.relative_to(ROOT)}:{line}",
        marks=[pytest.mark.xfail(reason=why, strict=True)]
        if (why := pending(readme, table))
        else [],
    )  # fmt: skip
    for readme in readmes()
    for line, table, text, marked in tables(readme)
    if NUMBER.search("\n".join(table))
]


@pytest.mark.parametrize("readme, line, table, text, marked", CASES)
def test_every_number_in_a_results_table_has_files_behind_it(readme, line, table, text, marked):
    if marked:
        pytest.skip("marked historical: no files behind it")
    if set(table) <= generated(readme):
        return  # the script that generates it prints exactly this table from the run files
    srcs = sources(readme, text)
    where = f"{readme.relative_to(ROOT)}:{line}"
    assert srcs, f"{where}: the table's section names no existing run folder or generated file"
    missing = missing_numbers(table, srcs)
    assert not missing, (
        f"{where}: numbers not found in {[str(s.relative_to(ROOT)) for s in srcs]}: {missing[:10]}"
    )


def test_the_checker_catches_a_number_with_no_file(tmp_path):
    run = tmp_path / "runs" / "a"
    run.mkdir(parents=True)
    (run / "summary.json").write_text('{"test_accuracy": 0.9624}')
    readme = tmp_path / "README.md"
    readme.write_text(
        "## R\n\nFrom `runs/`:\n\n| a | b |\n|---|---|\n| x | 96.24 |\n| y | 95.59 |\n"
    )
    [(line, table, text, marked)] = list(tables(readme))
    srcs = sources(readme, text)
    assert srcs == [(tmp_path / "runs").resolve()]
    assert missing_numbers(table, srcs) == ["95.59"]
    readme.write_text(
        "## R\n\nno files named\n\n<!-- historical: gone -->\n| a |\n|---|\n| 1.5 |\n"
    )
    [(_, _, text, marked)] = list(tables(readme))
    assert marked and sources(readme, text) == []


RENDERED = sorted(p.parent for p in (ROOT / "results" / "tables").glob("*/*/README.md"))


@pytest.mark.parametrize("folder", RENDERED, ids=[f"{p.parent.name}/{p.name}" for p in RENDERED])
def test_a_rendered_table_is_current_with_its_runs(folder, capsys):
    """The whole README (header, hardware, run counts and hours, notes, figures), not only its
    tables: ``make_table.py --dry-run`` must find it unchanged, or it was not re-rendered after
    its runs changed (a stale "runs:" line once passed the number checks above)."""
    from dpsub.experiments import make_table

    setting, *extra = folder.name.split("+")
    root = str(folder.parents[1])
    make_table.main([folder.parent.name, "--setting", setting, *extra, "--dry-run",
                     "--runs", root, "--out", root])  # fmt: skip
    said = capsys.readouterr().out
    assert "README.md: unchanged" in said, (
        f"{folder.relative_to(ROOT)}/README.md is not what its runs render now: "
        f"python scripts/make_table.py {folder.parent.name} --setting {setting} "
        f"{' '.join(extra)} ({said.strip().splitlines()[1:2]})"
    )
