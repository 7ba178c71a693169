"""Parameter averaging (``train.ema=<decay>``): the weights evaluated and saved are an EMA.

After every step the average moves towards the weights the optimizer just produced,

    avg_t = mu_t avg_{t-1} + (1 - mu_t) w_t,   mu_t = min(decay, (1 + t) / (10 + t)),

with t the number of earlier updates (the warm-up of jax_privacy's ``averaging.ema``, which
De et al. 2022 train with: early averages do not drag the initial weights along). The
average is a function of the released gradients only (post-processing): it costs no
privacy. Evaluation and the models that tools load from a finished run
(:func:`dpsub.training.build.load_finished_run`) use the averaged weights; training continues
from the raw ones (the checkpoint keeps both, the average under ``ema``, so a resumed run
continues the same average bit for bit). ``train.ema_eval=both`` also evaluates the raw
weights, logged as ``<split>/raw_accuracy`` and ``<split>/raw_loss``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn


class EMA:
    """An exponential moving average of a model's trainable parameters (float32 copies)."""

    def __init__(self, model: nn.Module, decay: float):
        self.decay = float(decay)
        self.updates = 0
        self.avg = {n: p.detach().clone() for n, p in _params(model)}

    def update(self, model: nn.Module) -> None:
        """One step: move the average towards the model's current weights."""
        mu = min(self.decay, (1.0 + self.updates) / (10.0 + self.updates))
        with torch.no_grad():
            for n, p in _params(model):
                self.avg[n].lerp_(p.detach(), 1.0 - mu)
        self.updates += 1

    def state_dict(self) -> dict:
        return {"decay": self.decay, "updates": self.updates, "avg": dict(self.avg)}

    def load_state_dict(self, state: dict) -> None:
        self.updates = int(state["updates"])
        for n, t in state["avg"].items():
            self.avg[n].copy_(t)

    def copy_to(self, model: nn.Module) -> None:
        """Write the averaged weights into ``model`` (for good: a finished run's model)."""
        with torch.no_grad():
            for n, p in _params(model):
                p.copy_(self.avg[n])

    @contextmanager
    def applied(self, model: nn.Module) -> Iterator[nn.Module]:
        """``model`` with the averaged weights inside the block, its own ones restored after."""
        raw = {n: p.detach().clone() for n, p in _params(model)}
        self.copy_to(model)
        try:
            yield model
        finally:
            with torch.no_grad():
                for n, p in _params(model):
                    p.copy_(raw[n])


def _params(model: nn.Module) -> Iterator[tuple[str, Tensor]]:
    return ((n, p) for n, p in model.named_parameters() if p.requires_grad)


def released_state(state: dict) -> dict:
    """The model state dict a checkpoint's ``state`` releases: its weights, the averaged
    ones in place of the raw ones when the run averaged them (``train.ema``)."""
    return {**state["model"], **state.get("ema", {}).get("avg", {})}


def build_ema(decay: float | None, model: nn.Module) -> EMA | None:
    """``train.ema``: the average, or None when off (null or 0)."""
    return EMA(model, decay) if decay else None


def evaluate_released(run, evaluate: Callable) -> tuple[float, float, dict[str, float]]:
    """``(accuracy, loss, extra metrics)`` of the model the run releases: the averaged
    weights with ``train.ema`` (and, with ``train.ema_eval=both``, the raw weights' as
    ``<split>/raw_*``), else the model itself. ``evaluate(model, x, y, batch_size)``."""
    d, batch = run.data, run.settings.train.eval_batch_size
    if run.ema is None:
        return (*evaluate(run.model, d.test_x, d.test_y, batch), {})
    extra = {}
    if run.settings.train.ema_eval == "both":
        acc, loss = evaluate(run.model, d.test_x, d.test_y, batch)
        extra = {f"{d.eval_split}/raw_accuracy": acc, f"{d.eval_split}/raw_loss": loss}
    with run.ema.applied(run.model) as averaged:
        return (*evaluate(averaged, d.test_x, d.test_y, batch), extra)


@contextmanager
def released(run) -> Iterator[None]:
    """Inside the block, ``run.model`` holds the weights the run releases (the average)."""
    if run.ema is None:
        yield
        return
    with run.ema.applied(run.model):
        yield
