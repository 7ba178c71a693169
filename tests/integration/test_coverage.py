"""What a run's summary says its epsilon covers, and the timing it logs (docs/privacy.md).

``covered_by_epsilon`` is sticky: once a run wrote something its epsilon does not cover
(un-noised diagnostics, a membership-inference result), no resume relabels it. Runs whose
epsilon is no guarantee (shuffle sampling, nominal accounting) are uncovered from the start.
Throughput tracks the realized Poisson batch sizes, so it is logged only as a run average,
and a secure-mode run logs no timing at all.
"""

from __future__ import annotations

import json

import pytest

from dpsub.tracking import read_metrics
from dpsub.training.loop import train

from conftest import SYNTH, cli_in_process, compose_cfg

SHORT = (*SYNTH, "train.max_steps=4", "train.log_every=1", "train.eval_every=2")


def summary(run_dir) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def test_resuming_a_membership_inference_run_does_not_relabel_it_covered(tmp_path):
    run_dir = tmp_path / "run"
    train(compose_cfg(*SHORT, "eval.mia=true", "eval.mia_examples=50"), run_dir)
    assert summary(run_dir)["covered_by_epsilon"] is False
    assert "private/mia/success" in summary(run_dir)["not_covered_statistics"]
    # the real entrypoint, turning the attack off: the un-noised result stays in metrics.jsonl
    proc = cli_in_process(f"resume={run_dir}", "eval.mia=false")
    assert any("private/mia/success" in m for m in read_metrics(run_dir))
    after = summary(run_dir)
    assert after["covered_by_epsilon"] is False, proc.stderr[-2000:]
    assert "membership_inference" in after["not_covered"]


def test_a_covered_run_stays_covered_on_resume(tmp_path):
    run_dir = tmp_path / "run"
    train(compose_cfg(*SHORT), run_dir)
    assert summary(run_dir)["covered_by_epsilon"] is True
    train(compose_cfg(*SHORT, "train.eval_every=0"), run_dir, resume=True)
    assert summary(run_dir)["covered_by_epsilon"] is True
    assert summary(run_dir)["not_covered"] == []


def test_a_membership_inference_script_result_uncovers_a_resumed_run(tmp_path):
    """scripts/mia.py writes mia.json into the run dir: a later resume stays uncovered."""
    run_dir = tmp_path / "run"
    train(compose_cfg(*SHORT), run_dir)
    (run_dir / "mia.json").write_text('{"covered_by_epsilon": false}\n')
    train(compose_cfg(*SHORT), run_dir, resume=True)
    assert summary(run_dir)["covered_by_epsilon"] is False


def test_shuffle_sampling_runs_are_not_covered(tmp_path):
    """Their epsilon is computed as if sampling were Poisson: it is no guarantee."""
    train(compose_cfg(*SHORT, "privacy.sampling=shuffle"), tmp_path / "shuffle")
    s = summary(tmp_path / "shuffle")
    assert s["covered_by_epsilon"] is False and s["not_covered"] == ["shuffle_sampling"]


TIMING = {"run_seconds", "steps_per_s", "cpu_seconds"}  # the run-average timing


def test_a_tuning_run_names_its_unnoised_statistics(tmp_path):
    """Scores on a validation split are held-out *private* examples without noise (the
    papers' uncounted tuning): the summary names each such value, beside the run timing,
    while ``covered_by_epsilon`` (the model and the logs) stays true."""
    train(compose_cfg(*SHORT, "dataset.validation_size=50"), tmp_path / "tune")
    s = summary(tmp_path / "tune")
    entry = s["not_covered_statistics"]
    assert set(entry) == {"validation_accuracy", "validation_loss", *TIMING}
    assert "held-out private training examples" in entry["validation_accuracy"]
    assert "uncounted tuning" in entry["validation_accuracy"]
    assert s["covered_by_epsilon"] is True and s["not_covered"] == []


