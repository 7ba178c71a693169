"""torchrun helpers shared by the integration and e2e suites."""

from __future__ import annotations

import subprocess
import sys

from conftest import REPO, SYNTH, cli_command

WORKER = REPO / "tests" / "dist_worker.py"


DPSGD = (*SYNTH, "train.max_steps=5", "privacy.noise_multiplier=2.0", "privacy.epsilon=100")


GEP = (*DPSGD, "mechanism=gep", "aux=gaussian", "aux.num_samples=30", "mechanism.num_bases=8")


def torchrun(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    _, env = cli_command()
    env = {**env, "OMP_NUM_THREADS": "1"}
    # --standalone: a free port on localhost, so two suites (or a leftover rank) never collide
    # on torchrun's fixed default port 29500
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           *args]  # fmt: skip
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
