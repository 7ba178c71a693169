"""Data-parallel training on PyTorch's own engine (torch.distributed), same privacy guarantee.

Launch with ``torchrun --nproc_per_node N -m dpsub.cli.train ...`` (or Slurm through
``hydra/launcher=slurm`` with several tasks per node: the ranks then come from Slurm's
environment). What each step does across ranks:

* **Randomness is drawn once, on rank 0, and broadcast**: the Poisson mask and every
  noise draw come from rank 0's generators, the very streams a single process would use,
  so a distributed run releases what the single-process run releases (up to the order
  of floating-point sums) and can be resumed with any number of ranks.
* **Per-example work is split**: each rank takes every ``world``-th example of the
  sampled batch, computes and clips its per-example gradients.
* **Noise is added once**: the privatizer all-reduces each sensitive sum (clipped
  gradient sums, GEP's embedding and residual sums) before adding the one broadcast
  noise draw, so the noise's variance is that of one draw, not N.
* **Public subspaces** (GEP's anchors, PDP-SGD's public gradients) are split across
  ranks and all-gathered (:meth:`dpsub.grads.GradEngine.public_gradients`).
* **The same update everywhere**: the released gradient is broadcast from rank 0 before
  the optimizer step. The ledger, checkpoints, logs and evaluations live on rank 0.

A rank that fails takes the job down: torchrun stops the other workers, and every
collective has a timeout (``DPSUB_DIST_TIMEOUT_S``, default 600 s) so nothing hangs.
"""

from __future__ import annotations

import datetime
import gc
import os
from dataclasses import dataclass

import torch
import torch.distributed as tdist
from torch import Tensor


@dataclass(frozen=True)
class Dist:
    """This process's place in a process group (``world == 1``: a single process)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world > 1

    # --------------------------------------------------------- collectives
    def all_reduce(self, t: Tensor) -> Tensor:
        """The sum of ``t`` over ranks (a new tensor; ``t`` is left as it is)."""
        if not self.active:
            return t
        out = t.detach().clone()
        tdist.all_reduce(out, op=tdist.ReduceOp.SUM)
        return out

    def broadcast(self, t: Tensor) -> Tensor:
        """Rank 0's ``t`` on every rank (in place)."""
        if self.active:
            tdist.broadcast(t, src=0)
        return t

    def broadcast_object(self, obj):
        if not self.active:
            return obj
        box = [obj]
        tdist.broadcast_object_list(box, src=0)
        return box[0]

    def all_gather_rows(self, local: Tensor, total: int) -> Tensor:
        """Rows split round-robin (rank r holds rows r, r + world, ...) back in order."""
        if not self.active:
            return local
        width = (total + self.world - 1) // self.world
        padded = local.new_zeros((width, *local.shape[1:]))
        padded[: local.shape[0]] = local
        parts = [torch.empty_like(padded) for _ in range(self.world)]
        tdist.all_gather(parts, padded.contiguous())
        out = local.new_empty((total, *local.shape[1:]))
        for r, part in enumerate(parts):
            n = len(range(r, total, self.world))
            out[r :: self.world] = part[:n]
        return out

    def shutdown(self) -> None:
        """Leave the process group together: a rank that exits alone can abort the others.

        The collections free, before the group goes, the cycles that still hold its tensors:
        left to the interpreter's teardown, they abort gloo (``terminate called without an
        active exception``, exit -6) in 5 of 18 two-rank runs (torch 2.15, CPU)."""
        if self.active and tdist.is_initialized():
            gc.collect()
            tdist.barrier()
            tdist.destroy_process_group()
            gc.collect()

    def shard(self, idx: Tensor) -> Tensor:
        """This rank's share of a batch's indices."""
        return idx[self.rank :: self.world] if self.active else idx


SINGLE = Dist()


def _slurm_env() -> None:
    """Under Slurm with several tasks (and no torchrun), export torch.distributed's variables."""
    if "RANK" in os.environ or int(os.environ.get("SLURM_NTASKS", "1")) <= 1:
        return
    try:
        from submitit.helpers import TorchDistributedEnvironment
    except ImportError as e:
        raise RuntimeError(
            "a Slurm job with several tasks needs submitit to find its peers "
            "(pip install 'dpsub[slurm]'), or launch the tasks with torchrun"
        ) from e
    # device_for() picks cuda:<local rank>, so leave CUDA_VISIBLE_DEVICES alone
    TorchDistributedEnvironment().export(set_cuda_visible_devices=False)


def init_distributed(device: str) -> Dist:
    """Join the process group torchrun (or Slurm) describes; a single process otherwise."""
    _slurm_env()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return SINGLE
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if not tdist.is_initialized():
        cuda = device != "cpu" and torch.cuda.is_available()
        if cuda:
            torch.cuda.set_device(local)
        timeout = datetime.timedelta(seconds=int(os.environ.get("DPSUB_DIST_TIMEOUT_S", "600")))
        tdist.init_process_group("nccl" if cuda else "gloo", timeout=timeout)
    return Dist(rank, world, local)


def device_for(name: str, dist: Dist) -> str:
    """Each rank its own GPU: ``cuda`` becomes ``cuda:<local rank>``."""
    if dist.active and name in ("auto", "cuda") and torch.cuda.is_available():
        return f"cuda:{dist.local_rank}"
    return "cpu" if name == "auto" and not torch.cuda.is_available() else name


class BroadcastNoise:
    """Noise drawn by rank 0 from ``source`` and received by every other rank."""

    def __init__(self, source, dist: Dist):
        self.source, self.dist = source, dist
        self.secure = source.secure

    def normal(self, shape, device) -> Tensor:
        if self.dist.main:
            t = self.source.normal(shape, device).contiguous()
        else:
            t = torch.empty(tuple(shape), device=device)
        return self.dist.broadcast(t)

    def state_dict(self) -> dict:
        return self.source.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.source.load_state_dict(state)


def broadcast_uniform(uniform, dist: Dist, device, dtype: torch.dtype):
    """A sampler's uniform source (draws of ``dtype``) that rank 0 draws and all ranks receive."""
    if not dist.active:
        return uniform

    def draw(n: int) -> Tensor:
        t = uniform(n).to(torch.float64) if dist.main else torch.empty(n, dtype=torch.float64)
        return dist.broadcast(t.to(device).contiguous()).to(dtype)  # exact for float32 draws

    return draw
