"""dpsub.rundir: reading finished runs' saved configs."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from dpsub import rundir as runs

SAVED = """\
optim: {lr: 1e-3, momentum: .9, nesterov: false}
privacy: {delta: 1.0e-05, epsilon: 8, noise_multiplier: null}
data: {root: /data, when: 2001-12-14}
out_dir: outputs/runs/${now:%Y-%m-%d}
mechanism: {name: gep, num_bases: 200, clip: [10, 2.0], tag: '1e5'}
"""


def _run(tmp_path: Path, text: str) -> runs.RunDir:
    (tmp_path / runs.CONFIG).write_text(text)
    return runs.RunDir(tmp_path)


def test_config_dict_reads_what_omegaconf_reads(tmp_path):
    run = _run(tmp_path, SAVED)
    fast = run.config_dict()
    assert fast == OmegaConf.to_container(OmegaConf.load(run.config_path))
    assert fast["optim"]["lr"] == 1e-3 and fast["data"]["when"] == "2001-12-14"


def test_config_dict_refuses_a_duplicate_key_with_the_file_named(tmp_path):
    run = _run(tmp_path, "seed: 0\nseed: 1\n")
    with pytest.raises(runs.RunError, match=str(run.config_path)):
        run.config_dict()


def test_not_covered_statistics_names_each_unnoised_value():
    """Derived from the keys alone, so it also reads a summary written before the entry."""
    old = {"steps": 10, "epsilon": 2.0, "validation_accuracy": 0.5, "test_accuracy": 0.4,
           "run_seconds": 3.0, "private/mia/success": 0.6}  # fmt: skip
    got = runs.not_covered_statistics(old)
    assert set(got) == {"validation_accuracy", "run_seconds", "private/mia/success"}
    assert "held-out private training examples" in got["validation_accuracy"]


def test_hardware_records_torch_s_thread_count():
    """A CPU run's sums depend on the threads (docs/usage.md), so the record names them."""
    import torch

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert ", 1 thread; GPU: " in runs.hardware()
    finally:
        torch.set_num_threads(before)


def test_hardware_comes_from_the_summary_else_the_log_else_the_device(tmp_path):
    """What a table's hardware line counts: a run's own record, never the renderer's."""
    run = runs.RunDir(tmp_path)
    (tmp_path / runs.LOG).write_text("[17:41:28][INFO] device           cuda:0 (world size 1)\n")
    assert run.hardware() == "cuda (hardware not recorded)"
    with (tmp_path / runs.LOG).open("a") as f:
        f.write("[17:41:28][INFO] hardware         Xeon, 16 cores; GPU: NVIDIA H200; torch 2\n")
    assert run.hardware() == "Xeon, 16 cores; GPU: NVIDIA H200; torch 2"
    (tmp_path / runs.SUMMARY).write_text('{"steps": 1, "hardware": "EPYC, 2 cores; GPU: none"}')
    assert run.hardware() == "EPYC, 2 cores; GPU: none"
