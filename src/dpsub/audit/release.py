"""One audited step: the mechanism's real step code, replayed with noise the audit controls.

A release is ``R = F(D, xi)``: the mechanism's step on the batch ``D`` (with or without
the canary) when the privatizer's standard normal draws are ``xi``; given the model
and the mechanism's state, ``xi`` is its only randomness (the public generator is
rewound before every replay, so subspaces, carriers and random labels are the same).
The audit scores a release by ``<R, u>``; ``R`` is the update the mechanism returns
(``view="update"``) or its privatizer's noisy releases, each divided by its noise std
(``view="releases"``: what the accountant's multiplier is about).

If ``F(D, .)`` is affine, ``<F(D, xi), u> = a + <xi, g>`` with ``a = <F(D, 0), u>`` and
``g`` the gradient of the score with respect to ``xi``; since ``xi ~ N(0, I)``, the score
is *exactly* ``N(a, ||g||^2)``. :func:`affine_score` computes ``a`` and ``g`` from one
replay with the draws as autograd leaves, then checks the claim on fresh random draws
(two more real replays: ``<F(D, xi_k), u>`` must equal ``a + <xi_k, g>``). A mechanism
whose release is not affine in its noise (DP-PowerSGD's compression) fails the check
and is audited by :func:`sampled_scores`, one real replay per trial.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from dpsub.audit.canary import CanaryEngine
from dpsub.mechanisms import StepContext
from dpsub.privacy import NoiseBlock, Privatizer

__all__ = ["AffineScore", "Replayer", "ScriptedNoise", "affine_score", "sampled_scores"]


class ScriptedNoise:
    """A noise source that hands out given draws, or fresh zero leaves that need gradients."""

    secure = False

    def __init__(self, draws: Sequence[Tensor] | None = None, leaves: bool = False):
        self.draws = list(draws) if draws is not None else None
        self.leaves = leaves
        self.made: list[Tensor] = []

    def normal(self, shape, device) -> Tensor:
        shape = tuple(shape)
        if self.draws is not None:
            t = self.draws[len(self.made)]
            if tuple(t.shape) != shape:
                raise RuntimeError(f"replay drew {shape}, the script holds {tuple(t.shape)}")
            t = t.to(device)
        else:
            t = torch.zeros(shape, device=device, requires_grad=self.leaves)
        self.made.append(t)
        return t

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class CapturingPrivatizer(Privatizer):
    """A Privatizer that also keeps its noisy outputs and the noise blocks of shaped releases.

    ``whitened()``: the step's releases, each divided by its noise std and concatenated,
    ``[v_1 / std_1, v_2 / std_2, ...]``: the vector the accountant's multiplier is about
    (``dpsub.privacy.noise``), where isotropic noise is N(0, I) in every coordinate.
    """

    def __init__(self, source, reduce=None):
        super().__init__(source, reduce)
        self.shaped_blocks: list[tuple[int, float, list[NoiseBlock]]] = []  # (dim, std, blocks)
        self.outputs: list[tuple[Tensor, float]] = []  # (noisy release, its noise std)

    def gaussian(self, s, std, name="release"):
        out = super().gaussian(s, std, name)
        self.outputs.append((out, float(std)))
        return out

    def shaped(self, s, std, blocks, name="release"):
        self.shaped_blocks.append((int(s.value.numel()), float(std), list(blocks)))
        out = super().shaped(s, std, blocks, name)
        self.outputs.append((out, float(std)))
        return out

    def whitened(self) -> Tensor:
        parts = [out.reshape(-1) / std for out, std in self.outputs if std > 0]
        if not parts:
            raise RuntimeError("audit.view=releases: the step made no noisy release")
        return torch.cat(parts)


@dataclass
class Replayer:
    """Replays ``run``'s mechanism at the current step on one batch, as often as asked.

    Every replay starts from the same mechanism state and public-generator state, so
    the releases differ only through the canary and the noise draws.
    """

    run: object  # dpsub.training.build.Run
    x: Tensor
    y: Tensor
    canary: CanaryEngine
    view: str = "update"  # what a replay returns: the update, or the whitened releases

    def __post_init__(self) -> None:
        mech = self.run.mechanism
        self._state = copy.deepcopy(mech.state_dict())
        self._rng = self.run.rng.get_state()
        self.canary.private_x = self.x

    def __call__(self, with_canary: bool, source) -> tuple[Tensor, CapturingPrivatizer]:
        run, mech = self.run, self.run.mechanism
        mech.load_state_dict(copy.deepcopy(self._state))
        run.rng.set_state(self._rng)
        z = run.plan.multiplier_at(run.step) if run.plan is not None else math.inf
        priv = CapturingPrivatizer(source, reduce=run.privatizer.reduce)
        priv.begin_step()
        ctx = StepContext(
            run.step, run.total_steps, run.settings.train.batch_size, z, priv, run.rng
        )
        real, mech.engine = mech.engine, self.canary
        self.canary.holder = run.dist.main  # one canary: rank 0's shard holds it
        wanted = with_canary
        self.canary.on, before = wanted, self.canary.applied
        try:
            res = mech.step(self.x, self.y, ctx)
        finally:
            mech.engine, self.canary.on = real, False
        if wanted and self.canary.applied == before:
            raise RuntimeError(f"mechanism {mech.name}: the canary never reached its private batch")
        return (priv.whitened() if self.view == "releases" else res.grad), priv

    def restore(self) -> None:
        """Leave the mechanism and the public generator as they were before any replay."""
        self.run.mechanism.load_state_dict(copy.deepcopy(self._state))
        self.run.rng.set_state(self._rng)


@dataclass
class AffineScore:
    """The score of one hypothesis at one step is ``N(mean, std^2)`` (exactly)."""

    mean: float
    std: float
    check_error: float  # largest |predicted - replayed| score over the checks, in units of std


def zero_release(replay: Replayer, with_canary: bool) -> tuple[Tensor, CapturingPrivatizer]:
    """The noise-free release (replays run with autograd on: opacus and ghost need it)."""
    r, priv = replay(with_canary, ScriptedNoise())
    return r.detach(), priv


def affine_score(
    replay: Replayer, with_canary: bool, u: Tensor, generator: torch.Generator, checks: int = 2
) -> AffineScore | None:
    """``(a, ||g||)`` of the score ``<F(D, xi), u>``, or None if the replays are not affine in xi."""
    model_params = [p for p in replay.run.model.parameters()]
    source = ScriptedNoise(leaves=True)
    with torch.enable_grad():
        release, _ = replay(with_canary, source)
        score = torch.dot(release.reshape(-1).double(), u.double())
        leaves = [t for t in source.made if t.requires_grad]
        grads = torch.autograd.grad(score, leaves, allow_unused=True) if leaves else []
    for p in model_params:
        p.grad = None
    grads = [
        torch.zeros_like(t) if g is None else g.detach() for t, g in zip(leaves, grads, strict=True)
    ]
    a = float(score.detach())
    std = math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads))
    worst = 0.0
    for _ in range(checks):
        draws = [torch.randn(t.shape, generator=generator).to(t.device) for t in source.made]
        r = replay(with_canary, ScriptedNoise(draws))[0].detach()
        got = float(torch.dot(r.reshape(-1).double(), u.double()))
        want = a + sum(
            float((d.double() * g.double()).sum()) for d, g in zip(draws, grads, strict=True)
        )
        err = abs(got - want)
        worst = max(worst, err / max(std, 1e-30))
        if err > 1e-3 * std + 1e-5 * (abs(a) + float(r.norm())):
            return None
    return AffineScore(a, std, worst)


def sampled_scores(
    replay: Replayer, with_canary: bool, u: Tensor, trials: int, generator: torch.Generator
) -> Tensor:
    """``trials`` scores, each from a real replay with fresh standard normal draws."""
    out = torch.empty(trials, dtype=torch.float64)
    shapes = [tuple(t.shape) for t in zero_release(replay, with_canary)[1].source.made]
    for k in range(trials):
        draws = [torch.randn(s, generator=generator) for s in shapes]
        r = replay(with_canary, ScriptedNoise(draws))[0].detach()
        out[k] = torch.dot(r.reshape(-1).double().cpu(), u.double().cpu())
    return out
