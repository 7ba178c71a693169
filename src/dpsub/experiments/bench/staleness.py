"""How stale may GEP's anchor subspace be? Errors of old bases along one trajectory.

GEP's authors recompute the anchor subspace at every step from a fresh random start
(one power iteration over m anchor gradients: most of a step's cost at m = 2000,
k = 1000). dpsub can refit every N steps, each refit warm-started from the previous
basis (subspace tracking). This measures what that costs in subspace quality: along one
training trajectory, at sample steps s, the basis a run refitting every N steps would
hold at s (fitted at s - N, the oldest it can be, after a warm chain that began with a
fresh start) is compared with a fresh fit at s, on the per-example gradients of a fixed
batch of private training examples (a diagnostic, never released):

* ``mean_error``: ``||mean_i r_i|| / ||mean_i g_i||``, the batch-mean projection error
  (GEP's Figure 4; what the residual release must carry);
* ``median_residual``: the median over examples of ``||r_i|| / ||g_i||``;
* ``residual_clipped``: the fraction of examples with ``||r_i|| > S2``.

A second fresh fit (another random start) at s shows how much a fit varies by itself.
The decision rule (``docs/methods.md``): the longest N whose mean over the sample steps
of ``mean_error(N) / mean_error(fresh)`` and of ``median_residual(N) /
median_residual(fresh)`` both stay within 1.10; else refit every step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

FRESH, FRESH2 = "fresh", "fresh_again"


@dataclass(frozen=True)
class Plan:
    """Sample steps, refit intervals and the length of each warm chain (in refits)."""

    samples: tuple[int, ...]
    intervals: tuple[int, ...] = (5, 20)
    chain: dict[int, int] = field(default_factory=lambda: {5: 8, 20: 4})

    def fits_at(self, step: int) -> list[tuple[str, int | None, bool]]:
        """The fits due at ``step``: (name, sample step they serve, warm?) in order.

        Interval N's chain for sample s: a fresh fit at ``s - N * chain[N]``, then warm
        refits every N steps up to ``s - N``; at s itself two fresh fits."""
        due = []
        for s in self.samples:
            for n in self.intervals:
                first = s - n * self.chain[n]
                if first <= step <= s - n and (step - first) % n == 0:
                    due.append((f"every_{n}", s, step > first))
            if step == s:
                due += [(FRESH, s, False), (FRESH2, s, False)]
        return due

    def first_step(self) -> int:
        return min(s - n * self.chain[n] for s in self.samples for n in self.intervals)


def errors(basis, G: torch.Tensor, clip_residual: float) -> dict[str, float]:
    """The three errors of ``basis`` on per-example gradients ``G`` (n, p)."""
    W = basis.embed(G)
    R = basis.residual(G, W)
    g_norm = G.norm(dim=1).clamp_min(1e-30)
    r_norm = R.norm(dim=1)
    return {
        "mean_error": float(R.mean(0).norm() / G.mean(0).norm().clamp_min(1e-30)),
        "median_residual": float((r_norm / g_norm).median()),
        "residual_clipped": float((r_norm > clip_residual).float().mean()),
    }


def decide(records: list[dict], intervals, tolerance: float = 1.10) -> dict:
    """Mean ratios to the fresh fit per interval, and the longest interval within tolerance
    (all shorter intervals within it too); 1 (refit every step) if none is."""
    out: dict = {"tolerance": tolerance, "ratios": {}, "refit_every": 1}
    passing = True
    for n in sorted(intervals):
        ratios = {}
        for key in ("mean_error", "median_residual"):
            r = [rec[f"every_{n}"][key] / rec[FRESH][key] for rec in records if rec[FRESH][key] > 0]
            ratios[key] = {"mean": sum(r) / len(r), "max": max(r)}
        out["ratios"][f"every_{n}"] = ratios
        passing = passing and all(v["mean"] <= tolerance for v in ratios.values())
        if passing:
            out["refit_every"] = n
    return out


def measure(traj, gep, plan: Plan, batch: torch.Tensor, seed: int, log) -> list[dict]:
    """Train ``traj`` (a Run) to the last sample step; at each step the plan names, fit the
    GEP run ``gep``'s subspace on ``traj``'s current weights and, at sample steps, record
    every basis's errors on the private examples ``batch`` (indices)."""
    from dpsub.training.build import train_step

    gen = torch.Generator(device=gep.device).manual_seed(seed)
    mech, clip = gep.mechanism, gep.mechanism.opts.clip_residual
    held: dict[str, object] = {}
    records = []
    x, y = gep.data.train_x[batch], gep.data.train_y[batch]
    while traj.step <= plan.samples[-1]:
        due = plan.fits_at(traj.step) if traj.step >= plan.first_step() else []
        if due:
            gep.model.load_state_dict(traj.model.state_dict())
        for name, _, warm in due:
            held[name] = mech.fit_subspace(gen, start=held.get(name) if warm else None)
        if traj.step in plan.samples:
            G = torch.cat([c.grads for c in gep.engine.per_example(x, y)])
            rec = {"step": traj.step, **{n: errors(b, G, clip) for n, b in held.items()}}
            records.append(rec)
            log(rec)
        if traj.step == plan.samples[-1]:
            break
        train_step(traj)
    return records


