"""Every command of the README's Usage block runs (with a cheap step count), as written.

Each line is mapped to the cheap overrides appended to it (steps, evaluation, where to
write) in tests/helpers/readme.py. A README line without an entry there, or an entry whose line
left the README, fails the test: the README and what is tested cannot drift apart. The fast
lines run ``dpsub.cli.train.cli()`` in this process; the lines that train run as subprocesses in
tests/e2e/test_e2e_readme.py.
"""

from __future__ import annotations

import pytest

from conftest import REPO
from helpers.readme import FAST, README_LIMIT, USAGE, check_usage_line, usage_lines


def test_readme_is_short():
    assert len((REPO / "README.md").read_text()) <= README_LIMIT


def test_every_usage_line_is_tested():
    assert set(usage_lines()) == set(USAGE)


@pytest.mark.parametrize("line", FAST)
def test_usage_line_runs(line, tmp_path):
    check_usage_line(line, tmp_path, in_process=True)
