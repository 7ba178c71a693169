"""Checkpoints, and the rules for continuing a run from one.

A checkpoint holds the model, optimizer and schedule, the step, the privacy
ledger(s), the mechanism's state, the seeded random generators, the run's resolved
config and a fingerprint of its private training set: an HMAC under a random key kept
beside it (``fingerprint.key``), so that a checkpoint shared without that file says nothing
about the data (a plain hash would let anyone holding all candidate datasets but one
example's test which example it was).

Resuming (``privacy.rng=seeded``, the research mode): every generator is restored,
so the steps between the last checkpoint and a crash are *replayed* with the same
batches and the same noise: they release nothing new, and the ledger (from the
checkpoint) counts each step once. This is only sound if the replayed steps compute
the same thing, so a resume must keep every setting that can change a release
(:data:`RESUME_MAY_CHANGE` lists the few that cannot) and the same training data.

Resuming in ``privacy.rng=secure`` mode: the noise and sampling streams are secret and
not saved, so the steps after the checkpoint are drawn afresh: new releases. The
ledger is then the one persisted before every release (``ledger.json``), which has
counted every step that ever ran: a crash may over-count a step, never under-count.

One process per run dir: the training process holds an exclusive lock on
``<run_dir>/.lock`` (``fcntl.flock``, POSIX) from before it reads the checkpoint until
it ends; a second run or resume of the same dir meanwhile fails with one line naming
the holder's pid (two writers would interleave checkpoints and, in secure mode, the
ledger, which could then count fewer releases than were made). The kernel releases the
lock when the process ends, also on ``kill -9``.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dpsub.errors import ResumeError, RunDirInUse
from dpsub.rundir import CHECKPOINT, FINGERPRINT_KEY, LEDGER, owner_only_tmp

if TYPE_CHECKING:  # torch and the accountant are imported where used: resume checks stay light
    import torch

    from dpsub.privacy import PrivacyLedger

CKPT_NAME = CHECKPOINT
LEDGER_NAME = LEDGER
LOCK_NAME = ".lock"

#: Config keys a resume may change: they cannot change what a step releases or how it is
#: accounted (where things are logged and how often, progress display, W&B settings).
RESUME_MAY_CHANGE = (
    "resume",
    "out_dir",
    "run_name",
    "data.root",  # the training data itself is checked by its fingerprint
    "data.download",
    "features.cache_dir",  # where extracted features are kept, by a key of their inputs
    "train.eval_every",
    "train.eval_batch_size",
    "train.ema_eval",  # what is evaluated, not what is trained
    "train.log_every",
    "train.checkpoint_every",
    "train.progress",
    # how a batch's per-example work is cut into passes, never what is released (the GPU kit
    # runs cells at grads.microbatch=auto; a CPU harness must not set them aside as stale)
    "grads.microbatch",
    "logger",
    "eval",  # evaluations after training read the model; they release nothing of the run
)


def save_checkpoint(run_dir: Path, state: dict) -> Path:
    """Atomic write (tmp file + rename): a kill during saving keeps the last good one."""
    return save_checkpoint_as(Path(run_dir) / CKPT_NAME, state)


def light_copy(src: Path, dest: Path) -> list[str]:
    """Write to ``dest`` the checkpoint ``src`` without its recomputable state; what it left out.

    Recomputable: what the checkpoint's ``recomputable`` lists (``Mechanism.recomputable``:
    computed from public data and the public generator only, such as GEP's basis, 360 MB at
    k = 1,000 on ResNet20). Only a checkpoint written at a clean stop qualifies: no step ran
    after it, so no step is replayed with a recomputed (different) subspace, and the resumed
    run draws no noise it drew before. Its epsilon is unchanged; its trajectory is not that
    of an uninterrupted run from there on (the run records the resume: ``light_resumes``).
    Returns ``[]`` (and writes nothing) when there is nothing to leave out or the checkpoint
    is not clean.
    """
    import torch

    ckpt = torch.load(src, map_location="cpu", weights_only=False, mmap=True)
    state = ckpt["state"]
    dropped = [k for k in state.get("recomputable", []) if _get(state, k) is not None]
    if not dropped or not state.get("clean", False):
        return []
    for key in dropped:
        parent, _, leaf = key.rpartition(".")
        _get(state, parent)[leaf] = None
    state["dropped"] = dropped
    save_checkpoint_as(Path(dest), ckpt)
    return dropped


def checkpoint_is_clean(path: Path) -> bool:
    """Whether the checkpoint at ``path`` was written at a clean stop (read lazily: mmap)."""
    import torch

    ckpt = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    return bool(ckpt.get("state", {}).get("clean", False))


def _get(d: dict, dotted: str) -> Any:
    for part in dotted.split(".") if dotted else []:
        d = d.get(part) if isinstance(d, dict) else None
    return d


def save_checkpoint_as(path: Path, state: dict) -> Path:
    """:func:`save_checkpoint` to a named file."""
    import torch

    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)
    return path


def lock_run_dir(run_dir: Path, key: str) -> Callable[[], None]:
    """Take the run dir's exclusive lock for this process; returns the function that frees it.

    ``key`` (``out_dir`` or ``resume``) starts the error's one line (RunDirInUse, a
    ConfigError: exit 2) when another process holds the lock. Where ``fcntl`` does not
    exist (Windows) there is no lock.
    """
    try:
        import fcntl
    except ImportError:
        return lambda: None
    fd = os.open(Path(run_dir) / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise RunDirInUse(
            f"{key}: {run_dir} is in use by another process (pid {holder}); wait for it to "
            "end or stop it, then try again"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    held = [fd]

    def release() -> None:
        if held:
            os.close(held.pop())  # closing the only descriptor releases the flock

    return release


def load_checkpoint(run_dir: Path, map_location="cpu") -> dict | None:
    import torch

    path = Path(run_dir) / CKPT_NAME
    if not path.exists():
        return None
    return torch.load(path, map_location=map_location, weights_only=False)


def data_fingerprint(x: torch.Tensor, y: torch.Tensor, key: bytes | None = None) -> str:
    """The private training set as trained on (shape, pixels, labels): HMAC-SHA256 under
    the run's secret ``key`` (:func:`fingerprint_key`); without one the plain SHA-256 that
    checkpoints held before 2026-11-29 (they are still checked against it)."""
    h = hmac.new(key, digestmod=hashlib.sha256) if key is not None else hashlib.sha256()
    h.update(repr((tuple(x.shape), tuple(y.shape))).encode())
    h.update(x.detach().cpu().contiguous().numpy().tobytes())
    h.update(y.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def fingerprint_key(run_dir: Path, create: bool = False) -> bytes | None:
    """The run's secret fingerprint key (``<run_dir>/fingerprint.key``); None when absent,
    unless ``create``: then 32 random bytes from the OS, written (owner-only) first."""
    path = Path(run_dir) / FINGERPRINT_KEY
    if path.is_file():
        return bytes.fromhex(path.read_text().strip())
    if not create:
        return None
    key = secrets.token_bytes(32)
    os.replace(owner_only_tmp(path, (key.hex() + "\n").encode()), path)
    return key


def key_of(ckpt: dict | None, run_dir: Path) -> bytes | None:
    """The key a checkpoint's fingerprint was made with: the run's, or None for a plain
    SHA-256 (a checkpoint from before the keys, even with a key file a crash left beside
    it) and for no checkpoint."""
    keyed = ckpt is not None and ckpt.get("data_fingerprint_keyed")
    return fingerprint_key(run_dir) if keyed else None


def fingerprint_matches(ckpt: dict, run_dir: Path, x, y) -> bool | None:
    """Whether the checkpoint's fingerprint is that of ``(x, y)``; None when it cannot say
    (no fingerprint, or a keyed one whose key file is not beside it)."""
    saved, key = ckpt.get("data_fingerprint"), key_of(ckpt, run_dir)
    if saved is None or (ckpt.get("data_fingerprint_keyed") and key is None):
        return None
    return hmac.compare_digest(saved, data_fingerprint(x, y, key))


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(d, dict):
        return {prefix: d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def may_change(key: str) -> bool:
    return any(key == k or key.startswith(k + ".") for k in RESUME_MAY_CHANGE)


#: A key that a later version of dpsub added is "off" by default (null or false): a config
#: saved before it existed and one that leaves it off are the same setting.
_OFF = (None, False)

#: Keys added later whose default is not "off", each with the value that every run made
#: before the key existed behaved as (mostly its declared default; GEP's residual was formed,
#: not book-kept, before ``residual`` existed). A config saved without the key equals one
#: holding this value and differs from any other. A key added with a default outside ``_OFF``
#: must be listed here, or every run made before it counts as changed: stale to the table
#: harness, refused on resume (tests/unit/test_added_later.py checks the committed runs).
ADDED_LATER: dict[str, Any] = {
    "dataset.validation_pick": "balanced",
    "train.augmult": 1,
    "privacy.rng": "seeded",
    "mechanism.refresh_every": 0,
    "mechanism.residual": "materialize",
    "mechanism.head": "reparam",
    "mechanism.head_scale": 1.0,
    "mechanism.anchor_precision": "fp32",
    "mechanism.diagnostics_every": 50,
    "aux.pick": "balanced",  # public_train's pick before the hash (2026-11-29)
}


def _same(key: str, x: Any, y: Any) -> bool:
    if x is _ABSENT or y is _ABSENT:  # a key added later, left at its old behaviour
        other = y if x is _ABSENT else x
        if key in ADDED_LATER:
            return other is _ABSENT or other == ADDED_LATER[key]
        return other is _ABSENT or any(other is off for off in _OFF) or other == "none"
    return x == y


_ABSENT = object()


def changed_keys(saved: dict, new: dict) -> list[str]:
    """Keys whose values differ between two resolved configs and that a resume may not change
    (a key missing on one side equals null/false/"none" on the other: added later, left off,
    like ``features.name: none`` in a run made before the features group existed)."""
    return changed_flat_keys(flatten_config(saved), flatten_config(new))


def flatten_config(cfg: dict) -> dict[str, Any]:
    """``{"a.b": value}`` of a nested config (what :func:`changed_flat_keys` compares)."""
    return _flatten(cfg)


def changed_flat_keys(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """:func:`changed_keys` of two configs flattened once (comparing one against many)."""
    return sorted(
        k
        for k in set(a) | set(b)
        if not _same(k, a.get(k, _ABSENT), b.get(k, _ABSENT)) and not may_change(k)
    )


def check_resume(saved_config: dict, config: dict, saved_fp: str | None, fp: str) -> None:
    """Refuse a resume that would change a release or its accounting (ResumeError)."""
    keys = changed_keys(saved_config, config)
    if keys:
        shown = ", ".join(
            f"{k} ({_flatten(saved_config).get(k)!r} -> {_flatten(config).get(k)!r})"
            for k in keys[:6]
        )
        raise ResumeError(
            f"resume: the run was made with different settings: {shown}; these change what the "
            "run releases or how it is accounted. Resume with the run's own config (only "
            f"{', '.join(RESUME_MAY_CHANGE[3:])} may change), or start a new run"
        )
    if saved_fp is not None and saved_fp != fp:
        raise ResumeError(
            "resume: the private training set differs from the one the run was trained on "
            "(data fingerprint mismatch); check data.root and dataset.*"
        )


def rng_state(generators: dict[str, torch.Generator]) -> dict:
    import torch

    state = {name: g.get_state() for name, g in generators.items()}
    state["devices"] = {name: g.device.type for name, g in generators.items()}
    state["torch_cpu"] = torch.get_rng_state()
    if torch.cuda.is_available():
        state["torch_cuda"] = torch.cuda.get_rng_state_all()
    return state


def _saved_device(g: torch.Generator, name: str, state: dict) -> str:
    """The device type that drew the saved stream (older checkpoints: from the state's size)."""
    saved = state.get("devices", {}).get(name)
    if saved is not None:
        return saved
    same = state[name].numel() == g.get_state().numel()
    return g.device.type if same else ("cpu" if g.device.type != "cpu" else "cuda")


def restore_rng(
    generators: dict[str, torch.Generator], state: dict, clean: bool = False, reseed: str = ""
) -> bool:
    """Restore the seeded streams; True if they moved to another device type (then reseeded).

    A CUDA stream cannot continue on the CPU (nor back): the generators differ. From a
    checkpoint written at a clean stop (SIGTERM/SIGINT or the end: no step ran after it,
    nothing is replayed) the streams restart from a seed derived from ``reseed`` (run seed and
    step), fresh noise for every later step. From a mid-run checkpoint steps after it may
    have run and must be *replayed* with the same noise, which only the device type that drew
    them can do: ResumeError.
    """
    import hashlib

    import torch

    moved = False
    for name, g in generators.items():
        was = _saved_device(g, name, state)
        if was == g.device.type:
            # torch.load(map_location=cuda) moved the state there; set_state takes a host tensor
            g.set_state(state[name].cpu())
            continue
        if not clean:
            raise ResumeError(
                f"resume: the checkpoint's {name!r} random stream was drawn on {was}, this run is "
                f"on {g.device.type}; a seeded run changes device type only from a checkpoint "
                f"written at a clean stop (SIGTERM/SIGINT or the end), this one was written "
                f"mid-run: resume on {was} (device={was})"
            )
        digest = hashlib.sha256(f"{reseed}:{name}:{g.device.type}".encode()).digest()
        g.manual_seed(int.from_bytes(digest[:8], "little") >> 1)
        moved = True
    torch.set_rng_state(state["torch_cpu"].cpu())
    if torch.cuda.is_available() and "torch_cuda" in state:
        torch.cuda.set_rng_state_all([s.cpu() for s in state["torch_cuda"]])
    return moved


def journal_ledger(run_dir: Path) -> PrivacyLedger | None:
    from dpsub.privacy import PrivacyLedger

    path = Path(run_dir) / LEDGER_NAME
    return PrivacyLedger.load(path) if path.exists() else None
