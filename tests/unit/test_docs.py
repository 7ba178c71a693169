"""The documentation holds together: links resolve, nothing points outside the repository.

README.md, docs/*.md and the results pages are read as a user reads them: every relative
link (and its #anchor) must lead somewhere in the repository, no page may depend on a file
outside it (a development machine's folders, a methods note that is not committed), and
every `experiment=NAME` they show must exist in conf/experiment/.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from conftest import REPO

PAGES = sorted(
    [REPO / "README.md", *(REPO / "docs").glob("*.md"), *(REPO / "results").rglob("*.md")]
)
#: what a page may not mention: folders of the development machine, uncommitted notes
OUTSIDE = ("../shared", "/work/", "/home/", "METHODS.md")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {slug(m) for m in re.findall(r"^#+ (.+)$", text, flags=re.M)}


def links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]  # not http(s), mailto


def rel(page: Path) -> str:
    return str(page.relative_to(REPO))


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_relative_links_resolve(page):
    for target in links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        assert dest.exists(), f"{rel(page)}: link to {target}: no such file"
        assert REPO in dest.parents or dest == REPO, f"{rel(page)}: {target} leaves the repository"
        if anchor and dest.suffix == ".md":
            assert anchor in anchors(dest), f"{rel(page)}: link to {target}: no such heading"


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_no_reference_outside_the_repository(page):
    text = page.read_text()
    found = [s for s in OUTSIDE if s in text]
    assert not found, f"{rel(page)} mentions {found}: describe it in the repository's own docs"


def test_named_experiments_exist():
    names = {p.stem for p in (REPO / "conf" / "experiment").glob("*.yaml")}
    for page in [REPO / "README.md", *(REPO / "docs").glob("*.md")]:
        text = page.read_text()
        own = set(re.findall(r"/experiment/(\w+)\.yaml", text))  # a user's own, made on the page
        for found in re.findall(r"experiment=([\w,]+)", text):
            for name in found.split(","):
                if name.isidentifier() and not name.startswith("NAME"):
                    assert name in names | own, f"{rel(page)}: experiment={name} does not exist"


def test_cited_files_exist():
    """A page that cites a test or source file names one that exists (docs/architecture.md
    cited tests/test_architecture.py after the tests moved to tests/unit/, issue 36)."""
    cited = re.compile(r"(?<![\w/.])((?:tests|src|scripts)/[\w/]+\.py)")
    for page in [REPO / "README.md", *(REPO / "docs").glob("*.md")]:
        text = page.read_text()
        for path in cited.findall(text):
            if f"Write `{path}`" in text:  # a file the page tells the reader to create
                continue
            assert (REPO / path).is_file(), f"{rel(page)} cites {path}, which does not exist"


def test_gpu_page_starts_with_the_user_s_own_gpu():
    """docs/gpu.md described the project's staging kit first (issue 36): a user's part
    (install, device=cuda, train.amp=bf16, determinism) comes before the kit."""
    text = (REPO / "docs" / "gpu.md").read_text()
    sections = re.findall(r"^## (.+)$", text, flags=re.M)
    assert sections[0] == "On your own GPU"
    user = text.split("\n## ")[1]
    for needle in ("uv sync", "device=cuda", "train.amp=bf16", "Determinism"):
        assert needle in user, needle
    assert text.index("## On your own GPU") < text.index("GPU kit")


def test_citation_and_licence_match_the_package():
    """CITATION.cff (how to cite the software and the papers it runs) and LICENSE agree with
    pyproject.toml: a version bump or a licence change that leaves either behind fails."""
    import yaml

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    cff = yaml.safe_load((REPO / "CITATION.cff").read_text())
    assert cff["cff-version"] == "1.2.0"
    for key in ("message", "title", "authors", "version", "license", "references"):
        assert cff.get(key), f"CITATION.cff: {key} missing"
    assert cff["version"] == project["version"]
    assert cff["license"] == project["license"]["text"]
    for ref in cff["references"]:
        assert ref.get("type") and ref.get("title") and ref.get("authors"), ref
    licence = (REPO / "LICENSE").read_text()
    assert licence.startswith(f"{project['license']['text']} License")


#: ``dpsub-...`` -> its top-level config (dpsub.overrides.COMMANDS, inverted)
CONFIGS = {"dpsub-train": "config", "dpsub-audit": "dpsub_audit", "dpsub-pate": "dpsub_pate"}
#: words of a command line that need more than a config: a sweep, a resume, help, elision
NOT_A_CONFIG = ("-m", "--multirun", "--help", "--config-dir", "...", "|")
SKIPPED = ("resume=", "--cfg", "hydra.searchpath=")  # (a user's config folder)


def documented_commands() -> list[tuple[str, str, list[str]]]:
    """(page:line, command, overrides) of every dpsub-train / -audit / -pate line in a code
    block of README.md and docs/ (continuation lines joined, comments cut, ``<...>``
    placeholders filled), except those :data:`NOT_A_CONFIG` names."""
    out = []
    for page in (REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))):
        inside, held = False, ""
        for n, line in enumerate(page.read_text().splitlines(), 1):
            if line.startswith("```"):
                inside, held = not inside, ""
                continue
            line = f"{held} {line.strip()}" if held else line.strip()
            held = line[:-1] if inside and line.endswith("\\") else ""
            m = re.match(r"(?:uv run )?(dpsub-(?:train|audit|pate))\b(.*)", line)
            if not inside or held or not m:
                continue
            words = shlex.split(re.sub(r"<[^>]+>", "PLACEHOLDER", m[2]), comments=True)
            if not any(w in NOT_A_CONFIG or w.startswith(SKIPPED) for w in words):
                out.append((f"{rel(page)}:{n}", m[1], words))
    return out


def test_every_documented_command_composes_and_validates():
    """A command a page shows must get past dpsub's checks: its keys exist, its values
    validate (data and devices aside). features.md's SimCLR command (features.path, a ``???``
    key) was refused as an unknown key until this test."""
    from dpsub.config import validate
    from dpsub.overrides import check_overrides, compose, config_context

    found = documented_commands()
    assert len(found) >= 40, found  # the pages show 40-odd; a parser regression finds few
    bad = []

    def check(where, command, words, step):
        try:
            step(words, CONFIGS[command])
        except Exception as e:  # noqa: BLE001 -- report every page's failures at once
            bad.append(f"{where}: {command} {' '.join(words)}: {str(e).splitlines()[0]}")

    for line in found:  # the command line's checks (each its own Hydra initialization)
        check(*line, lambda words, name: check_overrides(words, config_name=name))
    with config_context():  # then the values, composed under one initialization
        for line in found:
            check(*line, lambda words, name: name != "config" or validate(compose(words)))
    assert not bad, "\n".join(bad)
