"""A run directory: the names of the files a run writes, reading a finished run, provenance.

Every run dir holds (written by the trainer)::

    config.yaml     the resolved config          summary.json   the final numbers
    metrics.jsonl   one JSON record per log      train.log      the log
    checkpoint.pt   model + optimizer + ledgers  (never committed)
    ledger.json     the privacy ledger

and, written later by the tools, ``validation.json`` (held-out accuracy), ``mia.json`` and
``public_projection.json``. ``SMALL_FILES`` are the ones a results folder keeps (the
ledger included, no checkpoints). ``RunDir(path)`` reads them; ``find_runs(root)`` lists the finished runs
under a folder (a Hydra sweep folder included); ``provenance()`` is the commit, date and
hardware a results file records (one helper for bench, make_table and reproduce).

Torch-free (the scripts import it before deciding whether they need torch).
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import os
import platform
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "CHECKPOINT",
    "FINGERPRINT_KEY",
    "LEDGER",
    "CONFIG",
    "LOG",
    "METRICS",
    "MIA",
    "VALIDATION",
    "SELECTION",
    "SMALL_FILES",
    "SUMMARY",
    "RunDir",
    "RunError",
    "cpu_name",
    "expand",
    "find_runs",
    "group_by_setting",
    "git_commit",
    "hardware",
    "not_covered_statistics",
    "owner_only_tmp",
    "private_file",
    "private_folder",
    "provenance",
]

NOT_RECORDED = "(hardware not recorded)"  # RunDir.hardware() of a run made before the record
CONFIG = "config.yaml"
SUMMARY = "summary.json"
METRICS = "metrics.jsonl"
LOG = "train.log"
CHECKPOINT = "checkpoint.pt"
LEDGER = "ledger.json"  # the privacy ledger (secure mode: written before every release)
VALIDATION = "validation.json"  # scripts/heldout_eval.py
MIA = "mia.json"  # scripts/mia.py (the run is then not covered by its epsilon)
SELECTION = "selection.json"  # dpsub-select: the kept run's record (dpsub/cli/select.py)
#: the run's secret key of its data fingerprint (training/checkpoint.py): never published
FINGERPRINT_KEY = "fingerprint.key"
#: What a results folder keeps of a run (never the checkpoint).
#: kept by a results folder: what the run did, its numbers, and the ledger its epsilon is
#: recomputed from (the multiplier and sample rate of every step: public, a few hundred bytes)
SMALL_FILES = (
    CONFIG, SUMMARY, METRICS, LOG, LEDGER, VALIDATION, MIA, "public_projection.json",
)  # fmt: skip

_ROOT = Path(__file__).resolve().parents[2]  # the checkout (for git)

_TUNING = "on held-out private training examples (dataset.validation_size), no noise"
#: A summary's values computed from the private data without noise, so not covered by the
#: run's epsilon even where ``covered_by_epsilon`` is true (that flag is about the model and
#: the logs); a key ending in "/" names every key that starts with it.
NOT_COVERED_STATISTICS = {
    "validation_accuracy": f"accuracy {_TUNING} (the papers' convention of uncounted tuning; "
    "also validation/accuracy in metrics.jsonl and train.log)",
    "validation_loss": f"loss {_TUNING} (also validation/loss in metrics.jsonl and train.log)",
    "run_seconds": "wall time of the training loops: grows with the number of private "
    "examples the Poisson samples drew, no noise",
    "steps_per_s": "steps / run_seconds",
    "cpu_seconds": "CPU time of the training loops: grows with the number of private examples "
    "the Poisson samples drew, no noise",
    "private/": "computed from the private training set without noise (not_covered says why)",
    "epsilon_data_dependent": "PATE: computed from the teachers' unnoised votes",
}


def not_covered_statistics(summary: dict) -> dict[str, str]:
    """``{key: why}`` for each value of ``summary`` that depends on private data without noise.

    The trainer and ``dpsub-pate`` write it into summary.json as ``not_covered_statistics``;
    for a summary written before they did, this derives the same entry from its keys.
    """
    out = {}
    for key in summary:
        why = NOT_COVERED_STATISTICS.get(key) or next(
            (w for k, w in NOT_COVERED_STATISTICS.items() if k.endswith("/") and key.startswith(k)),
            None,
        )
        if why is not None:
            out[key] = why
    return out


def private_folder(path: Path, ours: bool = False) -> Path:
    """``path`` made if missing (its parents too) with only its owner allowed in: it holds
    values computed from the private data without noise (a cache, PATE's votes). A folder
    that exists keeps its mode unless ``ours`` (a name dpsub gives, e.g. ``private/``: one
    made by an older version is closed too); a folder the user named may be shared."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    if ours:
        os.chmod(path, 0o700)
    return path


def private_file(path: Path, text: bool = False):
    """``path`` opened for writing (created or truncated), readable by its owner only from
    the moment it exists: no other user can open it while the private bytes go in."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    if hasattr(os, "fchmod"):  # (a file left by a crash keeps its mode through O_CREAT)
        os.fchmod(fd, 0o600)
    return os.fdopen(fd, "w" if text else "wb")


def owner_only_tmp(path: Path, data: bytes) -> Path:
    """``data`` written to a new file beside ``path`` that only its owner can read (a
    secret key before it is linked or moved into place); returns that file."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    with private_file(tmp) as f:
        f.write(data)
    return tmp


class RunError(Exception):
    """A run dir that cannot be read; the message names the dir or file (one line)."""


@dataclass(frozen=True)
class RunDir:
    """One run directory (need not exist yet)."""

    path: Path

    def __post_init__(self):
        object.__setattr__(self, "path", Path(self.path))

    def file(self, name: str) -> Path:
        return self.path / name

    @property
    def config_path(self) -> Path:
        return self.path / CONFIG

    @property
    def summary_path(self) -> Path:
        return self.path / SUMMARY

    @property
    def metrics_path(self) -> Path:
        return self.path / METRICS

    @property
    def checkpoint_path(self) -> Path:
        return self.path / CHECKPOINT

    @property
    def finished(self) -> bool:
        return self.summary_path.is_file()

    @property
    def has_checkpoint(self) -> bool:
        return self.checkpoint_path.is_file()

    @property
    def started(self) -> bool:
        """A run began here (its config, a checkpoint or a privacy ledger was written): it is
        continued with ``resume=``, never started again as a new run."""
        return any(self.file(name).is_file() for name in (CONFIG, CHECKPOINT, LEDGER))

    # ------------------------------------------------------------- reading
    def require(self, *names: str) -> None:
        """RunError naming the first missing file (or the dir)."""
        if not self.path.is_dir():
            what = "not a directory" if self.path.exists() else "no such run directory"
            raise RunError(f"{self.path}: {what}")
        for name in names:
            if not (self.path / name).is_file():
                raise RunError(
                    f"{self.path}: no {name} in this directory (not a finished dpsub run?)"
                )

    def summary(self) -> dict:
        self.require(SUMMARY)
        try:
            return json.loads(self.summary_path.read_text())
        except json.JSONDecodeError as e:
            raise RunError(f"{self.summary_path}: not valid JSON ({e.msg})") from None

    def config(self):
        """The saved config (an OmegaConf DictConfig)."""
        from omegaconf import OmegaConf

        self.require(CONFIG)
        try:
            return OmegaConf.load(self.config_path)
        except Exception as e:  # noqa: BLE001 -- YAML syntax errors have several classes
            raise RunError(
                f"{self.config_path}: not a readable YAML file ({type(e).__name__})"
            ) from None

    def config_on(self, data_root: str | Path):
        """The saved config with its data moved to ``data_root`` (another machine's data
        folder): ``data.root`` and every aux path under the old root follow it."""
        cfg = self.config()
        old = str(cfg.data.root).rstrip("/") + "/"
        path = cfg.aux.get("path") if "aux" in cfg else None
        if path and str(path).startswith(old):
            cfg.aux.path = str(Path(data_root) / str(path)[len(old) :])
        cfg.data.root = str(data_root)
        return cfg

    def config_dict(self) -> dict:
        """The saved config as plain containers, read by libyaml with OmegaConf's scalar
        rules (15x faster than :meth:`config` on a scan of many runs); YAML that libyaml
        rejects takes :meth:`config`'s path and its error."""
        import yaml

        self.require(CONFIG)
        try:
            return yaml.load(self.config_path.read_text(), _fast_loader())  # noqa: S506
        except yaml.YAMLError:
            from omegaconf import OmegaConf

            return OmegaConf.to_container(self.config())

    def metrics(self) -> list[dict]:
        """The records of metrics.jsonl."""
        self.require(METRICS)
        rows = []
        for num, line in enumerate(self.metrics_path.read_text().splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise RunError(
                        f"{self.metrics_path}:{num}: not a JSON line ({e.msg})"
                    ) from None
        return rows

    def json(self, name: str) -> dict | None:
        """An extra JSON file of the run (validation.json, mia.json...), None if absent."""
        p = self.path / name
        return json.loads(p.read_text()) if p.is_file() else None

    def train_seconds(self) -> float:
        """Training wall-clock: summary.json's run_seconds, or for runs made before it
        existed, metrics.jsonl's per-window steps_per_s (0 without either)."""
        if self.summary_path.is_file():
            seconds = json.loads(self.summary_path.read_text()).get("run_seconds")
            if seconds is not None:
                return float(seconds)
        total, last = 0.0, 0
        for row in self.metrics():
            if row.get("steps_per_s"):
                total += (row["step"] - last) / row["steps_per_s"]
                last = row["step"]
        return total

    def recorded(self, key: str, log_pattern: str) -> str | None:
        """summary.json's ``key``, else the first group of ``log_pattern`` in train.log."""
        value = self.summary().get(key) if self.finished else None
        if value:
            return str(value)
        log = self.path / LOG
        found = re.search(log_pattern, log.read_text(errors="replace")) if log.is_file() else None
        return found.group(1).strip() if found else None

    def device_type(self) -> str:
        """The device type the run trained on ("cpu", "cuda", ...): summary.json's
        ``device``, else train.log's device line (runs made before the summary had it), else
        "cpu" (the runs older than the log line ran on this project's CPU)."""
        return self.recorded("device", r"\] device +([a-z]+)") or "cpu"

    def hardware(self) -> str:
        """Where the run trained: summary.json's ``hardware`` (CPU, cores, GPU, torch), else
        train.log's hardware line, else only the device type (runs made before either)."""
        return self.recorded("hardware", r"\] hardware +(.+)") or (
            f"{self.device_type()} {NOT_RECORDED}"
        )

    # ------------------------------------------------------------- copying
    def copy_small_files(self, dest: Path | RunDir) -> RunDir:
        """Copy the small files (never the checkpoint) to ``dest``; returns it."""
        dest = dest if isinstance(dest, RunDir) else RunDir(dest)
        if dest.path.resolve() != self.path.resolve():
            dest.path.mkdir(parents=True, exist_ok=True)
            for name in SMALL_FILES:
                if (self.path / name).is_file():
                    shutil.copyfile(self.path / name, dest.path / name)
        return dest


def find_runs(root: Path, follow_links: bool = True, marker: str = SUMMARY) -> list[RunDir]:
    """Every finished run (a dir with summary.json and config.yaml) at or under ``root``:
    a run dir, a Hydra sweep folder (``multirun/<date>/<time>/<job>``) or any tree of them.
    ``follow_links=False`` skips runs reached through a symlink (reproduce's reused runs);
    ``marker=METRICS`` finds runs still in progress too (config.yaml not required)."""
    root = Path(root)
    if (root / marker).is_file():
        return [RunDir(root)]
    out = []
    for s in sorted(root.rglob(marker)):
        d = s.parent
        if marker == SUMMARY and not (d / CONFIG).is_file():
            continue
        if not follow_links and any(p.is_symlink() for p in [d, *d.parents]):
            continue
        out.append(RunDir(d))
    return out


def expand(paths: list[Path], marker: str = SUMMARY) -> list[RunDir]:
    """The finished runs named by ``paths``: run dirs, or folders holding runs (a Hydra sweep
    folder). RunError, naming the path, for one that is missing or holds no finished run.
    ``marker=METRICS``: runs with a metrics.jsonl (running ones too)."""
    out: list[RunDir] = []
    for p in map(Path, paths):
        if not p.is_dir():
            raise RunError(f"{p}: {'not a directory' if p.exists() else 'no such run directory'}")
        found = find_runs(p, marker=marker)
        if not found:
            needed = (SUMMARY, CONFIG) if marker == SUMMARY else (marker,)
            RunDir(p).require(*needed)  # names the missing file of a single run dir
            raise RunError(f"{p}: no run ({' + '.join(needed)}) in or under it")
        out += [r for r in found if r not in out]
    return out


#: Config keys that do not make two runs different settings (seed: the groups are over seeds).
NOT_A_SETTING = (
    "seed",
    "out_dir",
    "run_name",
    "data.",
    "logger.",
    "hydra.",
    "resume",
    "device",
    "features.cache_dir",
)  # where, not what


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def group_by_setting(runs: list[RunDir]) -> dict[str, list[RunDir]]:
    """Runs that differ only in their seed (and where they are) share a group; each group is
    labelled by the config keys that vary between groups (``mechanism.name=gep, optim.lr=0.1``)."""
    keys = []
    for r in runs:
        flat = _flat(r.config_dict()) if r.config_path.is_file() else {"run": str(r.path)}
        keys.append({k: v for k, v in flat.items() if not k.startswith(NOT_A_SETTING)})
    varying = sorted({k for a in keys for k in a if any(a.get(k) != b.get(k) for b in keys)})
    groups: dict[str, list[RunDir]] = {}
    for r, k in zip(runs, keys, strict=True):
        label = ", ".join(f"{name}={k.get(name)}" for name in varying) or "all runs"
        groups.setdefault(label, []).append(r)
    return groups


# ----------------------------------------------------------- provenance
def git_commit(root: Path | None = None) -> str | None:
    """The checkout's short commit (``-dirty`` with uncommitted tracked changes), or None."""

    def git(*a):
        return subprocess.run(
            ["git", *a], cwd=root or _ROOT, capture_output=True, text=True, timeout=10
        )

    try:
        rev, dirty = git("rev-parse", "--short", "HEAD"), git("status", "--porcelain", "-uno")
    except (OSError, subprocess.SubprocessError):
        return None
    if rev.returncode != 0 or not rev.stdout.strip():
        return None
    return rev.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def hardware() -> str:
    """CPU, cores, torch's threads, GPU and torch version in one line (the threads too: a
    CPU run's floating-point results depend on them, docs/usage.md)."""
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    n = torch.get_num_threads()
    cpu = f"{cpu_name()}, {os.cpu_count()} cores, {n} thread{'s' if n > 1 else ''}"
    return f"{cpu}; GPU: {gpu}; torch {torch.__version__}"


def provenance() -> dict:
    """What a results file records about where and when it was made."""
    return {
        "commit": git_commit() or "unknown",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="minutes"),
        "hardware": hardware(),
    }


@functools.cache
def _fast_loader():
    """OmegaConf's own YAML loader (its scalar rules: ``1e-5`` a float, no timestamps; its
    refusal of duplicate keys) on libyaml's parser: the same dicts as
    ``OmegaConf.to_container(OmegaConf.load(path))``; OmegaConf's as is without libyaml."""
    import yaml
    from omegaconf._utils import get_yaml_loader

    loader = get_yaml_loader()
    if not hasattr(yaml, "CSafeLoader"):
        return loader
    from yaml.cyaml import CParser

    return type("FastOmegaConfLoader", (CParser, loader), {"__init__": yaml.CSafeLoader.__init__})
