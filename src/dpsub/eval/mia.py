"""Membership inference: the loss-threshold attack (Sablayrolles et al. 2019), as in RGP §5.3.

The attacker predicts "member" for an example whose loss under the released model is at
most a threshold. The evaluation set is balanced: ``n`` members (private training
examples) and ``n`` non-members (held-out test examples), each split at random into two
halves. The threshold that maximizes the success rate on the first half is applied to
the second, whose success rate (correct membership guesses / examples) is the result,
with a Wilson score interval. 50% is chance; a private model should stay within its
interval of 50%.

Privacy of the result. The success rate is computed from the private members' losses
without noise, so it is *not* covered by the run's epsilon: :func:`evaluate_run` returns
it under ``private/mia/`` keys, to be logged only on request (``eval.mia=true``) and
with the run marked ``covered_by_epsilon: false`` (docs/dphero.md).

Pure functions (:func:`loss_threshold_attack`, :func:`best_threshold`,
:func:`wilson_interval`) work on loss vectors; :func:`evaluate_run` applies them to a
:class:`~dpsub.training.build.Run` (members: the run's private training set; non-members:
its evaluation set, from which aux sources have already removed what they use).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from statistics import NormalDist
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "DEFAULT_EXAMPLES",
    "MIAResult",
    "TrainedRun",
    "attack_success",
    "best_threshold",
    "evaluate_run",
    "loss_threshold_attack",
    "per_example_losses",
    "wilson_interval",
]


class TrainedRun(Protocol):
    """What :func:`evaluate_run` reads of a run (a :class:`~dpsub.training.build.Run` is one;
    evaluation does not import training): its settings, data and model."""

    settings: Any  # dpsub.config.Settings: eval.mia_examples, seed, train.eval_batch_size
    data: Any  # train_x/train_y (members), test_x/test_y (non-members)
    model: torch.nn.Module


#: Members (and non-members) per evaluation when ``eval.mia_examples`` is not set: RGP
#: uses the whole test set (MNIST / CIFAR-10: 10,000) and as many training examples.
DEFAULT_EXAMPLES = 10_000


@dataclass(frozen=True)
class MIAResult:
    """Success rate of the attack on the held-out half, with its confidence interval."""

    success: float  # correct guesses / examples of the evaluation half
    ci_low: float
    ci_high: float
    threshold: float  # loss threshold chosen on the selection half
    examples: int  # examples of the evaluation half (half members, half non-members)
    confidence: float = 0.95


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion ``successes / n``."""
    if n <= 0 or not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n and n > 0, got {successes}/{n}")
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def attack_success(threshold: float, members: Tensor, nonmembers: Tensor) -> int:
    """Correct guesses of "member iff loss <= threshold"."""
    return int((members <= threshold).sum()) + int((nonmembers > threshold).sum())


def best_threshold(members: Tensor, nonmembers: Tensor) -> float:
    """The loss threshold with the most correct guesses on these examples.

    Candidates are the midpoints between consecutive distinct losses, and -inf (nobody is
    a member). Ties go to the smallest threshold.
    """
    losses = torch.cat([members, nonmembers]).double()
    is_member = torch.cat([torch.ones_like(members), torch.zeros_like(nonmembers)]).double()
    order = torch.argsort(losses)
    sorted_losses, mem = losses[order], is_member[order]
    # correct guesses when the first i+1 sorted examples are called members
    correct = torch.cumsum(mem, 0) + (len(nonmembers) - torch.cumsum(1 - mem, 0))
    distinct = torch.ones_like(correct, dtype=torch.bool)
    distinct[:-1] = sorted_losses[1:] > sorted_losses[:-1]  # cut only between distinct losses
    correct = torch.where(distinct, correct, -1.0)
    i = int(torch.argmax(correct))
    if correct[i] <= len(nonmembers):  # calling nobody a member is at least as good
        return -math.inf
    if i == len(sorted_losses) - 1:
        return float(sorted_losses[i])
    return float((sorted_losses[i] + sorted_losses[i + 1]) / 2)


def loss_threshold_attack(
    members: Tensor,
    nonmembers: Tensor,
    generator: torch.Generator,
    confidence: float = 0.95,
) -> MIAResult:
    """Balanced attack: threshold from one random half, success rate on the other.

    ``members`` and ``nonmembers`` are per-example losses; the larger set is subsampled
    to the smaller one's size, and each is split into two halves of ``n // 2``.
    """
    n = min(len(members), len(nonmembers))
    h = n // 2
    if h < 1:
        raise ValueError(f"membership inference needs >= 2 members and non-members, got {n}")
    pm = torch.randperm(len(members), generator=generator)[: 2 * h]
    pn = torch.randperm(len(nonmembers), generator=generator)[: 2 * h]
    m, nm = members.cpu()[pm], nonmembers.cpu()[pn]
    threshold = best_threshold(m[:h], nm[:h])
    correct = attack_success(threshold, m[h:], nm[h:])
    low, high = wilson_interval(correct, 2 * h, confidence)
    return MIAResult(correct / (2 * h), low, high, threshold, 2 * h, confidence)


@torch.no_grad()
def per_example_losses(model: torch.nn.Module, x: Tensor, y: Tensor, batch_size: int) -> Tensor:
    """Cross-entropy of every example under ``model`` (in eval mode), on the CPU."""
    was_training = model.training
    model.eval()
    out = [
        F.cross_entropy(model(x[i : i + batch_size]), y[i : i + batch_size], reduction="none")
        for i in range(0, x.shape[0], batch_size)
    ]
    model.train(was_training)
    return torch.cat(out).cpu()


def evaluate_run(run: TrainedRun, examples: int | None = None, seed: int | None = None) -> dict:
    """Attack ``run``'s model; the result under ``private/mia/`` keys (not covered by epsilon).

    Members are ``examples`` random examples of the run's private training set,
    non-members as many of its evaluation (test) set; both sets are as the run trained
    and evaluated (aux sources have removed what they use). ``examples`` defaults to
    ``eval.mia_examples`` (else :data:`DEFAULT_EXAMPLES`), ``seed`` to the run seed.
    """
    s = run.settings
    if examples is None:  # conf/config.yaml sets ``eval.mia_examples: null``
        examples = s.eval.mia_examples
    examples = DEFAULT_EXAMPLES if examples is None else examples
    seed = s.seed if seed is None else seed
    gen = torch.Generator().manual_seed(int(seed) + 7_919)  # public: which examples are asked
    data, bs = run.data, int(s.train.eval_batch_size)
    picks = [
        torch.randperm(len(t), generator=gen)[: int(examples)].to(t.device)
        for t in (data.train_y, data.test_y)
    ]
    members = per_example_losses(run.model, data.train_x[picks[0]], data.train_y[picks[0]], bs)
    nonmembers = per_example_losses(run.model, data.test_x[picks[1]], data.test_y[picks[1]], bs)
    result = loss_threshold_attack(members, nonmembers, gen)
    return {f"private/mia/{k}": v for k, v in asdict(result).items()}
