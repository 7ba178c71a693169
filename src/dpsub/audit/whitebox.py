"""White-box gradient-canary audit (after Nasr et al., "Tight Auditing of DP ML", 2023).

The auditor sees every released update and controls one extra per-example gradient,
the canary (norm: the mechanism's clipping bound; direction: random, a coordinate, the
least noisy direction of the mechanism's noise, or aligned with what the mechanism
releases; GEP's aligned canary has norm S1 in the anchor subspace and S2 orthogonal to
it). ``view="releases"`` scores the privatizer's releases, each divided by its noise std,
instead of the update (GEP: both releases, which the update mixes). Under hypothesis "in" the
canary is in the private set, so each step's Poisson sample holds it with probability
q; under "out" it is not. A trial's score sums, over the T audited steps, the released
update's projection on the canary's direction in release space: the difference of
the noise-free releases with and without it (for DP-SGD and DP-Hero that is the canary
itself). Trials are scored by :mod:`dpsub.audit.release` (exactly, when the release is
affine in its noise; by one real replay per trial otherwise), and the scores become an
epsilon lower bound (:mod:`dpsub.audit.bounds`).

Between audited steps the run advances by an ordinary :func:`~dpsub.training.build.train_step`
(no canary), so step t is audited at the state real training reaches; the audited
sequence is a composition of the run's own Poisson-subsampled releases, which the
accountant's epsilon covers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from dpsub.audit import bounds
from dpsub.audit.canary import CanaryEngine, canary_vector, split_canary
from dpsub.audit.release import Replayer, affine_score, sampled_scores, zero_release
from dpsub.mechanisms.gep import GEP
from dpsub.privacy import epsilon_for

__all__ = ["WhiteboxOptions", "least_noisy_direction", "whitebox_audit"]

DIRECTIONS = ("random", "coordinate", "least_noisy", "aligned")
VIEWS = ("update", "releases")
ALIGN_ITERS = 3


@dataclass
class WhiteboxOptions:
    steps: int = 1  # T audited steps
    trials: int = 1_000_000  # per hypothesis, when every audited step is affine in its noise
    direct_trials: int = 2000  # per hypothesis, otherwise (one real replay each)
    direction: str = "aligned"  # random | coordinate | least_noisy | aligned
    index: int = 0  # the coordinate (direction=coordinate)
    norm_scale: float = 1.0  # canary norm = norm_scale x the mechanism's clipping bound
    view: str = "update"  # scored: the update (update) or the releases / their noise std
    alpha: float = 0.05  # 1 - confidence of the Clopper-Pearson bound
    seed: int = 0

    def __post_init__(self) -> None:
        if self.direction not in DIRECTIONS:
            raise ValueError(
                f"audit.direction: must be one of {DIRECTIONS}, got {self.direction!r}"
            )
        if self.view not in VIEWS:
            raise ValueError(f"audit.view: must be one of {VIEWS}, got {self.view!r}")


def clip_bound(mechanism) -> float:
    """The mechanism's clipping bound (GEP: the larger of S1 and S2)."""
    o = mechanism.opts
    if hasattr(o, "clip"):
        return float(o.clip)
    return max(float(getattr(o, f)) for f in vars(o) if f.startswith("clip_"))


def least_noisy_direction(priv) -> tuple[int, Tensor] | None:
    """(dim, unit vector) of the least noisy direction of a shaped release, None if none.

    A block adds ``left @ N`` to a (rows, cols) matrix: its column j has noise covariance
    ``std^2 left left^T``, least along the left singular vector of ``left`` with the
    smallest singular value (a null direction if ``left`` has fewer columns than rows).
    """
    best = None
    for dim, std, blocks in priv.shaped_blocks:
        for b in blocks:
            U, S, _ = torch.linalg.svd(b.left.double(), full_matrices=True)
            smin = float(S.min()) if b.left.shape[1] >= b.rows else 0.0
            col = U[:, -1] if b.left.shape[1] < b.rows else U[:, int(S.argmin())]
            if best is None or std * smin < best[0]:
                v = torch.zeros(dim, dtype=torch.float64)
                v[b.start : b.start + b.size].view(b.rows, b.cols)[:, 0] = col
                best = (std * smin, dim, v.float())
    return None if best is None else (best[1], best[2])


