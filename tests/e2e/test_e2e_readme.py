"""The README's Usage lines that train (slow): each runs as written, with a cheap step count."""

from __future__ import annotations

import pytest

from helpers.readme import FAST, USAGE, check_usage_line


@pytest.mark.parametrize("line", [line for line in USAGE if line not in FAST])
def test_usage_line_runs(line, tmp_path):
    check_usage_line(line, tmp_path)
