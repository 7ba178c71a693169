"""dpsub.experiments.stats and the marks make_table prints: a known difference is significant, none is a tie."""

from __future__ import annotations

import math
import random

import pytest

from dpsub.experiments import stats


def seeds(mean: float, n: int = 5, spread: float = 0.3, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    return [mean + rng.gauss(0, spread) for _ in range(n)]


def test_a_known_difference_is_marked_significant_in_its_direction():
    gp = seeds(90.0, seed=1)
    assert stats.compare(gp, seeds(95.0, seed=2)).mark == ">"
    assert stats.compare(gp, seeds(85.0, seed=3)).mark == "<"
    assert stats.compare(gp, seeds(95.0, seed=2)).p < 1e-4


@pytest.mark.parametrize("seed", range(5))
def test_no_difference_is_a_tie(seed):
    # same distribution; three seeds each: the marks a table of three seeds would print
    c = stats.compare(seeds(90.0, n=3, seed=seed), seeds(90.0, n=3, seed=seed + 100))
    assert c.mark == stats.TIE and not c.significant, c
    assert "not significant" in c.text()


def test_welch_p_value_is_scipys_and_the_interval_is_the_t_interval():
    a, b = [90.1, 91.3, 89.8], [92.0, 93.1, 92.6]
    from scipy import stats as st

    assert stats.compare(a, b).p == pytest.approx(st.ttest_ind(b, a, equal_var=False).pvalue)
    s = stats.summarize(b)
    half = st.t.ppf(0.975, 2) * s.std / math.sqrt(3)
    assert (s.lo, s.hi) == pytest.approx((s.mean - half, s.mean + half))
    assert s.text() == f"92.57 ± 0.55 [{s.lo:.2f}, {s.hi:.2f}] (3)"


def test_one_seed_is_no_test_and_no_interval():
    assert stats.compare([90.0], [95.0, 96.0]).mark == "n/a"
    assert stats.summarize([90.0]).text() == "90.00 (1)"
    assert stats.summarize([]).text() == "–"
    assert stats.compare([1.0, 1.0], [1.0, 1.0]).mark == stats.TIE  # identical repeats


def test_make_table_marks_cells_against_gp(monkeypatch):
    """The rendered cells carry the interval and the mark beside every non-GP mechanism."""

    from dpsub.experiments import make_table

    class T:  # the bits of a Table cell_text reads
        metric = "test_accuracy"
        baseline = ("mechanism", "dpsgd")  # every cell against GP (the default)

        @staticmethod
        def paper_cell(cell):
            return {"value": 95.0}

    vals = {"dpsgd": seeds(90, n=3, seed=7), "gep": seeds(96, n=3, seed=8)}
    vals["bgep"] = seeds(90, n=3, seed=9)
    monkeypatch.setattr(make_table, "cell_values", lambda t, f, v, cell: vals[cell["mechanism"]])
    gep = make_table.cell_text(T, {}, "paper", {"mechanism": "gep", "epsilon": 2})
    bgep = make_table.cell_text(T, {}, "paper", {"mechanism": "bgep", "epsilon": 2})
    gp = make_table.cell_text(T, {}, "paper", {"mechanism": "dpsgd", "epsilon": 2})
    assert "[" in gep[0] and gep[0].endswith("(3)")
    assert " > (p=" in gep[3]
    assert f" {stats.TIE} (p=" in bgep[3] and "not significant" in bgep[3]
    assert gp[3] == "–"


def test_make_table_verdict_says_reverses_agrees_and_not_significant(monkeypatch):
    """The verdict under a rendered table: each row against GP per column, with the paper's
    ordering; a row with one seed says nothing."""

    from dpsub.experiments import make_table

    paper = {"dpsgd": 50.0, "gep": 60.0, "bgep": 55.0, "rgp": 52.0}

    class T:  # the bits of a Table verdict_lines reads
        metric, baseline, axes = "test_accuracy", ("mechanism", "dpsgd"), ["mechanism", "epsilon"]
        layout = {"columns": "epsilon"}

        @staticmethod
        def cells(setting):
            return [{"mechanism": m, "epsilon": 8} for m in paper]

        @staticmethod
        def axes_of(setting):
            return {"mechanism": list(paper), "epsilon": [8]}

        @staticmethod
        def paper_cell(cell):
            return {"value": paper[cell["mechanism"]]}

        @staticmethod
        def label(axis, value):
            return "GP (DP-SGD)" if value == "dpsgd" else f"{axis}={value}"

    vals = {"dpsgd": seeds(90, n=3, seed=7), "gep": seeds(80, n=3, seed=8), "rgp": [95.0]}
    vals["bgep"] = seeds(96, n=3, seed=9)
    found = {"paper": {}, "tuned": {"x": []}}
    monkeypatch.setattr(
        make_table, "cell_values", lambda t, f, v, cell: vals[cell["mechanism"]] if f[v] else []
    )
    head, _, line, _ = make_table.verdict_lines(T, found, "paper")
    assert "Welch" in head and line.startswith("- epsilon=8, tuned: ")
    gep, bgep = line.split("; mechanism=")[:2]
    assert (
        "mechanism=gep below GP (" in gep
        and "paper +10.0: **the ordering reverses in this setting**" in gep
    )
    assert bgep.startswith("bgep above GP (") and "paper +5.0: as in the paper" in bgep
    assert "rgp" not in line  # one seed: no test
    vals["bgep"] = seeds(90, n=3, seed=10)
    assert "mechanism=bgep - GP **not significant** (" in make_table.verdict_lines(T, found, "")[2]
    # a baseline that is a column (GEP Table 6: m = 2000) names the column in each row
    T.baseline, T.cells = (
        ("epsilon", 8),
        staticmethod(lambda s: [{"mechanism": "gep", "epsilon": 2}]),
    )
    vals = {2: seeds(80, n=3, seed=1), 8: seeds(90, n=3, seed=2)}
    monkeypatch.setattr(
        make_table, "cell_values", lambda t, f, v, cell: vals[cell["epsilon"]] if f[v] else []
    )
    line = make_table.verdict_lines(T, found, "")[2]
    assert line.startswith("- tuned: mechanism=gep, epsilon=2 below epsilon=8 (")


def test_the_difference_of_gains_reduces_to_welch_when_one_arm_is_constant():
    """With arm b's two cells without spread, the test is Welch's on a's two cells shifted
    by b's gain; a gain twice as large in a is found, an equal one is not."""
    import scipy.stats

    a1, a0 = [60.0, 61.5, 59.0], [50.0, 51.0, 49.5]
    b1, b0 = [55.0, 55.0, 55.0], [50.0, 50.0, 50.0]
    g = stats.difference_of_gains(a1, a0, b1, b0)
    welch = scipy.stats.ttest_ind(a1, [v + 5 for v in a0], equal_var=False)
    assert g.diff == pytest.approx((sum(a1) - sum(a0)) / 3 - 5)
    assert g.p == pytest.approx(welch.pvalue) and g.p < 0.05 and g.lo > 0
    same = stats.difference_of_gains(a1, a0, [v + 5 for v in a1], [v + 5 for v in a0])
    assert same.diff == pytest.approx(0) and same.p > 0.5 and same.lo < 0 < same.hi
    assert math.isnan(stats.difference_of_gains([1.0], a0, b1, b0).p)


def test_the_paired_test_is_scipys_on_the_same_runs():
    import scipy.stats

    raw, avg = [40.0, 42.0, 41.0], [41.5, 43.0, 42.9]
    c = stats.paired(raw, avg)
    assert c.diff == pytest.approx(1.4666666) and c.mark == ">"
    assert c.p == pytest.approx(scipy.stats.ttest_rel(avg, raw).pvalue)
    assert stats.paired(raw, raw).mark == stats.TIE and stats.paired([1.0], [2.0]).mark == "n/a"


def test_the_gains_verdict_follows_the_rule_fixed_before_the_runs():
    """issue 42's rule: significant -> more / less; else inconclusive where the interval is
    wider than the smaller gain; else no significant difference."""
    G = stats.Gains
    assert G(3.0, 1.0, 5.0, 0.01).verdict(4.0, 1.0) == "gains more"
    assert G(-3.0, -5.0, -1.0, 0.01).verdict(1.0, 4.0) == "gains less"
    assert G(0.5, -1.0, 2.0, 0.4).verdict(5.0, 4.5) == "no significant difference in gains"
    assert G(0.5, -1.0, 2.0, 0.4).verdict(5.0, 2.5) == "inconclusive"
    assert G(0.5, math.nan, math.nan, math.nan).verdict(1.0, 1.0).startswith("n/a")


def test_the_interval_of_a_difference_is_welchs_and_agrees_with_its_test():
    """compare's interval is scipy's Welch interval of mean(b) - mean(a); paired's is the
    t-interval of the mean paired difference; each excludes 0 exactly when the test is
    significant, and the table text carries it."""
    from scipy import stats as st

    a, b = [90.1, 91.3, 89.8], [92.0, 93.1, 92.6, 91.7]
    c = stats.compare(a, b)
    ci = st.ttest_ind(b, a, equal_var=False).confidence_interval(0.95)
    assert (c.lo, c.hi) == pytest.approx((ci.low, ci.high))
    assert c.text() == f"{c.diff:+.2f} [{c.lo:+.2f}, {c.hi:+.2f}] > (p={c.p:.2g})"
    r = st.ttest_rel([92.0, 93.1, 92.6], a).confidence_interval(0.95)
    d = stats.paired(a, [92.0, 93.1, 92.6])
    assert (d.lo, d.hi) == pytest.approx((r.low, r.high))
    for seed in range(20):  # the interval and the test never disagree
        x, y = seeds(90.0, n=3, seed=seed), seeds(90.6, n=3, seed=seed + 50)
        c = stats.compare(x, y)
        assert c.significant == (not c.lo <= 0 <= c.hi), c
    assert stats.compare([90.0], [91.0, 92.0]).diff_text() == "+1.50"  # no test: no interval
    same = stats.compare([1.0, 1.0], [2.0, 2.0])  # no spread: a point interval
    assert (same.lo, same.hi, same.mark) == (1.0, 1.0, ">")
