"""The cells step's record of how busy the card was (dpsub.experiments.gpu.load)."""

from __future__ import annotations

import sys
import time

from dpsub.experiments.gpu.load import GpuLoad


def fake_smi(*lines: str) -> tuple[str, ...]:
    """A stand-in for nvidia-smi that prints ``lines`` (one per card)."""
    return (sys.executable, "-c", f"print({chr(10).join(lines)!r})")


def test_samples_the_first_card_and_summarises():
    load = GpuLoad()
    for util in (20, 60, 40, 80, 100):
        load.cmd = fake_smi(f"{util}, {util * 100}, 143771", "0, 0, 143771")
        load.sample()
    s = load.summary()
    assert s["samples"] == 5 and s["utilization_pct"]["median"] == 60
    assert s["utilization_pct"]["p10"] == 28 and s["utilization_pct"]["p90"] == 92
    assert s["memory_used_mib_max"] == 10000 and s["memory_total_mib"] == 143771
    assert "median 60%" in load.line() and "10000 of 143771 MiB" in load.line()


def test_without_nvidia_smi_the_record_says_so_and_nothing_fails():
    with GpuLoad(every_s=0.01, cmd=("/nonexistent/nvidia-smi",)) as load:
        pass
    assert load.summary() == {"samples": 0, "unavailable": "/nonexistent/nvidia-smi unavailable "
                              "(FileNotFoundError)"}  # fmt: skip
    assert load.line().startswith("GPU load not sampled")
    bad = GpuLoad(cmd=fake_smi("[N/A], 10, 20"))
    bad.sample()
    assert bad.summary()["samples"] == 0 and "ValueError" in bad.summary()["unavailable"]


def test_the_thread_samples_until_stopped():
    with GpuLoad(every_s=0.01, cmd=fake_smi("50, 1, 2")) as load:
        end = time.time() + 30
        while len(load.rows) < 3 and time.time() < end:
            time.sleep(0.01)
    n = len(load.rows)
    assert load.summary()["utilization_pct"]["median"] == 50
    assert len(load.rows) == n  # stopped
