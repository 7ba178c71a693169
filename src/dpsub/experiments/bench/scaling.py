"""Cost growth: step time against batch size and model size (``scripts/bench_scaling.py``).

A *sweep* is a list of settings (model, width, batch); each setting is one interleaved
``scripts/bench.py`` run of the same rows (non-private, DP-SGD ghost, GEP tracked, RGP),
so every ratio compares steps timed in the same rounds. :func:`rows` flattens the bench
records into one row per (setting, mechanism); :func:`write_csv` and :func:`plot` write
the data and the figure (ms/step and the ratio to non-private, against batch and size).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

#: the rows of every setting: (label, mechanism, backend)
SERIES = (
    ("non-private", "nonprivate", "-"),
    ("DP-SGD (ghost)", "dpsgd", "ghost"),
    ("GEP tracked (ghost rows)", "gep", "ghost"),
    ("RGP (ghost)", "rgp", "ghost"),
)
FIELDS = ("sweep", "model", "width", "params", "batch_size", "series", "mechanism", "backend",
          "ms_per_step", "min_ms", "max_ms", "time_ratio", "peak_extra_mib", "status",
          "amortized_ms", "amortized_ratio")  # fmt: skip
#: GEP tracked is plotted at this refit cadence: its timed steps hold one refit (the slowest)
#: and steady steps (the fastest), so amortized = (refit + (s - 1) * steady) / s
AMORTIZE = 20


def key_of(row: dict) -> tuple[str, str, str, str]:
    """(sweep, model, width, batch) of a CSV row or a Setting's fields, as strings."""
    width = row.get("width") or ""
    return str(row["sweep"]), str(row["model"]), str(width), str(row["batch_size"])


@dataclass(frozen=True)
class Setting:
    """One point of a sweep: a model (WRN width, if any) at one batch size."""

    sweep: str  # "batch" | "model"
    model: str
    batch_size: int
    width: int | None = None

    def bench_args(self) -> list[str]:
        args = ["--models", self.model, "--batch-size", str(self.batch_size)]
        return args + (["--override", f"model.width={self.width}"] if self.width else [])


def batch_sweep(model: str, batches: list[int]) -> list[Setting]:
    return [Setting("batch", model, b) for b in batches]


def model_sweep(batch: int, widths: list[int], base: str = "resnet20") -> list[Setting]:
    return [Setting("model", base, batch)] + [Setting("model", "wrn28_4", batch, w) for w in widths]


def series_of(record: dict) -> str | None:
    for name, mech, backend in SERIES:
        if record["mechanism"] == mech and (mech == "nonprivate" or record["backend"] == backend):
            return name
    return None


def rows(setting: Setting, records: list[dict]) -> list[dict]:
    """One CSV row per bench record of ``setting`` that belongs to a series."""
    out = []
    for r in records:
        name = series_of(r)
        if name is None:
            continue
        ok = r["status"] == "ok"
        out.append({
            "sweep": setting.sweep, "model": setting.model, "width": setting.width or "",
            "params": r.get("params", ""), "batch_size": setting.batch_size, "series": name,
            "mechanism": r["mechanism"], "backend": r["backend"],
            "ms_per_step": r["time_ms"] if ok else "", "min_ms": r.get("min_ms", ""),
            "max_ms": r.get("max_ms", ""), "time_ratio": r.get("time_ratio") or "",
            "peak_extra_mib": r.get("peak_extra_mib") or "",
            "status": r["status"] if ok else f"{r['status']}: {r['error']}",
            "amortized_ms": "", "amortized_ratio": "",
        })  # fmt: skip
    return out


def amortize(table: list[dict]) -> list[dict]:
    """Fill GEP tracked's amortized cost at :data:`AMORTIZE` from its slowest (refit) and
    fastest (steady) timed step, over the same setting's non-private step time."""
    base = {key_of(r): float(r["ms_per_step"]) for r in table
            if r["mechanism"] == "nonprivate" and r["ms_per_step"] not in ("", None)}  # fmt: skip
    for r in table:
        if r["mechanism"] == "gep" and r["ms_per_step"] not in ("", None) and key_of(r) in base:
            ms = (float(r["max_ms"]) + (AMORTIZE - 1) * float(r["min_ms"])) / AMORTIZE
            r.update(amortized_ms=ms, amortized_ratio=ms / base[key_of(r)])
    return table


def write_csv(path: Path, table: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS, restval="")
        w.writeheader()
        w.writerows(table)


def read_csv(path: Path) -> list[dict]:
    with path.open() as f:
        return list(csv.DictReader(f))


def _points(table: list[dict], sweep: str, series: str, x: str) -> tuple[list, list, list]:
    ms, ratio = ("amortized_ms", "amortized_ratio") if series.startswith("GEP") else (
        "ms_per_step", "time_ratio")  # fmt: skip
    pts = sorted(
        (float(r[x]), float(r[ms]), float(r[ratio]))
        for r in table
        if r["sweep"] == sweep and r["series"] == series and r.get(ms) not in ("", None)
    )
    return [p[0] for p in pts], [p[1] for p in pts], [p[2] for p in pts]


def plot(table: list[dict], path: Path, title: str = "") -> None:
    """2x2 figure: ms/step and ratio to non-private, against batch size and parameters."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    for col, (sweep, x, xlabel) in enumerate(
        [("batch", "batch_size", "batch size"), ("model", "params", "trainable parameters")]
    ):
        for name, _, _ in SERIES:
            xs, ms, ratio = _points(table, sweep, name, x)
            if not xs:
                continue
            axes[0, col].plot(xs, [m / 1e3 for m in ms], "o-", label=name)
            axes[1, col].plot(xs, ratio, "o-", label=name)
        for row in (0, 1):
            axes[row, col].set_xscale("log", base=2 if sweep == "batch" else 10)
            axes[row, col].set_xlabel(xlabel)
            axes[row, col].grid(True, alpha=0.3)
        axes[0, col].set_yscale("log")
        axes[0, col].set_ylabel("s / step")
        axes[1, col].set_ylabel("step time / non-private")
    axes[0, 0].legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
