"""Shared test helpers: where the real data lives and how to run the CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CONF_DIR = REPO / "conf"


def shared_data_root() -> Path:
    """$DPSUB_DATA, else the ``shared/data`` folder beside the repository (may not exist)."""
    env = os.environ.get("DPSUB_DATA")
    return Path(env) if env else REPO.parent / "shared" / "data"


SHARED_ROOT = shared_data_root()
SHARED = SHARED_ROOT.resolve() if (SHARED_ROOT / "MNIST" / "raw").is_dir() else None
needs_shared = pytest.mark.skipif(
    SHARED is None, reason="real data (../shared/data or DPSUB_DATA) not found"
)


#: torchrun's / Slurm's variables: a CLI run under test is one process unless a test says so
LAUNCHER_VARS = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_NTASKS"}


def cli_command(*overrides: str, run_dir: Path | None = None, env: dict | None = None):
    """argv and environment for ``python -m dpsub.cli.train`` (W&B disabled unless overridden)."""
    flags = [o for o in overrides if o.startswith("-")]
    args = [
        sys.executable,
        "-m",
        "dpsub.cli.train",
        *flags,
        "logger.mode=disabled",
        "train.progress=false",
    ]
    if run_dir is not None and not any(o.startswith("resume=") for o in overrides):
        args.append(f"out_dir={run_dir}")
    args += [o for o in overrides if not o.startswith("-")]
    inherited = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
    full_env = {**inherited, "WANDB_SILENT": "true", **(env or {})}
    if SHARED is not None:
        full_env.setdefault("DPSUB_DATA", str(SHARED))
    return args, full_env


def run_cli(
    *overrides: str,
    run_dir: Path | None = None,
    timeout: int = 600,
    check: bool = True,
    env: dict | None = None,
) -> subprocess.CompletedProcess:
    """Run ``python -m dpsub.cli.train`` with overrides and wait for it."""
    args, full_env = cli_command(*overrides, run_dir=run_dir, env=env)
    proc = subprocess.run(
        args, capture_output=True, text=True, timeout=timeout, cwd=REPO, env=full_env
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"dpsub.cli.train failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
        )
    return proc


def cli_in_process(
    *overrides: str,
    run_dir: Path | None = None,
    check: bool = True,
    env: dict | None = None,
    module: str = "dpsub.cli.train",
    timeout: int | None = None,  # run_cli's; pytest-timeout bounds a test in this process
) -> subprocess.CompletedProcess:
    """:func:`run_cli` in this process (seconds, where a subprocess spends most of its time
    importing torch): :func:`run_in_process` with run_cli's argv and environment."""
    args, full_env = cli_command(*overrides, run_dir=run_dir, env=env)
    proc = run_in_process(module, args[3:], full_env)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{module} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
        )
    return proc


def run_in_process(module: str, words: list[str], env: dict) -> subprocess.CompletedProcess:
    """``python -m <module> WORDS`` as :func:`captured` ``<module>.cli()`` in this process."""
    import importlib

    return captured(lambda: importlib.import_module(module).cli(), [module, *words], env)


#: scripts/<name>.py -> the module of dpsub.experiments it wraps (else the same name)
SCRIPT_MODULES = {"bench": "benchmark", "mutation_check": "mutations"}


def run_script_in_process(script: Path, *words, env: dict | None = None, cwd: Path = REPO):
    """``python scripts/NAME.py WORDS`` run from ``cwd``: the module the wrapper runs
    (``dpsub.experiments.<module>``) as ``__main__``, :func:`captured` in this process."""
    import contextlib
    import runpy
    import warnings

    name = Path(script).stem
    module = f"dpsub.experiments.{SCRIPT_MODULES.get(name, name)}"

    def run():
        with contextlib.chdir(cwd), warnings.catch_warnings():
            # a fresh interpreter has not imported the module yet; this process may have
            warnings.filterwarnings("ignore", "'dpsub.experiments.", RuntimeWarning)
            runpy.run_module(module, run_name="__main__")

    return captured(run, [str(script), *map(str, words)], env or dict(os.environ))