# ------------------------------------------------------------------ the study
#: the trajectory: GP at the sim-eps2 noise level (batch 128 with the mean-gradient noise of
#: the paper's batch 1,000 at epsilon 2), lr x C = 1 = GEP's lr x S1 (0.1 x 10)
TRAJECTORY = (
    "experiment=dpsgd_cifar10_eps2", "grads.backend=ghost", "train.batch_size=128",
    "grads.microbatch=128", "train.epochs=8", "train.max_steps=2500", "train.eval_every=0",
    "privacy.simulate.batch_size=1000", "privacy.simulate.dataset_size=50000",
    "optim.lr=1.0", "mechanism.clip=1.0", "dataset.validation_size=5000",
)  # fmt: skip
#: the subspaces: GEP as its authors ran it (3 chunks, k = 1000, m = 2000 anchors)
SUBSPACE = (
    "experiment=gep_cifar10_eps2", "mechanism=gep_authors", "train.batch_size=128",
    "grads.microbatch=128", "dataset.validation_size=5000",
)  # fmt: skip


def study(out, common: list[str], samples: tuple[int, ...], examples: int, seed: int, log):
    """Run (or continue) the study into ``out``: metrics.jsonl gets one record per sample
    step, checkpoint.pt the trajectory at the last one. A killed study continues after its
    last record: from the checkpoint, or (none: a fresh clone) by replaying the seeded
    trajectory without its fits.
    ``common``: overrides of both runs; those written ``gep:KEY=VALUE``, of the GEP run's."""
    import json

    from dpsub.config import compose
    from dpsub.rundir import CHECKPOINT, METRICS, SUMMARY, hardware
    from dpsub.training.build import build_run, load_run_state, run_state

    both = [o for o in common if not o.startswith("gep:")]
    traj = build_run(compose([*TRAJECTORY, *both]))
    gep = build_run(compose([*SUBSPACE, *both, *(o[4:] for o in common if o.startswith("gep:"))]))
    metrics, ckpt = out / METRICS, out / CHECKPOINT
    done = (
        [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
    )
    state = torch.load(ckpt, weights_only=False) if ckpt.exists() and done else None
    if state is not None and int(state["step"]) == done[-1]["step"]:
        load_run_state(traj, state)  # else the seeded trajectory is replayed (no fits)
    if done:
        log(f"continuing after step {done[-1]['step']} ({len(done)} samples done) "
            f"from step {traj.step}")  # fmt: skip
    else:
        metrics.write_text("")
    todo = tuple(s for s in samples if not done or s > done[-1]["step"])
    batch = torch.randperm(len(gep.data.train_y), generator=torch.Generator().manual_seed(seed))
    plan = Plan(todo)

    def record(rec: dict) -> None:
        with metrics.open("a") as f:
            f.write(json.dumps(rec) + "\n")
        torch.save(run_state(traj), ckpt)
        log(json.dumps(rec))

    if todo:
        measure(traj, gep, plan, batch[:examples], seed + len(done), record)
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    summary = {**decide(records, plan.intervals), "samples": [r["step"] for r in records],
               "examples": examples, "hardware": hardware()}  # fmt: skip
    (out / SUMMARY).write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def render(records: list[dict], summary: dict) -> list[str]:
    """Markdown lines: each basis's errors per sample step, then the ratios and the pick."""
    names = [n for n in records[0] if n != "step"] if records else []
    head = "| step | " + " | ".join(f"{n}: mean error / median residual / > S2" for n in names)
    lines = [head + " |", "|---:|" + "---|" * len(names)]
    for r in records:
        cells = [f"{r[n]['mean_error']:.4f} / {r[n]['median_residual']:.4f} / "
                 f"{r[n]['residual_clipped']:.2f}" for n in names]  # fmt: skip
        lines.append(f"| {r['step']} | " + " | ".join(cells) + " |")
    lines += ["", "| refit interval | mean error ratio: mean (max) | median residual ratio: mean (max) |",
              "|---|---:|---:|"]  # fmt: skip
    for name, ratios in summary.get("ratios", {}).items():
        m, r = ratios["mean_error"], ratios["median_residual"]
        lines.append(
            f"| {name} | {m['mean']:.3f} ({m['max']:.3f}) | {r['mean']:.3f} ({r['max']:.3f}) |"
        )
    lines += ["", f"Decision (tolerance {summary.get('tolerance')}): refit every "
              f"**{summary.get('refit_every')}** step(s)."]  # fmt: skip
    return lines
