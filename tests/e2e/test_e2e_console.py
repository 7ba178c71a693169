"""The console's header, progress bar and plan line, through the real CLI (slow: a CLI run each)."""

from __future__ import annotations

import os
import re
import subprocess
import time

import pytest

from conftest import REPO, cli_command, run_cli

pty = pytest.importorskip("pty")  # POSIX only


ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


DEMO = ("experiment=demo", "train.max_steps=12", "train.log_every=4", "train.eval_every=0")


def run_in_terminal(args: list[str], env: dict, cols: int = 120) -> tuple[int, str, float]:
    """Run ``args`` with stdin, stdout and stderr on one pseudo-terminal ``cols`` wide.

    Returns (exit code, everything written, seconds until the first byte arrived).
    """
    import fcntl
    import struct
    import termios

    t0 = time.monotonic()
    pid, fd = pty.fork()
    if pid == 0:  # child: a terminal of a real size (tqdm draws nothing 0 columns wide)
        fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", 40, cols, 0, 0))
        os.chdir(REPO)
        os.execve(args[0], args, env)
    out, first = b"", None
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        first = time.monotonic() - t0 if first is None else first
        out += chunk
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    return (
        os.waitstatus_to_exitcode(status),
        out.decode(errors="replace"),
        first if first is not None else float("inf"),
    )


def screen(raw: str) -> list[str]:
    """The lines a terminal shows for ``raw``: a carriage return overwrites from column 0."""
    lines = []
    for line in ANSI.sub("", raw).replace("\r\n", "\n").split("\n"):
        cells: list[str] = []
        col = 0
        for ch in line:
            if ch == "\r":
                col = 0
                continue
            if col < len(cells):
                cells[col] = ch
            else:
                cells.append(ch)
            col += 1
        lines.append("".join(cells).rstrip())
    return [ln for ln in lines if ln]


def test_progress_bar_in_a_terminal_prints_each_log_line_once_above_the_bar(tmp_path):
    """Issue 19.2: Hydra's root console handler printed every line a second time, glued
    to the bar (``eps=1.895][01:34:19][INFO] step 4/12 ...``)."""
    args, env = cli_command(*DEMO, run_dir=tmp_path / "run")
    args = [a for a in args if a != "train.progress=false"] + ["train.progress=true"]
    code, raw, _ = run_in_terminal(args, env)
    assert code == 0, raw[-3000:]
    shown = screen(raw)
    for msg in ("step 4/12 |", "step 8/12 |", "step 12/12 |", "eval step 12 |", "final: test"):
        hits = [ln for ln in shown if msg in ln]
        assert len(hits) == 1, (msg, hits)
        assert re.match(r"^\[\d\d:\d\d:\d\d\]\[INFO\] ", hits[0]), hits[0]  # formatted, own line
        assert "it/s" not in hits[0] and "█" not in hits[0], hits[0]  # not glued to the bar
    bars = [ln for ln in shown if "it/s" in ln]
    assert bars and "12/12" in bars[-1]  # the bar was drawn and finished
    assert all("[INFO]" not in b for b in bars), bars
    assert raw.count("[INFO] step 4/12") == 1  # not redrawn: printed once
    log = (tmp_path / "run" / "train.log").read_text()
    assert log.count("step 4/12 |") == 1 and "it/s" not in log


def test_header_names_aux_backend_world_and_wandb_and_resume_is_marked_in_train_log(tmp_path):
    """Issue 19.10: the header says where W&B writes and in which mode; the resume marker
    reaches ``train.log`` (it went to the console only)."""
    run_dir = tmp_path / "run"
    first = run_cli(*DEMO[:2], "train.max_steps=2", "logger.mode=offline", run_dir=run_dir)
    shown = first.stdout + first.stderr
    wandb_dirs = list((run_dir / "wandb").glob("offline-run-*"))
    assert len(wandb_dirs) == 1
    assert f"W&B offline in {wandb_dirs[0]} (upload later: wandb sync {wandb_dirs[0]})" in shown
    for line in ("aux              none", "grads            backend vmap, microbatch",
                 "(world size 1)", f"logger           {run_dir / 'metrics.jsonl'}"):  # fmt: skip
        assert line in shown, line
    second = run_cli("resume=" + str(run_dir))
    assert "W&B disabled" in second.stdout + second.stderr
    log = (run_dir / "train.log").read_text()
    marker = log.index(f"resumed {run_dir} at step 2")
    assert log.index("final: test accuracy") < marker < log.rindex("final: test accuracy")


def test_the_plan_is_the_first_line_before_torch_is_imported(tmp_path):
    """Issue 19.11: nothing was printed for 13-25 s (imports, data, W&B). The plan line comes
    before ``import torch`` (one stream: ``-X importtime`` on stderr, unbuffered stdout)."""
    args, env = cli_command(*DEMO, "train.max_steps=2", run_dir=tmp_path / "run")
    args = [args[0], "-X", "importtime", *args[1:]]
    proc = subprocess.run(
        args, cwd=REPO, env={**env, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:]
    lines = proc.stdout.splitlines()
    logged = [i for i, ln in enumerate(lines) if "[INFO]" in ln]
    torch_at = next(i for i, ln in enumerate(lines) if re.search(r"\|\s+torch(\.|$)", ln))
    assert "plan: dpsgd on digits with mnist_cnn | epsilon 3.0" in lines[logged[0]]
    assert "at most 2 steps" in lines[logged[0]] and str(tmp_path / "run") in lines[logged[0]]
    assert logged[0] < torch_at
    assert not any(re.search(r"\| +opacus$", ln) for ln in lines)  # accounting needs no opacus
