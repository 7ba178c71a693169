"""The built wheel installed in a fresh venv (uv), and running its commands."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO


def _uv() -> list[str]:
    """The command that runs uv, or skip the test."""
    found = shutil.which("uv")
    candidates = [[found]] if found else []
    candidates += [[sys.executable, "-m", "uv"], ["python3", "-m", "uv"]]
    for cmd in candidates:
        try:
            if subprocess.run([*cmd, "--version"], capture_output=True).returncode == 0:
                return cmd
        except OSError:
            continue
    pytest.skip("uv is not available (neither `uv` nor `python -m uv`); it builds the wheel")


def _run(*args, cwd: Path, env: dict | None = None) -> str:
    proc = subprocess.run(list(map(str, args)), cwd=cwd, capture_output=True, text=True, env=env)
    assert proc.returncode == 0, f"{args}:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The python of a fresh venv with the built wheel installed (not editable)."""
    uv, tmp = _uv(), tmp_path_factory.mktemp("wheel")
    _run(*uv, "build", "--wheel", "--out-dir", tmp / "dist", cwd=REPO)
    (wheel,) = (tmp / "dist").glob("dpsub-*.whl")
    venv = tmp / "venv"
    _run(*uv, "venv", "--python", sys.executable, venv, cwd=tmp)
    env = {**os.environ, "UV_PROJECT_ENVIRONMENT": str(venv)}
    sync = ("sync", "--frozen", "--offline", "--no-dev", "--no-install-project")
    _run(*uv, *sync, cwd=REPO, env=env)
    python = venv / "bin" / "python"
    _run(*uv, "pip", "install", "--offline", "--no-deps", "--python", python, wheel, cwd=tmp)
    _run(*uv, "pip", "check", "--python", python, cwd=tmp)
    return python
