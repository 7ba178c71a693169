"""Committed runs recomputed from their saved config, shared by the integration and e2e
suites: the noise multiplier and epsilon exactly (PRV epsilons to 1e-12 relative, PRV_REL;
through the library: N from the data, the plan, the ledger).

The epsilon of a run resumed from a checkpoint is the ledger reloaded there (its RDP curve
summed per phase, not per step: the last digits differ), so a run matches if it matches
without a resume, or with one at one of its periodic checkpoints or at a step its train.log
says it was resumed at (a run stopped by a signal checkpoints where it stands).
"""

from __future__ import annotations

import json
import math
import re

from dpsub.config import validate
from dpsub.mechanisms import build_mechanism
from dpsub.privacy import PrivacyAccount, PrivacyLedger, simulate
from dpsub.rundir import RunDir, find_runs
from dpsub.training.build import plan_steps, private_data
from dpsub.training.checkpoint import ADDED_LATER

from conftest import REPO, SHARED

#: two cheap MNIST runs (DP-SGD, 275 steps of B=1000, the second resumed at step 100)
CHEAP = [
    REPO / "results/tables/gep1-mnist/cpu/tune/mechanism=dpsgd,epsilon=2,lr=0.1,clip=1",
    REPO / "results/tables/gep1-mnist/cpu/tune/mechanism=dpsgd,epsilon=2,lr=0.1,clip=0",
]


def training_runs() -> list[RunDir]:
    """Every committed run of ``dpsub-train`` (not audits, PATE or benchmarks)."""
    out = []
    for r in find_runs(REPO / "results"):
        cfg = r.config()
        if "train" in cfg and "mechanism" in cfg and not {"audit", "pate"} & set(cfg):
            out.append(r)
    return out


#: PRV's epsilon goes through numpy FFTs whose last bits depend on the CPU: the same plan gave
#: 0.09326237017674453 on the machine that made the gep-a3-cifar10 epsilon-0.1 runs and
#: 0.09326237017674392 on a 2026-11-29 Intel Xeon (a 6.5e-15 relative difference). A PRV
#: run matches within this (RDP's epsilons reproduce to the bit on both machines).
PRV_REL = 1e-12


def _ledger_epsilon(acct, steps: int, resume_at: int | None) -> float:
    """The honest epsilon after ``steps`` steps charged as the trainer charges them."""
    ledger = PrivacyLedger(acct.ledger.delta, acct.ledger.accountant)
    for t in range(steps):
        ledger.step(acct.multiplier(t), acct.q)
        if t + 1 == resume_at:
            ledger = PrivacyLedger.from_state_dict(ledger.state_dict())
    return ledger.epsilon()


def resumed_at(run: RunDir) -> list[int]:
    """The steps a run's train.log says it was resumed at."""
    log = run.file("train.log")
    text = log.read_text(errors="replace") if log.is_file() else ""
    return [int(m) for m in re.findall(r"\bresumed \S+ at step (\d+)", text)]


def _simulated(sim, summary: dict) -> str | None:
    """A simulated noise level (``privacy.simulate``) must be labelled as one, and its
    multiplier must put the reference's noise on the mean gradient: z_ref * b / B_ref,
    computed here from the recomputed reference, not read from the library's Simulation."""
    if sim is None:
        return "an unsimulated run marked simulated" if summary.get("simulated") else None
    if summary.get("covered_by_epsilon") is not False or not summary.get("simulated"):
        return "a simulated run not marked simulated / not covered"
    z_run = sim.noise_multiplier_ref * sim.run_batch_size / sim.batch_size
    if not math.isclose(z_run, float(summary["noise_multiplier"]), rel_tol=1e-12):
        return f"simulated multiplier {z_run!r} != {summary['noise_multiplier']!r}"
    return None


def account_of(s, n: int):
    """``(steps, mechanism, simulation, PrivacyAccount)`` of a run of settings ``s`` over ``n``
    private examples, opened from the config as the trainer opens it."""
    _, steps = plan_steps(s, n)
    mech = build_mechanism(s.mechanism_name, s.mechanism)
    p = s.privacy
    sim = simulate.reference(
        p.simulate, batch_size=s.train.batch_size, n=n, steps=steps, phases_of=mech.phases,
        epsilon=p.epsilon, delta=p.delta, accountant=p.accountant,
    )  # fmt: skip
    acct = PrivacyAccount.open(
        n=n, batch_size=s.train.batch_size, steps=steps,
        phases=mech.phases(steps) if mech.private else None, policy=mech.accounting,
        epsilon=p.epsilon, delta=p.delta, accountant=p.accountant,
        noise_multiplier=p.noise_multiplier, simulation=sim if mech.private else None,
    )  # fmt: skip
    return steps, mech, sim, acct


def stepped_rdp(acct, steps: int):
    """The RDP curve of ``steps`` steps charged one at a time, as the trainer charges them
    (not the plan's own curve)."""
    ledger = PrivacyLedger(acct.ledger.delta, acct.ledger.accountant)
    for t in range(steps):
        ledger.step(acct.multiplier(t), acct.q)
    return ledger.rdp()


def check_run(run: RunDir, cache: dict) -> str | None:
    """None if the run's z and epsilon reproduce exactly, else why not; 'skip: ...' if its
    data is not on this machine."""
    cfg = run.config_on(SHARED)
    if "aux" in cfg and cfg.aux.get("name") == "public_train" and "pick" not in cfg.aux:
        cfg.aux.pick = ADDED_LATER["aux.pick"]  # a run made before the key: its old pick
    s = validate(cfg)
    summary = run.summary()
    key = json.dumps([run.config_dict()["dataset"], s.aux, s.seed])
    if key not in cache:
        try:
            cache[key] = len(private_data(s)[1].train_y)
        except Exception as e:  # noqa: BLE001 -- data absent here (DatasetNotFoundError)
            cache[key] = f"skip: {type(e).__name__}"
    n = cache[key]
    if isinstance(n, str):
        return n
    steps, mech, sim, acct = account_of(s, n)
    if (why := _simulated(sim, summary)) is not None:
        return why
    if steps != summary["planned_steps"]:
        return f"planned steps {steps} != {summary['planned_steps']}"
    if acct.z != float(summary["noise_multiplier"]):
        return f"noise multiplier {acct.z!r} != {summary['noise_multiplier']!r}"
    if not mech.private:
        return None if math.isinf(float(summary["epsilon"])) else "non-private with an epsilon"
    if acct.policy != "planned":
        return None  # measured noise: the multiplier each step drew is not in the config
    every = s.train.checkpoint_every or steps
    resumes = [None, *range(every, summary["steps"], every), *resumed_at(run)]
    got = [_ledger_epsilon(acct, summary["steps"], r) for r in resumes]
    rel = PRV_REL if s.privacy.accountant == "prv" else 0.0
    same = any(abs(g - summary["epsilon"]) <= rel * g for g in got)
    return None if same else f"epsilon {got[0]!r} != {summary['epsilon']!r}"
