"""One-run input-space audit (Steinke, Nasr, Jagielski, "Privacy Auditing with One (1)
Training Run", NeurIPS 2023).

m canary examples (training images relabelled to a random other class: mislabeled
examples the model can only fit by memorizing them) are taken out of the private set;
each is put back independently with probability 1/2. One ordinary training run
(:func:`~dpsub.training.build.train_step`, the trainer's step) follows. The auditor then
ranks the canaries by the final model's loss and guesses "in" for the k lowest and
"out" for the k highest (k fixed before the run; no choice made after seeing the
outcome), abstaining on the rest; the number v of correct guesses among r = 2k gives
the paper's bound (:func:`~dpsub.audit.bounds.one_run_epsilon`).
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F

from dpsub.audit import bounds

__all__ = ["check_options", "guesses", "insert_canaries", "onerun_audit"]


def check_options(audit) -> None:
    """audit.guesses must leave room for both kinds of guess (2k <= m)."""
    from dpsub.errors import ConfigError

    if 2 * int(audit.guesses) > int(audit.canaries):
        raise ConfigError(
            f"audit.guesses: 2 x guesses must be <= audit.canaries={audit.canaries}, "
            f"got {audit.guesses!r}"
        )


def insert_canaries(data, m: int, seed: int):
    """``(data with the included canaries, canary x, canary labels, included mask)``."""
    g = torch.Generator().manual_seed(seed)
    n = int(data.train_y.shape[0])
    if not 0 < m < n:
        from dpsub.errors import ConfigError

        raise ConfigError(
            f"audit.canaries: must be in [1, {n - 1}] for {n} training examples, got {m}"
        )
    perm = torch.randperm(n, generator=g)
    chosen, rest = perm[:m], perm[m:]
    shift = torch.randint(1, data.num_classes, (m,), generator=g)
    labels = (data.train_y[chosen] + shift) % data.num_classes  # never the true class
    included = torch.rand(m, generator=g) < 0.5
    x = torch.cat([data.train_x[rest], data.train_x[chosen][included]])
    y = torch.cat([data.train_y[rest], labels[included]])
    out = dataclasses.replace(data, train_x=x, train_y=y)
    return out, data.train_x[chosen], labels, included


def guesses(losses: torch.Tensor, included: torch.Tensor, k: int) -> tuple[int, int]:
    """(r, v): "in" for the k lowest losses, "out" for the k highest; v of them correct."""
    m = int(losses.numel())
    k = min(k, m // 2)
    order = torch.argsort(losses)
    guess_in, guess_out = order[:k], order[m - k :]
    v = int(included[guess_in].sum()) + int((~included[guess_out]).sum())
    return 2 * k, v


@torch.no_grad()
def canary_losses(model, x, y, batch: int = 1024) -> torch.Tensor:
    model.eval()
    out = torch.cat(
        [F.cross_entropy(model(x[i : i + batch]), y[i : i + batch], reduction="none")
         for i in range(0, x.shape[0], batch)]
    )  # fmt: skip
    model.train()
    return out.cpu()


def onerun_audit(cfg, audit, log=None) -> tuple[dict, object]:
    """Train once with the canaries; return (the audit's report, the finished run)."""
    from dpsub.training.build import build_run, load_data, train_step

    data = load_data(cfg)
    data, cx, cy, included = insert_canaries(data, int(audit.canaries), int(audit.seed))
    run = build_run(cfg, data=data)
    while run.step < run.total_steps:
        if train_step(run).stopped_by_budget:
            break
        if log is not None and cfg.train.log_every and run.step % cfg.train.log_every == 0:
            eps = run.ledger.epsilon() if run.ledger is not None else math.inf
            log.info("step %d/%d | epsilon %.4f", run.step, run.total_steps, eps)
    losses = canary_losses(run.model, cx.to(run.device), cy.to(run.device))
    m = int(audit.canaries)
    r, v = guesses(losses, included, int(audit.guesses))
    delta = float(cfg.privacy.delta)
    eps_lb = bounds.one_run_epsilon(m, r, v, delta, float(audit.alpha))
    upper = run.ledger.epsilon() if run.ledger is not None else math.inf
    report = {
        "kind": "onerun",
        "mechanism": run.mechanism.name,
        "delta": delta,
        "q": run.q,
        "steps": run.step,
        "noise_multiplier": run.z,
        "epsilon_upper": upper,
        "epsilon_nominal": None if run.nominal is None else run.nominal.epsilon(),
        "accountant": cfg.privacy.accountant,
        "lower_bound": {"epsilon": eps_lb, "confidence": 1 - float(audit.alpha)},
        "trials": {"canaries": m, "included": int(included.sum()), "guesses": r, "correct": v},
        "exceeds_upper": eps_lb > upper,
    }
    return report, run
