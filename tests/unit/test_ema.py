"""Parameter averaging (train.ema): the average's update, what is evaluated, and a resume that
continues it bit for bit (docs/recipe.md)."""

from __future__ import annotations

import io

import torch
from torch import nn

from dpsub.training.build import build_run, load_run_state, run_state, train_step
from dpsub.training.ema import EMA, evaluate_released, released_state

from conftest import SYNTH, compose_cfg


def test_the_average_follows_the_warmed_up_decay():
    model = nn.Linear(3, 2)
    w0 = model.weight.detach().clone()
    ema = EMA(model, 0.999)
    expected = w0.clone()
    for t in range(4):
        with torch.no_grad():
            model.weight.add_(1.0)
        mu = min(0.999, (1 + t) / (10 + t))
        expected = mu * expected + (1 - mu) * model.weight.detach()
        ema.update(model)
    torch.testing.assert_close(ema.avg["weight"], expected)
    raw = model.weight.detach().clone()
    with ema.applied(model):
        torch.testing.assert_close(model.weight.detach(), expected)
    assert torch.equal(model.weight.detach(), raw)  # restored after


def _run(*overrides):
    return build_run(compose_cfg(*SYNTH, "train.batch_size=32", "train.ema=0.99", *overrides))


def _through_disk(state: dict) -> dict:
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


def test_ema_weights_resume_bit_exactly_after_a_checkpoint():
    run = _run()
    for _ in range(2):
        train_step(run)
    saved = _through_disk(run_state(run))
    for _ in range(2):
        train_step(run)
    resumed = _run()
    load_run_state(resumed, saved)
    for _ in range(2):
        train_step(resumed)
    assert resumed.ema.updates == run.ema.updates == 4
    for n, t in run.ema.avg.items():
        assert torch.equal(resumed.ema.avg[n], t), n
    for a, b in zip(run.model.parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_evaluation_reads_the_averaged_weights_and_both_on_request():
    run = _run("train.ema_eval=both")
    train_step(run)
    calls = []

    def evaluate(model, x, y, batch):
        calls.append(next(model.parameters()).detach().clone())
        return float(len(calls)), 0.0

    acc, _, raw = evaluate_released(run, evaluate)
    first = next(iter(run.ema.avg.values()))
    assert torch.equal(calls[-1], first) and acc == 2.0  # the average, evaluated last
    assert not torch.equal(calls[0], first)  # the raw weights first
    assert set(raw) == {f"{run.data.eval_split}/raw_accuracy", f"{run.data.eval_split}/raw_loss"}
    off = build_run(compose_cfg(*SYNTH, "train.batch_size=32"))
    assert off.ema is None and evaluate_released(off, evaluate)[2] == {}


def test_a_checkpoint_releases_the_averaged_weights():
    run = _run()
    train_step(run)
    state = run_state(run)
    released = released_state(state)
    for n, t in run.ema.avg.items():
        assert torch.equal(released[n], t) and not torch.equal(state["model"][n], t)
    off = build_run(compose_cfg(*SYNTH, "train.batch_size=32"))
    assert released_state(run_state(off)).keys() == off.model.state_dict().keys()
