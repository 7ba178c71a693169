"""The table of README.md from rounds.log: per strategy, the median [min, max] seconds of
the code before and after, and of the per-round ratio after / before."""

import collections
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    times = collections.defaultdict(list)
    for line in (HERE / "rounds.log").read_text().splitlines():
        _, version, _, strategy, _, seconds = line.split()
        times[(strategy, version)].append(float(seconds))
    rows = ["| strategy | before (s) | after (s) | after / before |", "|---|---:|---:|---:|"]
    for strategy in ("auto", "materialize", "ghost"):
        old, new = times[(strategy, "old")], times[(strategy, "new")]
        ratio = [b / a for a, b in zip(old, new, strict=True)]
        cells = [f"{statistics.median(x):.{d}f} [{min(x):.{d}f}, {max(x):.{d}f}]"
                 for x, d in ((old, 3), (new, 3), (ratio, 2))]  # fmt: skip
        rows.append(f"| {strategy} | " + " | ".join(cells) + f" | ({len(old)} rounds)")
    (HERE / "summary.md").write_text("\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
