"""The README's Usage block and how each of its lines is run cheaply (tests/integration/
test_readme.py runs the fast lines, tests/e2e/test_e2e_readme.py the others)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, SHARED, cli_command, run_in_process
from helpers.data import write_fake_cifar10, write_fake_cifar100

CHEAP = ("train.max_steps=1", "train.eval_every=0")

#: README line (without its comment) -> overrides appended to it, or a special handling
USAGE = {
    "uv run dpsub-train": CHEAP,
    "uv run dpsub-train mechanism=nonprivate": CHEAP,
    "uv run dpsub-train mechanism=gep aux=gaussian aux.num_samples=256 mechanism.num_bases=64": CHEAP,
    "uv run dpsub-train mechanism=bgep aux=gaussian aux.num_samples=256 mechanism.num_bases=64": CHEAP,
    "uv run dpsub-train mechanism=pdpsgd": CHEAP,
    "uv run dpsub-train mechanism=rpdpsgd": CHEAP,
    "uv run dpsub-train mechanism=rgp grads.backend=ghost": CHEAP,
    "uv run dpsub-train mechanism=rgp_random": CHEAP,
    "uv run dpsub-train mechanism=dppowersgd": CHEAP,
    "uv run dpsub-train mechanism=dphero model=lenet privacy.noise_multiplier=1 privacy.epsilon=1e12": CHEAP,
    "uv run dpsub-train mechanism=dphero model=lenet mechanism.accounting=nominal": CHEAP,
    "uv run dpsub-train mechanism=dphero_floor model=lenet": CHEAP,
    "uv run dpsub-train dataset=mnist privacy.epsilon=2 train.epochs=20 optim.lr=0.5": CHEAP,
    "uv run dpsub-train experiment=gep_mnist_eps2": CHEAP,
    "uv run dpsub-train -m experiment=dpsgd_mnist_eps2,gep_mnist_eps2 seed=0,1,2": (
        *CHEAP,
        "train.batch_size=128",
    ),
    "uv run dpsub-train grads.backend=ghost": CHEAP,
    "uv run dpsub-train privacy.rng=secure": CHEAP,
    "uv run torchrun --nproc_per_node 2 -m dpsub.cli.train dataset=mnist": CHEAP,
    # frozen features of CIFAR-10: run on a fake CIFAR-10 and CIFAR-100 in torchvision's layout
    "uv run dpsub-train experiment=a3_gep features=scatternet features.pool=2 mechanism.num_bases=99": (
        "fake_cifar10",
    ),
    "uv run dpsub-train experiment=a3_gep features=efficientnet_lite0 mechanism.num_bases=113": (
        "fake_cifar10",
    ),
    "uv run dpsub-train experiment=a3_dpsgd features=efficientnet_lite0 optim.lr=0.002 "
    "mechanism.clip=0.1 train.max_steps=1000 train.epochs=30": ("fake_cifar10",),
    "uv run dpsub-train --cfg job dataset=cifar10 model=resnet20": (),
    "uv run dpsub-train --help": (),
    # the resume example: a run stopped early (here: after 2 steps), then resumed
    "uv run dpsub-train out_dir=outputs/my_run": ("train.max_steps=2", "train.eval_every=0"),
    "uv run dpsub-train resume=outputs/my_run": ("resume",),
}
NEEDS_DATA = ("dataset=mnist", "experiment=gep_mnist", "experiment=dpsgd_mnist")


README_LIMIT = 12_000  # characters (issue 26): details live in docs/ and results/README.md


def usage_lines() -> list[str]:
    """Every line of every ```bash block of the README's Usage section."""
    section = (REPO / "README.md").read_text().split("\n## Usage", 1)[1].split("\n## ", 1)[0]
    blocks = [part.split("```", 1)[0] for part in section.split("```bash")[1:]]
    lines = [line for block in blocks for line in block.strip().splitlines()]
    return [re.split(r"\s+#", line)[0].strip() for line in lines]


def split(line: str) -> tuple[list[str], list[str]]:
    """(launcher words, dpsub-train arguments) of ``uv run ...``."""
    words = shlex.split(line)[2:]  # drop "uv run"
    if words[0] == "torchrun":  # torchrun --nproc_per_node 2 -m dpsub.cli.train ARGS
        return words[:3], words[5:]
    return [], words[1:]


def command(line: str, extra: tuple[str, ...], tmp: Path) -> list[str]:
    """This interpreter runs the line, W&B and the bar off, output under ``tmp``."""
    launcher, rest = split(line)
    args, _ = (
        cli_command()
    )  # [python, -m, dpsub.cli.train, logger.mode=disabled, train.progress=false]
    head = args[:3]
    if launcher:
        head = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            *launcher[1:],
            "-m",
            "dpsub.cli.train",
        ]
    rest = [w for w in rest if not w.startswith("out_dir=")]  # the test writes under tmp
    where = [f"hydra.sweep.dir={tmp / 'sweep'}"] if "-m" in rest else [f"out_dir={tmp / 'run'}"]
    if "--cfg" in rest or "--help" in rest:
        where = []
    return [*head, *rest, *args[3:], *extra, *where]  # flags (-m, --cfg) before overrides


def sweep_size(rest: list[str]) -> int:
    n = 1
    for word in rest:
        if "=" in word:
            n *= len(word.split("=", 1)[1].split(","))
    return n


#: lines run in the fast suite (the others, each a few training processes, are marked slow)
FAST = (
    "uv run dpsub-train",
    "uv run dpsub-train experiment=a3_gep features=scatternet features.pool=2 mechanism.num_bases=99",
    "uv run dpsub-train --help",
    "uv run dpsub-train --cfg job dataset=cifar10 model=resnet20",
)


def check_usage_line(line: str, tmp_path: Path, in_process: bool = False) -> None:
    """Run ``line`` cheaply and check what it wrote; ``in_process``: a ``dpsub-train`` line
    runs ``dpsub.cli.train.cli()`` in this process (conftest.run_in_process), not a subprocess."""
    if any(k in line for k in NEEDS_DATA) and SHARED is None:
        pytest.skip("real data not found")
    extra = USAGE[line]
    _, env = cli_command()
    env = {**env, "OMP_NUM_THREADS": "1"}
    if extra == ("fake_cifar10",):  # 600 test images: the 500 anchors and 100 to evaluate
        write_fake_cifar10(tmp_path / "data", per_batch=40, n_test=600)
        write_fake_cifar100(tmp_path / "data", n=64)  # torchvision's layout, as a user has it
        extra = (*CHEAP, "train.batch_size=50", f"data.root={tmp_path / 'data'}")
        extra = (*extra, f"features.cache_dir={tmp_path}")
    if extra == ("resume",):  # resume a run that was stopped early
        start = "uv run dpsub-train out_dir=outputs/my_run"  # the README's line before it
        first = command(start, USAGE[start], tmp_path)
        subprocess.run(first, cwd=REPO, env=env, check=True, capture_output=True, timeout=600)
        cmd = [*command("uv run dpsub-train", (), tmp_path)[:3], f"resume={tmp_path / 'run'}"]
    else:
        cmd = command(line, extra, tmp_path)
    if in_process and cmd[1:3] == ["-m", "dpsub.cli.train"]:
        proc = run_in_process("dpsub.cli.train", cmd[3:], env)
    else:
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"{cmd}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    _, rest = split(line)
    if "--help" in rest:
        assert "Config groups" in proc.stdout
    elif "--cfg" in rest:
        assert "resnet20" in proc.stdout and "cifar10" in proc.stdout
    elif "-m" in rest:
        jobs = [p for p in (tmp_path / "sweep").iterdir() if p.is_dir()]
        assert len(jobs) == sweep_size(rest)
        assert all((j / "summary.json").exists() for j in jobs)
    else:
        summary = json.loads((tmp_path / "run" / "summary.json").read_text())
        assert summary["steps"] >= 1 and "final: test accuracy" in proc.stdout
