"""Other frameworks' private steps, timed beside dpsub's (``scripts/bench.py --peers``).

A *peer* is a full private training step of another framework on the same model (a copy
of dpsub's, same initial weights), the same batch, the same clip bound, noise multiplier
and SGD optimizer as dpsub's rows of the same run:

* Opacus (a dependency): ``PrivacyEngine.make_private`` with ``grad_sample_mode`` =
  ``hooks`` (``GradSampleModule``), ``functorch`` and ``ghost`` (fast gradient / ghost
  clipping: ``GradSampleModuleFastGradientClipping`` with ``DPLossFastGradientClipping``);
  each step is forward, backward, clip, noise and ``optimizer.step()``.
* The GEP authors' code (Yu et al., ICLR 2021): ``models/basis_matching.py`` of a checkout
  whose path the user gives (never copied into this repository); needs BackPACK
  (``uv sync --extra peers``). One step is their training loop's private branch: anchor
  subspace from ``m`` auxiliary examples (BackPACK per-example gradients, power iteration,
  Gram-Schmidt), the private batch's per-example gradients, embedding + residual clipping,
  noise, ``optimizer.step()``; with the residual added back (their ``--rgp``, the paper's
  GEP). Their code calls ``.cuda()`` and the removed ``np.int``: on the CPU the two are
  patched in the loaded module (the algorithm is untouched), and the page says so.
* fastDP (Bu et al., book-keeping): not on the package index, so not timed;
  :func:`fastdp_status` gives the line the page prints.

Each peer is a :class:`PeerRun`: ``device``, ``model`` and ``step()``. A peer that
cannot be built is reported by :class:`PeerUnavailable` with a one-line reason.
"""

from __future__ import annotations

import copy
import importlib.util
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

OPACUS_MODES = ("hooks", "functorch", "ghost")
#: the file of the GEP authors' repository that holds their GEP class
GEP_AUTHORS_FILE = Path("models") / "basis_matching.py"


class PeerUnavailable(RuntimeError):
    """A peer that cannot run here (not installed, no checkout...): the message says why."""


@dataclass
class PeerSettings:
    """What every peer shares with dpsub's rows of the same run."""

    clip: float = 1.0
    noise_multiplier: float = 1.0
    lr: float = 0.1
    momentum: float = 0.9
    seed: int = 0


@dataclass
class PeerRun:
    """One peer's full private step on a fixed batch (``step()`` trains ``model`` in place)."""

    name: str
    backend: str
    model: nn.Module
    step_fn: Callable[[], None]
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    options: dict = field(default_factory=dict)

    def step(self) -> None:
        self.step_fn()


