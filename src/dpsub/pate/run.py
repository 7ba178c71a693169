"""One PATE run: teachers' votes, the noisy answers (budgeted), the student.

Files in the run dir: ``config.yaml``, ``train.log``, ``metrics.jsonl``, ``summary.json``;
``pate_state.json`` (the answered labels, the ledger and the aggregator's generator
state, written atomically every ``pate.checkpoint_every`` queries) and
``private/votes.npy`` (every teacher's label on every public query: computed from the
private data WITHOUT noise; it never leaves the machine: do not share or commit it).

Resume (``dpsub-pate resume=<run dir>``): the votes are read back, not recomputed, and
the aggregation continues from the saved query with the saved generator state. Queries
answered after the last save are replayed with the very same noise, so they get the same
answers: no query is ever answered twice with fresh noise, and privacy is spent once.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np
from omegaconf import DictConfig, OmegaConf

from dpsub.errors import ConfigError
from dpsub.pate.accounting import ORDERS, PateLedger
from dpsub.pate.aggregators import build_aggregator
from dpsub.pate.smooth import gnss_rdp
from dpsub.pate.votes import hash_partition, histograms, partition, save_private
from dpsub.rundir import private_file, private_folder

log = logging.getLogger("dpsub")
STATE = "pate_state.json"
VOTES = Path("private") / "votes.npy"
#: the data-dependent RDP of the answered queries: un-noised, private like the votes
DATA_DEPENDENT = Path("private") / "rdp_data_dependent.json"
DD_NOTE = (
    "NOT a guarantee: computed from the private votes and reported without noise; the run's "
    "epsilon is the data-independent one (pate.release=smooth_sensitivity releases it with "
    "noise instead, Papernot et al. 2018)"
)

RELEASED_NOTE = (
    "a noisy estimate, not a guarantee: the data-dependent epsilon released with smooth-"
    "sensitivity noise (its cost is in both epsilons); the run's guarantee is `epsilon`"
)


def split(cfg: DictConfig) -> tuple[DictConfig, DictConfig]:
    """(the shared config, the pate options), both checked (ConfigError)."""
    from dpsub.config import validate
    from dpsub.pate.options import check_options

    cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    pate = cfg.pop("pate")
    check_options(pate)
    validate(cfg)
    if cfg.privacy.rng != "seeded":
        raise ConfigError("privacy.rng: dpsub-pate implements only seeded noise so far")
    return cfg, pate


def claim_run_dir(config: dict, run_dir: Path, resume: bool):
    """One run per directory, one process per run: returns the function that frees the dir.

    The run dir's lock is dpsub-train's (:func:`dpsub.training.checkpoint.lock_run_dir`:
    another live process holding it is refused). Without ``resume``, a dir that already
    holds a run (``config.yaml`` or ``pate_state.json``) is refused rather than continued
    under new settings; a resume whose settings differ from the saved ones (``config.yaml``,
    and the config recorded in ``pate_state.json``) is refused as dpsub-train refuses it.
    ResumeError (one line, exit 2); a dir this call made is removed again on refusal."""
    import shutil

    from dpsub.errors import ResumeError
    from dpsub.training.checkpoint import check_resume, lock_run_dir

    saved = run_dir / "config.yaml"

    def refuse_a_taken_dir() -> None:
        if not resume and (saved.is_file() or (run_dir / STATE).is_file()):
            raise ResumeError(
                f"out_dir: {run_dir} already holds a dpsub-pate run; continue it with "
                f"`dpsub-pate resume={run_dir}` or choose another out_dir"
            )

    refuse_a_taken_dir()  # before the lock file is made: nothing is written into that dir
    fresh = not run_dir.exists()
    run_dir.mkdir(parents=True, exist_ok=True)
    unlock = lambda: None  # noqa: E731
    try:
        unlock = lock_run_dir(run_dir, "resume" if resume else "out_dir")
        refuse_a_taken_dir()  # (another process may have started one meanwhile)
        if resume and not saved.is_file():
            raise ResumeError(f"resume: {run_dir} has no config.yaml; nothing to resume")
        if resume:
            check_resume(OmegaConf.to_container(OmegaConf.load(saved)), config, None, "")
            if (run_dir / STATE).is_file():
                recorded = json.loads((run_dir / STATE).read_text()).get("config")
                if recorded is not None:  # (states saved before the config was recorded)
                    check_resume(recorded, config, None, "")
    except ConfigError:
        unlock()
        if fresh:
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    return unlock


def run_config(cfg, pate) -> dict:
    """The run's resolved config as saved in ``config.yaml`` (the pate group put back)."""
    return OmegaConf.to_container(OmegaConf.merge(cfg, {"pate": pate}), resolve=True)