class _Canaries:
    """The canary vector per target dimension (one direction for the whole audit)."""

    def __init__(self, opts: WhiteboxOptions, norm: float):
        self.opts, self.norm = opts, norm
        self.gen = torch.Generator().manual_seed(opts.seed)
        self.fixed: dict[int, Tensor] = {}

    def __call__(self, dim: int) -> Tensor:
        if dim not in self.fixed:
            kind = "coordinate" if self.opts.direction == "coordinate" else "random"
            self.fixed[dim] = canary_vector(dim, kind, self.norm, self.gen, self.opts.index)
        return self.fixed[dim]


def _step_scores(run, engine: CanaryEngine, canaries: _Canaries, opts, gen, first: bool) -> dict:
    """Score model of one audited step at the run's current state."""
    idx = run.dist.shard(run.sampler.sample())
    replay = Replayer(run, run.data.train_x[idx], run.data.train_y[idx], engine, opts.view)
    out0, priv = zero_release(replay, False)
    note = None
    if first and opts.direction == "least_noisy":
        found = least_noisy_direction(priv)
        if found is None:
            note = "isotropic noise: every direction is as noisy, a random one is used"
        else:
            canaries.fixed[found[0]] = found[1] * canaries.norm
    if first and opts.direction == "aligned":
        gep = isinstance(run.mechanism, GEP)
        note = _split(run.mechanism, canaries, opts) if gep else _align(replay, canaries, out0)
    in0, _ = zero_release(replay, True)
    shift = (in0 - out0).reshape(-1)
    if float(shift.norm()) == 0:  # the release does not depend on the canary at all
        u = torch.zeros_like(shift)
        u[0] = 1.0
    else:
        u = shift / shift.norm()
    s_out = affine_score(replay, False, u, gen)
    s_in = affine_score(replay, True, u, gen)
    z_plan = run.plan.multiplier_at(run.step)
    step = {"shift_norm": float(shift.norm()), "note": note, "z_planned": z_plan}
    step["z_records"] = priv.effective_multiplier()
    if s_out is not None and s_in is not None:
        step.update(mode="affine", mean_in=s_in.mean, std_in=s_in.std, mean_out=s_out.mean)
        step.update(std_out=s_out.std, check_error=max(s_in.check_error, s_out.check_error))
    else:
        k = opts.direct_trials
        step.update(mode="sampled")
        step["in"] = sampled_scores(replay, True, u, k, gen).numpy()
        step["out"] = sampled_scores(replay, False, u, k, gen).numpy()
        step["out_mix"] = sampled_scores(replay, False, u, k, gen).numpy() if run.q < 1 else None
    replay.restore()
    return step


def _align(replay: Replayer, canaries: _Canaries, out0: Tensor) -> str | None:
    """Move the canary into what the mechanism releases: ``c <- |c| shift(c) / |shift(c)|``.

    The noise-free shift of the release (known to a white-box auditor who knows the batch
    and the public state) is the canary's image under the mechanism; for a projection
    onto a subspace, one iteration puts the canary in that subspace.
    """
    for _ in range(ALIGN_ITERS):
        ((dim, c),) = canaries.fixed.items() if len(canaries.fixed) == 1 else [(None, None)]
        in0, _ = zero_release(replay, True)
        if dim is None:  # the first replay made the canary
            ((dim, c),) = canaries.fixed.items()
        shift = (in0 - out0).reshape(-1).cpu()
        if shift.numel() != dim:
            return "release and canary spaces differ: the canary keeps its random direction"
        if float(shift.norm()) == 0:
            return "the release does not depend on the canary"
        canaries.fixed[dim] = shift * (canaries.norm / shift.norm())
    return None


def _split(mech: GEP, canaries: _Canaries, opts: WhiteboxOptions) -> str:
    """GEP's canary: S1 inside the anchor subspace the replay just fitted, S2 orthogonal to it.

    Both releases are then saturated: the embedding's shift is S1 against noise
    z sqrt(2) S1, the residual's S2 against z sqrt(2) S2, so in the releases view the
    canary's whitened shift has norm 1/z. B-GEP releases the embedding only: its canary
    has no residual part (S1 against z S1: 1/z as well).
    """
    o = mech.opts
    s1 = opts.norm_scale * o.clip_embedding
    s2 = opts.norm_scale * o.clip_residual if mech.release_residual else 0.0
    canaries.fixed[mech.basis.dim] = split_canary(mech.basis, s1, s2, canaries.gen)
    return f"GEP split canary: embedding part {s1:g} in the anchor subspace, residual part {s2:g}"