# ------------------------------------------------------------------ Opacus
def opacus_peer(mode: str, model: nn.Module, x: Tensor, y: Tensor, s: PeerSettings) -> PeerRun:
    """Opacus' private step in ``grad_sample_mode=mode`` (hooks | functorch | ghost)."""
    if mode not in OPACUS_MODES:
        raise ValueError(f"opacus mode must be one of {OPACUS_MODES}, got {mode!r}")
    from opacus import PrivacyEngine

    model = copy.deepcopy(model).train()
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x.cpu(), y.cpu()), batch_size=len(x)
    )
    opt = torch.optim.SGD(model.parameters(), lr=s.lr, momentum=s.momentum)
    engine = PrivacyEngine(accountant="rdp")
    common = dict(
        module=model, optimizer=opt, data_loader=loader, noise_multiplier=s.noise_multiplier,
        max_grad_norm=s.clip, poisson_sampling=False, grad_sample_mode=mode,
    )  # fmt: skip
    if mode == "ghost":
        gsm, opt, crit, _ = engine.make_private(criterion=nn.CrossEntropyLoss(), **common)
    else:
        gsm, opt, _ = engine.make_private(**common)
        crit = nn.CrossEntropyLoss()

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss = crit(gsm(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)  # free the per-sample gradients between steps

    return PeerRun(f"opacus:{mode}", mode, gsm, step, x.device)


# ----------------------------------------------------------- GEP authors
class _NumpyWithInt(types.ModuleType):
    """numpy with the ``np.int`` alias the authors' code uses (removed in numpy 1.24)."""

    def __init__(self):
        super().__init__("numpy")
        self.int = int

    def __getattr__(self, name):
        return getattr(np, name)


def load_gep_authors(path: Path | str) -> types.ModuleType:
    """The authors' ``models/basis_matching.py`` from checkout ``path``, loaded in place."""
    file = Path(path) / GEP_AUTHORS_FILE
    if not file.is_file():
        raise PeerUnavailable(
            f"GEP authors' code not found: {file} is missing (pass --gep-authors PATH, "
            "a checkout of github.com/dayu11/Gradient-Embedding-Perturbation)"
        )
    if importlib.util.find_spec("backpack") is None:
        raise PeerUnavailable(
            "GEP authors' code needs BackPACK: uv sync --extra peers (backpack-for-pytorch)"
        )
    spec = importlib.util.spec_from_file_location("gep_authors_basis_matching", file)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.np = _NumpyWithInt()
    original_clip = mod.clip_column

    def clip_column(tsr, clip=1.0, inplace=True):  # their code: torch.tensor(clip).cuda()
        if inplace:
            return mod.inplace_clipping(tsr, torch.tensor(clip, device=tsr.device))
        return original_clip(tsr, clip, inplace=False)

    mod.clip_column = clip_column
    return mod


def _group_params(num_p: int, groups: int) -> list[int]:
    """The authors' ``group_params``: equal chunks of the flat vector, the rest in the last."""
    per = num_p // groups
    return [per] * (groups - 1) + [num_p - per * (groups - 1)]


def gep_authors_peer(
    path: Path | str, model: nn.Module, x: Tensor, y: Tensor, aux_x: Tensor, aux_y: Tensor,
    num_bases: int, num_groups: int, power_iters: int, s: PeerSettings,
    clip0: float = 10.0, clip1: float = 2.0,
) -> PeerRun:  # fmt: skip
    """One private GEP step of the authors' training loop (``main.py``, ``--private --rgp``)."""
    mod = load_gep_authors(path)
    from backpack import backpack, extend
    from backpack.extensions import BatchGrad

    net = extend(copy.deepcopy(model).train())
    loss_func = extend(nn.CrossEntropyLoss(reduction="sum"))
    gep = mod.GEP(num_bases, len(x), clip0, clip1, power_iters)
    gep.public_inputs, gep.public_targets = aux_x, aux_y
    gep.num_param_list = _group_params(sum(p.numel() for p in net.parameters()), num_groups)
    opt = torch.optim.SGD(net.parameters(), lr=s.lr, momentum=s.momentum)
    z, bs = s.noise_multiplier, len(x)

    def step() -> None:  # main.py's train(), private branch, logging off
        opt.zero_grad()
        gep.get_anchor_space(net, loss_func=loss_func, logging=False)
        opt.zero_grad()
        loss = loss_func(net(x), y)
        with backpack(BatchGrad()):
            loss.backward()
        rows = []
        for p in net.parameters():
            rows.append(p.grad_batch.reshape(p.grad_batch.shape[0], -1))
            del p.grad_batch
        theta, residual, _ = gep(mod.flatten_tensor(rows), logging=False)
        theta += torch.normal(0, z * clip0 / bs, size=theta.shape, device=theta.device)
        residual += torch.normal(0, z * clip1 / bs, size=residual.shape, device=residual.device)
        noisy = gep.get_approx_grad(theta) + residual
        offset = 0
        for p in net.parameters():
            p.grad.data = noisy[offset : offset + p.numel()].view(p.grad.shape)
            offset += p.numel()
        opt.step()

    opts = {"num_bases": num_bases, "aux_size": len(aux_x), "num_groups": num_groups,
            "power_iters": power_iters}  # fmt: skip
    return PeerRun("gep-authors", "backpack", net, step, x.device, opts)


# ------------------------------------------------------------------ fastDP
def fastdp_status() -> str | None:
    """None if fastDP imports, else why it is not timed."""
    if importlib.util.find_spec("fastDP") is not None:
        return None
    return (
        "fastDP (Bu et al., book-keeping) is not installed: it is not on the package index "
        "(`uv pip install fastDP` finds no such package), so it is not timed"
    )


def gaussian_aux(n: int, in_shape: tuple[int, ...], classes: int, seed: int, device) -> tuple:
    """``n`` standard-normal auxiliary inputs with uniform random labels (dpsub's aux=gaussian)."""
    g = torch.Generator().manual_seed(seed + 7919)
    xs = torch.randn((n, *in_shape), generator=g)
    ys = torch.randint(0, classes, (n,), generator=g)
    return xs.to(device), ys.to(device)