def _save_state(run_dir: Path, state: dict) -> None:
    _save_json(run_dir / STATE, state)


def _save_json(path: Path, value: dict, private: bool = False) -> None:
    private_folder(path.parent, ours=True) if private else path.parent.mkdir(exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with private_file(tmp, text=True) if private else open(tmp, "w") as f:
        json.dump(value, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _save_curve(run_dir: Path, queries: int, curve) -> None:
    """The data-dependent RDP curve after ``queries`` queries, under ``private/`` (un-noised:
    a function of the votes), written before the state: the curve of the state on disk is
    kept beside it, for a kill between the two writes (the state then still says its count;
    the same kill twice at one count keeps it too)."""
    path, state = run_dir / DATA_DEPENDENT, run_dir / STATE
    on_disk = json.loads(state.read_text())["next"] if state.is_file() else None
    saved = json.loads(path.read_text()) if path.is_file() else {}
    before = {}
    for c in (saved, saved.get("before") or {}):  # (a file from before counts had none)
        if "rdp_data_dependent" in c and c.get("next", on_disk) == on_disk:
            before = {"next": on_disk, "rdp_data_dependent": c["rdp_data_dependent"]}
            break
    _save_json(path, {"next": queries, "rdp_data_dependent": curve, "before": before}, True)


def _private_curve(run_dir: Path, queries: int) -> dict:
    """The data-dependent RDP curve saved with the state at ``queries`` queries; a state
    written before it moved to ``private/`` holds it itself (ResumeError when neither of
    the two saved curves belongs to the state)."""
    from dpsub.errors import ResumeError

    path = run_dir / DATA_DEPENDENT
    saved = json.loads(path.read_text()) if path.is_file() else {}
    for curve in (saved, saved.get("before", {})):
        if curve.get("next", queries) == queries and "rdp_data_dependent" in curve:
            return {"rdp_data_dependent": curve["rdp_data_dependent"]}
    if not saved:
        return {}
    raise ResumeError(f"resume: {path} does not belong to {run_dir / STATE} ({queries} queries)")


def compute_votes(cfg, pate, pools, device, save_dir: Path | None = None) -> np.ndarray:
    from dpsub.models import build_model
    from dpsub.pate.teachers import TeacherOptions, teacher_votes

    mcfg = OmegaConf.to_container(cfg.model, resolve=True)
    name = mcfg.pop("name")

    def make_model():
        return build_model(name, pools.in_shape, pools.num_classes, **mcfg)

    seed = teacher_seed(cfg, pate)
    teacher_of = teacher_partition(pate, pools.train_x, pools.train_y, seed)
    opts = TeacherOptions(**OmegaConf.to_container(pate.teacher))
    x, y = pools.train_x.to(device), pools.train_y.to(device)
    return teacher_votes(
        make_model, x, y, teacher_of, pate.teachers, pools.public_x.to(device), seed, opts,
        cfg.train.eval_batch_size, log, save_dir,
    )  # fmt: skip


def partition_kind(pate) -> str:
    """``pate.partition``; a config saved before the key existed ran the permutation."""
    return pate.get("partition") or "permutation"


def teacher_partition(pate, x, y, seed: int) -> np.ndarray:
    """Each training example's teacher (:mod:`dpsub.pate.votes`). A teacher of the hash
    partition may get no example: it votes untrained (:mod:`dpsub.pate.teachers`); neither
    that nor the teachers' sizes is logged (counts of the private examples' hashes)."""
    if partition_kind(pate) == "permutation":
        return partition(len(y), pate.teachers, seed)
    log.info("pate: hash partition of %d examples into %d teachers", len(y), pate.teachers)
    return hash_partition(x.cpu().numpy(), y.cpu().numpy(), pate.teachers, seed)


def teacher_seed(cfg, pate) -> int:
    """The teachers' partition and initialization seed: ``pate.teacher_seed``, else ``seed``
    (a fixed teacher seed makes seeds differ only in the aggregator's noise and the student)."""
    ts = pate.get("teacher_seed")
    return int(cfg.seed if ts is None else ts)


def held_out(cfg, pate) -> int | None:
    """Training examples kept from the teachers: ``dataset.validation_size`` (a tuning run,
    evaluated on them) or ``pate.holdout`` (kept out, unused: the teachers of a final run
    then equal those of its tuning runs). They are drawn with :func:`teacher_seed`, so runs
    that share ``pate.teacher_seed`` share their teachers, from the cache or trained again.
    ConfigError when both are set and differ."""
    val, hold = cfg.dataset.get("validation_size"), pate.get("holdout")
    if val and hold and val != hold:
        raise ConfigError(f"pate.holdout: must equal dataset.validation_size ({val}), got {hold}")
    return val or hold or None


def votes_key(cfg, pate) -> str:
    """A digest of everything the teachers' votes depend on (not the aggregator, budget or
    student): runs that differ only in those share their votes through ``pate.votes_cache``."""
    import hashlib

    dataset = OmegaConf.to_container(cfg.dataset)
    dataset["validation_size"] = held_out(cfg, pate)  # the teachers' data, however held out
    features = OmegaConf.to_container(cfg.get("features") or OmegaConf.create({}))
    for where in ("cache_dir", "batch_size"):  # where and how fast, not which features
        features.pop(where, None)
    keys = {
        "dataset": dataset, "model": cfg.model, "seed": teacher_seed(cfg, pate),
        "teachers": pate.teachers, "features": features,
        "teacher": pate.teacher, "public_size": pate.public_size,
    }  # fmt: skip
    if partition_kind(pate) != "permutation":
        keys["partition"] = partition_kind(pate)
    text = json.dumps(OmegaConf.to_container(OmegaConf.create(keys)), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def votes_name(cfg, pate, pools, folder: Path) -> str:
    """The name of the votes (or of their chunks) in ``folder``: :func:`votes_key` and a
    hash of the teachers' training data and of the public queries, keyed by ``folder``'s
    own secret key, so that votes are never read for other data (another ``data.root``,
    another held-out draw, another query pool) and the name tells nothing about the data
    to whoever lacks the key."""
    import hashlib

    from dpsub.features.cache import fingerprint, secret_key

    key = secret_key(folder)
    data = "".join(fingerprint(t, key) for t in (pools.train_x, pools.train_y, pools.public_x))
    return hashlib.sha256(f"{votes_key(cfg, pate)}:{data}".encode()).hexdigest()[:24]


def load_or_compute_votes(cfg, pate, pools, device, run_dir: Path) -> np.ndarray:
    """The run's own votes if saved (resume), else the cache's, else trained teachers'
    (their chunks saved under a name of the settings and data: a run killed while its
    teachers train and resumed under an edited config never mixes two partitions)."""
    path = run_dir / VOTES
    if path.is_file():
        return np.load(path)
    folder = private_folder(Path(pate.votes_cache)) if pate.get("votes_cache") else None
    cache = folder / f"{votes_name(cfg, pate, pools, folder)}.npy" if folder else None
    if cache is not None and cache.is_file():
        votes = np.load(cache)
        log.info("pate: teachers' votes read from the cache (not retrained)")
    else:
        own = private_folder(run_dir / VOTES.parent, ours=True)
        chunks = own / f"teachers-{votes_name(cfg, pate, pools, own)}"
        votes = compute_votes(
            cfg, pate, pools, device, cache.with_suffix(".chunks") if cache else chunks
        )
        if cache is not None:
            save_private(cache, votes)
    save_private(private_folder(path.parent, ours=True) / path.name, votes)
    return votes


def answer_queries(cfg, pate, votes: np.ndarray, num_classes: int, run_dir: Path, logger) -> dict:
    """The budgeted aggregation loop, resumable from ``pate_state.json`` (which records the
    run's config: a resume under other settings is refused, :func:`claim_run_dir`)."""
    agg = build_aggregator(pate)
    hist = histograms(votes, num_classes)
    rng = np.random.default_rng(np.random.SeedSequence([cfg.seed, 0xA66]))
    state = {"next": 0, "labels": [], "done": False, "stopped_by_budget": False}
    ledger = PateLedger(cfg.privacy.delta, cfg.privacy.epsilon, rdp_reserved=reserved(pate))
    if (run_dir / STATE).is_file():
        state = json.loads((run_dir / STATE).read_text())
        curve = _private_curve(run_dir, state["next"])
        ledger = PateLedger.from_state_dict({**state["ledger"], **curve})
        rng.bit_generator.state = state["rng"]
        log.info("pate: resumed at query %d (%d answered)", state["next"], len(state["labels"]))
    last = min(len(hist), pate.max_queries or len(hist))

    def save(done: bool) -> None:
        public = ledger.state_dict()  # its data-dependent curve: a function of the votes
        _save_curve(run_dir, state["next"], public.pop("rdp_data_dependent"))
        state.update(done=done, ledger=public, rng=rng.bit_generator.state,
                     config=run_config(cfg, pate))  # fmt: skip
        _save_state(run_dir, state)
        logger.log({"queries": ledger.queries, "answered": ledger.answered,
                    "epsilon": ledger.epsilon()}, ledger.queries)  # fmt: skip

    while not state["done"] and state["next"] < last:
        if not ledger.can_ask(agg.worst_case()):
            state["stopped_by_budget"] = True
            break
        i = state["next"]
        ans = agg(hist[i], rng)
        ledger.record(ans.records, hist[i], ans.label is not None)
        if ans.label is not None:
            state["labels"].append([i, ans.label])
        state["next"] = i + 1
        if state["next"] % pate.checkpoint_every == 0:
            save(done=False)
    if not state["done"]:
        if pate.get("release"):  # after the last query, before the state says done
            state["release"] = release_data_dependent(cfg, pate, hist, state, ledger)
        save(done=True)
    return {**state, "ledger": ledger}


def reserved(pate) -> np.ndarray:
    """The RDP curve of the releases made after the queries (charged from the start)."""
    if not pate.get("release"):
        return np.zeros(len(ORDERS))
    ss = pate.smooth_sensitivity
    return gnss_rdp(float(ss.beta), float(ss.sigma), ORDERS)


def check_release(pate, num_classes: int) -> None:
    """ConfigError when the release's analysis does not hold for this run (the data-dependent
    bound must be monotone in q at the release's order: :func:`dpsub.pate.smooth.bound_grid`)."""
    from dpsub.pate.smooth import bound_grid

    if not pate.get("release"):
        return
    try:
        bound_grid(float(pate.sigma2), float(pate.smooth_sensitivity.order), num_classes,
                   pate.teachers)  # fmt: skip
    except ValueError as e:
        raise ConfigError(f"pate.smooth_sensitivity.order: {e}") from None


def release_data_dependent(cfg, pate, hist, state, ledger) -> dict:
    """The smooth-sensitivity release of the data-dependent cost (:mod:`dpsub.pate.smooth`),
    with its own seeded noise (a resumed run draws the same); only public values return."""
    from dpsub.pate.smooth import release

    order = float(pate.smooth_sensitivity.order)
    at = int(np.argmin(np.abs(ORDERS - order)))
    answered = np.array([i for i, _ in state["labels"]], dtype=np.int64)
    sigma2 = float(pate.sigma2)
    # the cost is the data-independent total less up to order / sigma2^2 per answered query
    highest = float(ledger.rdp[at])
    lowest = highest - len(answered) * order / sigma2**2
    rng = np.random.default_rng(np.random.SeedSequence([cfg.seed, 0x55E]))
    out = release(
        hist[answered], pate.teachers, float(ledger.rdp_data_dependent[at]), (lowest, highest),
        sigma2, pate.smooth_sensitivity, cfg.privacy.delta, rng,
    )  # fmt: skip
    return out.as_dict()