def _simulate(steps: list[dict], q: float, n: int, rng: np.random.Generator):
    """Scores of n trials per hypothesis, summed over the audited steps."""
    s_in, s_out = np.zeros(n), np.zeros(n)
    for st in steps:
        inc = rng.random(n) < q  # the canary's Poisson inclusion under "in"
        if st["mode"] == "affine":
            s_out += st["mean_out"] + st["std_out"] * rng.standard_normal(n)
            z = rng.standard_normal(n)
            s_in += np.where(
                inc, st["mean_in"] + st["std_in"] * z, st["mean_out"] + st["std_out"] * z
            )
        else:
            s_out += st["out"][:n]
            mix = st["out_mix"] if st["out_mix"] is not None else st["out"]
            s_in += np.where(inc, st["in"][:n], mix[:n])
    return s_in, s_out


def whitebox_audit(run, opts: WhiteboxOptions) -> dict:
    """Audit ``run``'s mechanism over ``opts.steps`` steps from its current state."""
    from dpsub.training.build import train_step

    mech = run.mechanism
    if not mech.private:
        raise ValueError(f"mechanism {mech.name} is not private: nothing to audit")
    norm = opts.norm_scale * clip_bound(mech)
    canaries = _Canaries(opts, norm)
    engine = CanaryEngine(mech.engine, canaries)
    gen = torch.Generator().manual_seed(opts.seed + 1)
    steps = []
    for t in range(opts.steps):
        steps.append(_step_scores(run, engine, canaries, opts, gen, first=t == 0))
        if t + 1 < opts.steps:  # advance (no canary): the next audited step is a real one
            if train_step(run).stopped_by_budget:
                raise RuntimeError(f"the privacy budget stopped the run at step {run.step}")
    affine = all(st["mode"] == "affine" for st in steps)
    n = opts.trials if affine else opts.direct_trials
    rng = np.random.default_rng(opts.seed + 2)
    s_in, s_out = _simulate(steps, run.q, n, rng)
    if len(canaries.fixed) == 1:  # the canary's own norm (GEP's split canary: hypot(S1, S2))
        norm = float(next(iter(canaries.fixed.values())).norm())
    return _report(run, opts, norm, steps, s_in, s_out, affine, rng)


def _report(run, opts, norm, steps, s_in, s_out, affine, rng) -> dict:
    delta = float(run.settings.privacy.delta)
    valid = bounds.split_threshold_bound(s_in, s_out, delta, opts.alpha, rng)
    mu = bounds.gdp_fit(s_in, s_out)
    out = {
        "kind": "whitebox",
        "mechanism": run.mechanism.name,
        "backend": run.settings.grads.backend,
        "ranks": run.dist.world,
        "delta": delta,
        "q": run.q,
        "steps": opts.steps,
        "noise_multiplier": run.z,
        **_accountant(run, steps),
        "accountant": run.settings.privacy.accountant,
        "lower_bound": {**valid.as_dict(), "confidence": 1 - opts.alpha},
        "gdp": {"mu": mu, "epsilon": bounds.gdp_epsilon(mu, delta)},
        "trials": {"in": len(s_in), "out": len(s_out), "mode": "affine" if affine else "sampled"},
        "canary": {"direction": opts.direction, "norm": norm, "seed": opts.seed},
        "view": opts.view,
        "per_step": [_public(st) for st in steps],
    }
    if affine and opts.steps == 1 and run.q == 1:  # the exact score distributions are Gaussian
        st = steps[0]
        out["gdp"]["mu_exact"] = (st["mean_in"] - st["mean_out"]) / max(st["std_out"], 1e-300)
    out["exceeds_upper"] = valid.epsilon > out["epsilon_upper"]
    if out["epsilon_nominal"] is not None:
        out["exceeds_nominal"] = valid.epsilon > out["epsilon_nominal"]
    return out


def _accountant(run, steps: list[dict]) -> dict:
    """The accountant's epsilon for the audited steps, charged as the trainer charges them.

    Planned accounting: the planned multiplier (what the ledger is told; the trainer's
    check compares it with the records, which the audit does not need to trust).
    Measured (DP-Hero): the records' multiplier, and the planned one as the nominal epsilon.
    """
    p = run.settings.privacy
    planned = [(st["z_planned"], run.q, 1) for st in steps]
    measured = [(max(st["z_records"], 1e-300), run.q, 1) for st in steps]
    if run.account.charges_plan:
        return {
            "epsilon_upper": epsilon_for(planned, p.delta, p.accountant),
            "epsilon_nominal": None,
        }
    return {
        "epsilon_upper": epsilon_for(measured, p.delta, p.accountant),
        "epsilon_nominal": epsilon_for(planned, p.delta, p.accountant),
    }


def _public(st: dict) -> dict:
    return {k: v for k, v in st.items() if k not in ("in", "out", "out_mix")}
