"""How busy the card was while the cells trained: ``nvidia-smi`` sampled in a thread.

The record (``gpu_run.json``, the cells step's ``gpu_load``) says whether ``--parallel``
left the card idle (low utilization: more cells at once would be faster) or near its memory
(fewer). Sampling is best effort: without ``nvidia-smi`` the record says so and the cells
run as before.
"""

from __future__ import annotations

import statistics
import subprocess
import threading

QUERY = ("nvidia-smi", "--query-gpu=utilization.gpu,memory.used,memory.total",
         "--format=csv,noheader,nounits")  # fmt: skip


class GpuLoad:
    """``with GpuLoad() as load: ...`` samples every ``every_s`` seconds; ``load.summary()``."""

    def __init__(self, every_s: float = 10.0, cmd: tuple[str, ...] = QUERY):
        self.every_s, self.cmd = every_s, cmd
        self.rows: list[tuple[float, float, float]] = []  # (util %, used MiB, total MiB)
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> GpuLoad:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        while not self._stop.is_set() and self.error is None:
            self.sample()
            self._stop.wait(self.every_s)

    def sample(self) -> None:
        """One reading of the first card (its first line), or the reason there is none."""
        try:
            out = subprocess.run(self.cmd, capture_output=True, text=True, timeout=10)
            first = out.stdout.strip().splitlines()[0] if out.returncode == 0 else ""
            util, used, total = (float(x) for x in first.split(","))
        except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as e:
            self.error = f"{self.cmd[0]} unavailable ({type(e).__name__})"
            return
        self.rows.append((util, used, total))

    def summary(self) -> dict:
        if not self.rows:
            return {"samples": 0, "unavailable": self.error or "no sample taken"}
        util = sorted(r[0] for r in self.rows)
        q = statistics.quantiles(util, n=10, method="inclusive") if len(util) > 1 else util
        return {"samples": len(util), "every_s": self.every_s,
                "utilization_pct": {"median": statistics.median(util), "p10": q[0], "p90": q[-1]},
                "memory_used_mib_max": max(r[1] for r in self.rows),
                "memory_total_mib": self.rows[-1][2]}  # fmt: skip

    def line(self) -> str:
        s = self.summary()
        if not s["samples"]:
            return f"GPU load not sampled: {s['unavailable']}"
        u = s["utilization_pct"]
        return (f"GPU utilization median {u['median']:.0f}% (10-90%: {u['p10']:.0f}-{u['p90']:.0f},"
                f" {s['samples']} samples), memory peak {s['memory_used_mib_max']:.0f} of "
                f"{s['memory_total_mib']:.0f} MiB")  # fmt: skip