def captured(run, argv: list[str], env: dict) -> subprocess.CompletedProcess:
    """``run()`` with ``sys.argv`` = ``argv`` and environment ``env``, its stdout / stderr and
    exit code captured as a subprocess's would be (seconds, where a subprocess spends most
    of its time importing torch). ``sys.argv``, ``os.environ``, torch's thread count and the
    logging set-up Hydra replaces are restored afterwards."""
    import contextlib
    import io
    import logging

    import torch

    out, err, code = io.StringIO(), io.StringIO(), 0
    saved_argv, saved_env, threads = sys.argv[:], os.environ.copy(), torch.get_num_threads()
    loggers = [logging.getLogger(n) for n in ("", "dpsub", "hydra")]
    saved_logs = [(lg, lg.handlers[:], lg.level, lg.propagate) for lg in loggers]
    try:
        os.environ.clear()
        os.environ.update(env)
        sys.argv = list(argv)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            run()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, int | None):
            err.write(f"{e.code}\n")
    finally:
        sys.argv = saved_argv
        torch.set_num_threads(threads)  # a script may set its own (bench, mia: one)
        os.environ.clear()
        os.environ.update(saved_env)
        for lg, handlers, level, propagate in saved_logs:
            lg.handlers[:], lg.level, lg.propagate = handlers, level, propagate
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


def compose_cfg(*overrides: str, data_root: Path | None = None):
    """The composed config (``conf/config.yaml`` + overrides), W&B and progress bar off."""
    from dpsub.config import compose

    root = data_root or SHARED or Path("./data")
    return compose(
        [f"data.root={root}", "logger.mode=disabled", "train.progress=false", *overrides]
    )


#: A small synthetic private set (no files): quick runs of the real loop.
SYNTH = (
    "dataset=synthetic",
    "dataset.synthetic.n_train=400",
    "dataset.synthetic.n_test=100",
    "train.batch_size=64",
    "train.epochs=1",
    "train.eval_every=0",
    "optim.lr=0.5",
)


E2E = Path(__file__).resolve().parent / "e2e"


def pytest_configure(config):
    """Under pytest-xdist each worker computes on its share of the cores (``make test``: two
    workers, one thread each), and so do the subprocesses its tests start. With torch's
    default (a thread per core in every worker) two workers oversubscribed two cores, and a
    worker whose in-process script had set one thread kept it for the rest of its files."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers > 1 and "OMP_NUM_THREADS" not in os.environ:
        import torch

        threads = max(1, (os.cpu_count() or 1) // workers)
        os.environ["OMP_NUM_THREADS"] = str(threads)
        torch.set_num_threads(threads)


@pytest.hookimpl(tryfirst=True)  # before ``-m "not slow"`` deselects
def pytest_collection_modifyitems(items):
    """Every test in tests/e2e/ is ``slow`` (and only those: tests/unit/test_architecture.py)
    and gets a longer per-test limit than the default; GPU tests
    (tests/integration/test_gpu.py) are skipped without CUDA unless DPSUB_GPU_TESTS_ON_CPU=1."""
    for item in items:
        if E2E in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.slow)
    gpu_skip = None
    if any(item.get_closest_marker("gpu") for item in items):
        import torch

        if not torch.cuda.is_available() and os.environ.get("DPSUB_GPU_TESTS_ON_CPU") != "1":
            gpu_skip = pytest.mark.skip(reason="needs CUDA (DPSUB_GPU_TESTS_ON_CPU=1: on the CPU)")
    for item in items:
        if item.get_closest_marker("slow") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(5400))
        if gpu_skip is not None and item.get_closest_marker("gpu"):
            item.add_marker(gpu_skip)


def loop_grads(model, x, y):
    """Per-example gradients by single-example backward passes (the independent reference;
    on a model Opacus hooks, its harmless first-layer hook warning is silenced as the
    library's own backward silences it)."""
    import warnings

    import torch
    import torch.nn.functional as F

    from dpsub.grads.engine import _INPUT_HOOK_WARNING

    rows = []
    for i in range(x.shape[0]):
        model.zero_grad()
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", _INPUT_HOOK_WARNING, UserWarning)
            F.cross_entropy(model(x[i : i + 1]), y[i : i + 1]).backward()
        rows.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]))
    model.zero_grad()
    return torch.stack(rows)


# Fixtures the suites share, written beside their helpers in tests/helpers/ (imported last:
# those modules import the names above).
from helpers.cli_errors import finished  # noqa: E402, F401
from helpers.packaging import installed  # noqa: E402, F401
from helpers.runs import references  # noqa: E402, F401
from helpers.tables import tiny  # noqa: E402, F401
