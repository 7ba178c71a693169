"""What a person watching a run sees, and what ``train.log`` keeps.

Every log step becomes one plain line (``step 200/1200 | epsilon 0.81 | test acc 91.2%``)
and every evaluation another, on the console and in the run's
``train.log``. A tqdm bar is added only when ``train.progress`` is on *and* stderr is a
terminal (redirected output and Slurm logs get plain lines, no carriage returns);
the lines then print above the bar: while it is drawn, every console handler (the root
logger's, which Hydra's ``job_logging`` installs, and any on ``dpsub``) writes through
``tqdm.write``, so each line appears once and the bar is redrawn below it.
No line carries a step rate: over a log window it tracks the realized (private) Poisson
batch sizes; the run average is in the final line (docs/privacy.md). With ``timing=False``
(secure mode) the bar shows no rate or elapsed time either.
"""

from __future__ import annotations

import contextlib
import logging
import logging.handlers
import math
import sys
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("dpsub")
FORMAT = "[%(asctime)s][%(levelname)s] %(message)s"


def attach_run_log(path: Path) -> Callable[[], None]:
    """Send the ``dpsub`` logger to ``path`` (and to stdout if nothing prints it); undo with the return.

    The file is reopened when it is replaced under a running job (``WatchedFileHandler``):
    a ``git stash -u`` / ``stash pop`` in a lane's clone on 2026-11-28 recreated a running
    run's ``train.log``, and a plain handler went on writing to the deleted file."""
    log.setLevel(logging.INFO)
    handlers: list[logging.Handler] = [logging.handlers.WatchedFileHandler(path)]
    if not (log.handlers or logging.getLogger().handlers):
        handlers.append(logging.StreamHandler(sys.stdout))
    for h in handlers:
        h.setFormatter(logging.Formatter(FORMAT, "%H:%M:%S"))
        log.addHandler(h)

    def detach() -> None:
        for h in handlers:
            log.removeHandler(h)
            h.close()

    return detach


def _pct(acc: float | None) -> str:
    return "-" if acc is None else f"{100 * acc:.2f}%"


def _eps(metrics: dict) -> str:
    """The epsilon of a log line; the running RDP bound is marked as such where the run's
    accountant is another (PRV: its epsilon, often smaller, is computed at evaluations)."""
    rdp_only = "epsilon" not in metrics and "epsilon_rdp" in metrics
    e = metrics.get("epsilon", metrics.get("epsilon_rdp", math.inf))
    return "inf" if not math.isfinite(e) else f"{e:.4f}" + (" (RDP bound)" if rdp_only else "")


def _is_console(h: logging.Handler) -> bool:
    is_stream = isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)
    return is_stream and h.stream in (sys.stdout, sys.stderr)


class _BarSafeHandler(logging.StreamHandler):
    """A console handler that clears the bar, prints the line and redraws the bar."""

    def emit(self, record: logging.LogRecord) -> None:
        from tqdm.auto import tqdm

        try:
            tqdm.write(self.format(record), file=self.stream)
        except Exception:  # noqa: BLE001 -- logging's own convention
            self.handleError(record)


@contextlib.contextmanager
def console_above_bar():
    """Swap the root's and ``dpsub``'s console handlers for bar-safe ones (same format,
    level and stream); put the originals back on exit."""
    swapped = []
    for logger in (logging.getLogger(), log):
        for h in list(logger.handlers):
            if _is_console(h):
                safe = _BarSafeHandler(h.stream)
                safe.setFormatter(h.formatter)
                safe.setLevel(h.level)
                logger.removeHandler(h)
                logger.addHandler(safe)
                swapped.append((logger, h, safe))
    try:
        yield
    finally:
        for logger, h, safe in swapped:
            logger.removeHandler(safe)
            logger.addHandler(h)


class _Prefixed(logging.Formatter):
    """``base``'s format with ``prefix`` before the message (the record is left as it was)."""

    def __init__(self, base: logging.Formatter | None, prefix: str):
        super().__init__()
        self.base, self.prefix = base or logging.Formatter(), prefix

    def format(self, record: logging.LogRecord) -> str:
        saved = record.msg, record.args
        record.msg, record.args = f"{self.prefix}{record.getMessage()}", None
        try:
            return self.base.format(record)
        finally:
            record.msg, record.args = saved


@contextlib.contextmanager
def job_prefix(prefix: str):
    """Every console line (the root's and ``dpsub``'s handlers) starts its message with
    ``prefix``: a sweep's job, whose lines interleave with the other jobs' (joblib workers)."""
    handlers = [h for lg in (logging.getLogger(), log) for h in lg.handlers if _is_console(h)]
    saved = [h.formatter for h in handlers]
    for h in handlers:
        h.setFormatter(_Prefixed(h.formatter, prefix))
    try:
        yield
    finally:
        for h, f in zip(handlers, saved, strict=True):
            h.setFormatter(f)


class _Bar:
    """A tqdm bar on stderr when ``enabled`` and stderr is a terminal (console log lines
    print above it), else none (``self.bar`` None)."""

    def __init__(self, enabled: bool, **tqdm_args):
        self.bar = None
        self._redirect = contextlib.ExitStack()
        if enabled and sys.stderr.isatty():
            from tqdm.auto import tqdm

            self.bar = tqdm(dynamic_ncols=True, **tqdm_args)
            self._redirect.enter_context(console_above_bar())

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        self._redirect.close()


class Counter(_Bar):
    """Progress of a long job that is not training (a feature extraction): a bar, or
    without one (``train.progress=false``, or stderr not a terminal) a plain line at every
    tenth of ``total``, so that minutes of work are never silent."""

    def __init__(self, total: int, what: str, enabled: bool, unit: str = "examples"):
        super().__init__(enabled, total=total, desc=what, unit=f" {unit}")
        self.total, self.what, self.unit, self.done = total, what, unit, 0

    def advance(self, n: int) -> None:
        before, self.done = self.done, self.done + n
        if self.bar is not None:
            self.bar.update(n)
        elif 10 * self.done // self.total > 10 * before // self.total and self.done < self.total:
            log.info("%s: %d/%d %s", self.what, self.done, self.total, self.unit)


class Progress(_Bar):
    def __init__(
        self, total: int, initial: int, enabled: bool, split: str = "test", timing: bool = True
    ):
        self.total, self.split = total, split
        plain = "{l_bar}{bar}| {n_fmt}/{total_fmt}{postfix}"  # no rate, no times
        super().__init__(
            enabled, total=total, initial=initial, bar_format=None if timing else plain
        )

    def log(self, step: int, metrics: dict, acc: float | None) -> None:
        log.info(
            "step %d/%d | epsilon %s | %s acc %s",
            step, self.total, _eps(metrics), self.split, _pct(acc),
        )  # fmt: skip

    def evaluation(self, step: int, ev: dict) -> None:
        split = "validation" if "validation/accuracy" in ev else "test"
        log.info(
            "eval step %d | %s accuracy %s | %s loss %.4f | epsilon %s",
            step, split, _pct(ev[f"{split}/accuracy"]), split, ev[f"{split}/loss"], _eps(ev),
        )  # fmt: skip

    def update(self, step: int, eps: float, acc: float | None) -> None:
        if self.bar is not None:
            self.bar.update(step - self.bar.n)
            self.bar.set_postfix(eps=f"{eps:.3f}", acc=_pct(acc), refresh=False)
