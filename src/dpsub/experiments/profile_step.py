"""Where a step's time goes: torch.profiler over one non-private step and one DP-SGD
(ghost-clipped) step of a model on random CIFAR-shaped data, top operators by self CPU time.

    uv run python scripts/profile_step.py --model wrn --depth 28 --width 2 --batch 256

``--microbatches 125,250,500 --rounds 20`` instead times the ghost-clipped sum of one batch
at each micro-batch size, the sizes interleaved round by round: median, quartiles and
range per size, with the load average before and after (``grads.microbatch=auto``'s CPU
ceiling, docs/speed.md).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from dpsub.grads import GradEngine
from dpsub.models import build_model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", default="wrn")
    p.add_argument("--depth", type=int, default=28)
    p.add_argument("--width", type=int, default=2)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--microbatch", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--top", type=int, default=12)
    p.add_argument("--microbatches", default="", help="e.g. 125,250,500: time these instead")
    p.add_argument("--rounds", type=int, default=20, help="with --microbatches")
    a = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(a.threads)
    opts = {"depth": a.depth, "width": a.width} if a.model == "wrn" else {}
    net = build_model(a.model, (3, 32, 32), 10, **opts)
    x, y = torch.randn(a.batch, 3, 32, 32), torch.randint(0, 10, (a.batch,))
    if a.microbatches:
        sweep([int(m) for m in a.microbatches.split(",")], net, x, y, a.rounds)
        return
    engine = GradEngine(net, microbatch=a.microbatch, backend="ghost")

    def nonprivate():
        net.zero_grad()
        F.cross_entropy(net(x), y).backward()

    def dpsgd():
        engine.clipped_sum(x, y, 1.0)

    for name, step in (("non-private", nonprivate), ("DP-SGD ghost", dpsgd)):
        step()  # warm-up
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            step()
        total = sum(e.self_cpu_time_total for e in prof.key_averages()) / 1e6
        print(f"## {name}: {total:.2f} s self CPU time in one step")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=a.top))


def sweep(sizes: list[int], net, x, y, rounds: int) -> None:
    """The clipped sum's wall time at each micro-batch size, interleaved over ``rounds``."""
    engines = {mb: GradEngine(net, microbatch=mb, backend="ghost") for mb in sizes}
    for e in engines.values():
        e.clipped_sum(x, y, 1.0)  # warm-up
    times: dict[int, list[float]] = {mb: [] for mb in sizes}
    print(f"batch {len(x)}, {torch.get_num_threads()} threads, load before {os.getloadavg()}")
    for _ in range(rounds):
        for mb, e in engines.items():
            t = time.perf_counter()
            e.clipped_sum(x, y, 1.0)
            times[mb].append(time.perf_counter() - t)
    print("| micro-batch | median (s) | quartiles (s) | range (s) | rounds |")
    print("|---:|---:|---|---|---:|")
    for mb, ts in times.items():
        q = statistics.quantiles(ts, n=4)
        print(f"| {mb} | {statistics.median(ts):.2f} | {q[0]:.2f}-{q[2]:.2f} | "
              f"{min(ts):.2f}-{max(ts):.2f} | {len(ts)} |")  # fmt: skip
    print(f"load after {os.getloadavg()}")


if __name__ == "__main__":
    main()
