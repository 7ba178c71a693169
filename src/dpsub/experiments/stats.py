"""Statistics every results table uses: mean ± std, a 95% t-interval, a Welch test.

A cell of a results table is the metric over seeds. ``summarize(values)`` gives its mean,
sample std and the 95% Student-t interval of the mean; ``compare(a, b)`` is the two-sided
Welch t-test of two cells (unequal variances), the 95% Welch-Satterthwaite interval of
their difference and the mark a table prints beside the second: ``>``/``<`` when the
difference is significant at ``ALPHA`` (0.05), ``≈`` (a tie) when it is not, ``n/a`` with
fewer than two seeds on either side (no test possible). The interval is what a tie is read
by: one that reaches differences as large as those in question makes the tie inconclusive
(too few seeds), not evidence of no difference.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

__all__ = [
    "ALPHA", "Comparison", "Gains", "Summary", "compare", "difference_of_gains", "paired",
    "summarize", "welch",
]  # fmt: skip

ALPHA = 0.05
LEVEL = 0.95
TIE = "≈"


@dataclass(frozen=True)
class Summary:
    n: int
    mean: float
    std: float  # sample std (0 for one value)
    lo: float  # 95% t-interval of the mean (nan for fewer than two values)
    hi: float

    def text(self, digits: int = 2) -> str:
        """``mean ± std [lo, hi] (n)``; the mean and ``(1)`` for one seed; ``–`` for none."""
        if self.n == 0:
            return "–"
        if self.n == 1:
            return f"{self.mean:.{digits}f} (1)"
        f = f".{digits}f"
        return f"{self.mean:{f}} ± {self.std:{f}} [{self.lo:{f}}, {self.hi:{f}}] ({self.n})"


def summarize(values: list[float], level: float = LEVEL) -> Summary:
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    n = len(vals)
    if n == 0:
        return Summary(0, math.nan, math.nan, math.nan, math.nan)
    mean = statistics.fmean(vals)
    if n == 1:
        return Summary(1, mean, 0.0, math.nan, math.nan)
    from scipy import stats

    std = statistics.stdev(vals)
    half = stats.t.ppf(0.5 + level / 2, n - 1) * std / math.sqrt(n)
    return Summary(n, mean, std, mean - half, mean + half)


@dataclass(frozen=True)
class Comparison:
    diff: float  # mean(b) - mean(a)
    p: float  # two-sided Welch p-value (nan when no test is possible)
    mark: str  # ">" b significantly above a, "<" below, "≈" no significant difference, "n/a"
    lo: float = math.nan  # the 95% interval of the difference (nan when no test is possible)
    hi: float = math.nan

    @property
    def significant(self) -> bool:
        return self.mark in (">", "<")

    def diff_text(self) -> str:
        """``+1.23 [-0.45, +2.91]``: the difference and its 95% interval (only the
        difference when no test is possible)."""
        if math.isnan(self.lo):
            return f"{self.diff:+.2f}"
        return f"{self.diff:+.2f} [{self.lo:+.2f}, {self.hi:+.2f}]"

    def text(self) -> str:
        if self.mark == "n/a":
            return f"{self.diff:+.2f} (n/a: < 2 seeds)"
        if self.significant:
            return f"{self.diff_text()} {self.mark} (p={self.p:.2g})"
        return f"{self.diff_text()} {TIE} (p={self.p:.2g}, not significant)"


def _marked(diff: float, p: float, lo: float, hi: float, alpha: float) -> Comparison:
    mark = (">" if diff > 0 else "<") if p < alpha else TIE
    return Comparison(diff, p, mark, lo, hi)


def welch(diff: float, cells: list[Summary], level: float = LEVEL) -> tuple[float, float, float]:
    """``(lo, hi, p)`` for ``diff``, a signed sum of independent cell means: its ``level``
    interval and two-sided p from the standard error sqrt(sum s_i^2 / n_i) and Welch-
    Satterthwaite degrees of freedom. Every cell needs two values; without any spread the
    interval is the point and p is 1 (``diff`` 0) or 0."""
    parts = [c.std**2 / c.n for c in cells]
    se = math.sqrt(sum(parts))
    if se == 0:  # identical repeats: the t statistic is undefined
        return diff, diff, 1.0 if diff == 0 else 0.0
    from scipy import stats

    df = sum(parts) ** 2 / sum(v**2 / (c.n - 1) for v, c in zip(parts, cells, strict=True))
    half = float(stats.t.ppf(0.5 + level / 2, df)) * se
    return diff - half, diff + half, float(2 * stats.t.sf(abs(diff) / se, df))


def compare(a: list[float], b: list[float], alpha: float = ALPHA) -> Comparison:
    """Two-sided Welch t-test of ``b`` against ``a``, with the 95% interval of the difference."""
    sa, sb = summarize(a), summarize(b)
    diff = sb.mean - sa.mean
    if sa.n < 2 or sb.n < 2:
        return Comparison(diff, math.nan, "n/a")
    lo, hi, p = welch(diff, [sa, sb])
    return _marked(diff, p, lo, hi, alpha)


def paired(a: list[float], b: list[float], alpha: float = ALPHA) -> Comparison:
    """Two-sided paired t-test of ``b`` against ``a``: the same runs measured two ways (e.g.
    their averaged and their raw weights), value i of each from run i."""
    d = summarize([float(y) - float(x) for x, y in zip(a, b, strict=True)])
    if d.n < 2:
        return Comparison(d.mean, math.nan, "n/a")
    if d.std == 0:  # the same difference in every run: t undefined
        return _marked(d.mean, 1.0 if d.mean == 0 else 0.0, d.mean, d.mean, alpha)
    from scipy import stats

    p = float(stats.ttest_rel(b, a).pvalue)
    return _marked(d.mean, p, d.lo, d.hi, alpha)


@dataclass(frozen=True)
class Gains:
    diff: float  # (mean(a1) - mean(a0)) - (mean(b1) - mean(b0))
    lo: float  # its 95% Welch-Satterthwaite interval
    hi: float
    p: float  # two-sided; nan with fewer than two values in a cell

    def verdict(self, gain_a: float, gain_b: float, alpha: float = ALPHA) -> str:
        """Arm a against arm b: "gains more" / "gains less" at p < alpha; otherwise
        "inconclusive" where the interval is wider than the smaller of the two gains (it
        cannot tell a gain from none), else "no significant difference in gains"."""
        if math.isnan(self.p):
            return "n/a (< 2 seeds in a cell)"
        if self.p < alpha:
            return "gains more" if self.diff > 0 else "gains less"
        if self.hi - self.lo > min(gain_a, gain_b):
            return "inconclusive"
        return "no significant difference in gains"


def difference_of_gains(a1, a0, b1, b0, level: float = LEVEL) -> Gains:
    """Does arm a gain more from a change (0 -> 1) than arm b? The difference of the two
    gains over four independent cells, its standard error sqrt(sum s_i^2 / n_i) and
    Welch-Satterthwaite degrees of freedom (unequal variances, as :func:`compare`)."""
    cells = [summarize(c) for c in (a1, a0, b1, b0)]
    diff = (cells[0].mean - cells[1].mean) - (cells[2].mean - cells[3].mean)
    if any(c.n < 2 for c in cells):
        return Gains(diff, math.nan, math.nan, math.nan)
    return Gains(diff, *welch(diff, cells, level))