def test_throughput_is_a_run_average_never_per_window(tmp_path):
    """steps/s over a log window tracks the realized (private) Poisson batch sizes."""
    train(compose_cfg(*SHORT), tmp_path / "run")
    assert not any("steps_per_s" in m for m in read_metrics(tmp_path / "run"))
    s = summary(tmp_path / "run")
    assert s["steps_per_s"] > 0 and s["run_seconds"] > 0
    assert set(s["not_covered_statistics"]) == TIMING
    log = (tmp_path / "run" / "train.log").read_text()
    step_lines = [line for line in log.splitlines() if "] step " in line]
    assert len(step_lines) == 4 and not any("steps/s" in line for line in step_lines)


def test_secure_mode_logs_no_timing(tmp_path):
    train(compose_cfg(*SHORT, "privacy.rng=secure"), tmp_path / "run")
    assert not any("steps_per_s" in m for m in read_metrics(tmp_path / "run"))
    s = summary(tmp_path / "run")
    assert not TIMING & set(s)
    assert s["not_covered_statistics"] == {}  # test-set scores: covered
    assert "steps/s" not in (tmp_path / "run" / "train.log").read_text()


def test_a_secure_checkpoint_holds_no_timing_and_no_stream_that_counts_the_batches(tmp_path):
    """The augmentation stream draws per sampled example: its saved state would count the
    secret Poisson batches (a review recovered their total), as the run's seconds time it."""
    import torch

    train(compose_cfg(*SHORT, "privacy.rng=secure", "train.augmult=2", "model=mnist_cnn"),
          tmp_path / "run")  # fmt: skip
    state = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=False)["state"]
    assert set(state["rng"]["devices"]) == {"public"}  # no sampler, noise or augment stream
    assert not TIMING & set(state)


def test_a_secure_checkpoint_holds_no_shuffle_permutation(tmp_path):
    """privacy.sampling=shuffle in secure mode: the permutation is drawn from the OS and
    secret; the checkpoint held it and its position (review 2026-11-29). A resume draws anew."""
    import torch

    cfg = compose_cfg(*SHORT, "privacy.rng=secure", "privacy.sampling=shuffle")
    train(cfg, tmp_path / "run")
    state = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=False)["state"]
    assert state["sampler"] is None
    train(cfg, tmp_path / "run", resume=True)  # (no step left: it loads and finishes)


def test_run_average_timing_spans_the_whole_run_across_resumes(tmp_path):
    run_dir = tmp_path / "run"
    train(compose_cfg(*SHORT), run_dir)
    first = summary(run_dir)
    train(compose_cfg(*SHORT), run_dir, resume=True)  # no step left: the totals carry over
    again = summary(run_dir)
    # carried over (a reset would leave only the empty resumed loop's microseconds); the
    # resumed loop runs no step, so it adds little (loose bound: a busy machine)
    assert first["run_seconds"] <= again["run_seconds"] <= first["run_seconds"] + 1.0
    steps = first["steps_per_s"] * first["run_seconds"]
    assert again["steps_per_s"] == pytest.approx(steps / again["run_seconds"])
    assert 0 < first["cpu_seconds"] <= again["cpu_seconds"] <= first["cpu_seconds"] + 1.0


def test_cpu_time_is_left_out_when_a_resume_cannot_know_it(tmp_path):
    """A checkpoint written before cpu_seconds was recorded: after the resume the CPU time
    of the steps before it is unknown, so summary.json has none (not the resumed part's,
    which once made a 1,000-step run look 7x cheaper than it was)."""
    import torch

    run_dir = tmp_path / "run"
    train(compose_cfg(*SHORT), run_dir)
    ckpt = run_dir / "checkpoint.pt"
    state = torch.load(ckpt, weights_only=False)
    del state["state"]["cpu_seconds"]
    torch.save(state, ckpt)
    (run_dir / "summary.json").unlink()
    train(compose_cfg(*SHORT), run_dir, resume=True)  # no step left: the summary again
    s = summary(run_dir)
    assert s["run_seconds"] > 0 and "cpu_seconds" not in s
    assert set(s["not_covered_statistics"]) == TIMING - {"cpu_seconds"}
