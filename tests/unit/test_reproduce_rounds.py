"""``dpsub-reproduce --tune`` runs a grid's edge extensions before any pick trains."""

from __future__ import annotations

from types import SimpleNamespace

from dpsub.experiments import reproduce


class FakeJob:
    def __init__(self, name: str):
        self.dir, self.finished = name, False


def test_extension_rounds_run_before_the_picks(monkeypatch):
    """Tuning finds its best point at an edge twice (two rounds of extension jobs); the
    picks are trained only after both rounds, and a failed job is launched once."""
    grid = [FakeJob("tune/lr=0.5"), FakeJob("tune/lr=1")]
    rounds = [[FakeJob("tune/lr=2")], [FakeJob("tune/lr=4"), FakeJob("tune/broken")]]
    pick = FakeJob("tuned/lr=4")  # phase 2: trained by main() after run_tuning
    launched: list[list[str]] = []

    def plan(args, table):  # an edge pick adds the next round once the last one finished
        known = list(grid)
        for new in rounds:
            if not all(j.finished for j in known):
                break
            known += new
        return known, [pick], {}

    def run_phase(jobs, args, hydra_ov, label):
        launched.append([j.dir for j in jobs if not j.finished])
        for j in jobs:
            j.finished = j.dir != "tune/broken"

    monkeypatch.setattr(reproduce, "plan", plan)
    monkeypatch.setattr(reproduce, "run_phase", run_phase)
    args = SimpleNamespace(tune=True)
    reproduce.run_tuning(grid, args, None, [])
    assert launched == [["tune/lr=0.5", "tune/lr=1"], ["tune/lr=2"], ["tune/lr=4", "tune/broken"]]
    assert not pick.finished
