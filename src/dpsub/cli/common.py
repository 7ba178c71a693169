"""What the commands share (``dpsub-train``, ``dpsub-audit``, ``dpsub-pate``): the config
folder, one-line errors, Ctrl-C, the run dir of a job, console logging outside Hydra, and the
checks of the command line before Hydra composes it."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

import dpsub.config  # noqa: F401 -- declares the options' defaults before Hydra composes
from dpsub.errors import ConfigError, ResumeError, exit_code
from dpsub.paths import conf_dir

CONF_DIR = str(conf_dir())  # the wheel's dpsub/conf, or the repository's conf/
MULTIRUN_FLAGS = ("-m", "--multirun")
#: Hydra flags after which the overrides are not dpsub's (another config tree, completion)
OWN_CONFIG_FLAGS = ("-cp", "--config-path", "-cn", "--config-name", "-sc", "--shell-completion")
#: Hydra's flag that adds the user's config folder (searched, and checked, after conf/)
CONFIG_DIR_FLAGS = ("-cd", "--config-dir")


def _groups_help(config_name: str = "config") -> str:
    """``--help``'s group list: Hydra's $APP_CONFIG_GROUPS without conf/paper (tables) and
    without the groups of the other commands (``audit``, ``pate``)."""
    from dpsub.overrides import config_groups, group_options

    groups = config_groups(config_name)
    return "".join(f"{g}: {', '.join(group_options(g))}\n" for g in groups)


OmegaConf.register_new_resolver("dpsub_groups", _groups_help, replace=True)


def fail(err: BaseException) -> None:
    """One line on stderr and the error's exit code."""
    label = (
        ""
        if isinstance(err, ResumeError) or not isinstance(err, ConfigError)
        else "invalid config: "
    )
    print(f"dpsub: {label}{err}", file=sys.stderr, flush=True)
    sys.exit(exit_code(err))


def interruptible(cli_fn):
    """A command whose Ctrl-C (or SIGINT) is one line on stderr and exit code 130, never a
    traceback; a run interrupted before its first step leaves no run dir (trainer.train),
    one interrupted later resumes from its last checkpoint."""

    @functools.wraps(cli_fn)
    def wrapped() -> None:
        try:
            cli_fn()
        except KeyboardInterrupt:
            print("dpsub: interrupted (Ctrl-C)", file=sys.stderr, flush=True)
            sys.exit(130)

    return wrapped


def job_dir(cfg: DictConfig) -> Path:
    """``out_dir``; in a multirun ``<sweep dir>/<job number>_<overrides>``, the overrides
    without the keys a resume may change (``dpsub.cli.sweeps.job_subdir``)."""
    hc = HydraConfig.get()
    if hc.mode == RunMode.MULTIRUN:
        from dpsub.cli.sweeps import job_subdir

        sweep = Path(hc.sweep.dir)
        return sweep / job_subdir(sweep, hc.job.num, list(hc.overrides.task))
    return Path(cfg.out_dir)


def configure_logging() -> None:
    """Outside Hydra (resume): the same console logging as ``conf/hydra/job_logging/dpsub.yaml``."""
    import logging.config

    spec = OmegaConf.load(Path(CONF_DIR) / "hydra" / "job_logging" / "dpsub.yaml")
    logging.config.dictConfig(OmegaConf.to_container(spec))


def check_args(args: list[str], config_name: str = "config") -> None:
    """Unknown groups, options and keys of ``conf/<config_name>.yaml``: one line and exit 2
    before Hydra composes."""
    from dpsub.overrides import check_overrides, use_config_dirs

    if any(a.split("=")[0] in OWN_CONFIG_FLAGS for a in args):
        return  # another config tree: Hydra checks it
    try:
        use_config_dirs(config_dirs(args))
        overrides = [a for a in args if a.startswith("~") or ("=" in a and a[0] != "-")]
        check_overrides(overrides, config_name)
    except ConfigError as e:
        fail(e)


def config_dirs(args: list[str]) -> list[str]:
    """The user's config folders: ``--config-dir DIR`` (``-cd``) and ``hydra.searchpath=[...]``."""
    from dpsub.overrides import parse_overrides

    dirs = []
    for i, a in enumerate(args):
        flag, eq, value = a.partition("=")
        if flag in CONFIG_DIR_FLAGS:
            dirs.append(value if eq else (args[i + 1] if i + 1 < len(args) else ""))
        elif flag == "hydra.searchpath":
            dirs += [str(v) for v in parse_overrides([a])[0].value()]
    return [d for d in dirs if d]


def run_dir_arg(args: list[str]) -> list[str]:
    """Hydra's ``hydra.run.dir=X`` (dpsub keeps Hydra in ``.`` and makes the run dir itself)
    as ``out_dir=X``; refused in a sweep (``hydra.sweep.dir``) or beside ``out_dir=``."""
    given = [a for a in args if a.startswith("hydra.run.dir=")]
    if not given:
        return args
    if any(a in MULTIRUN_FLAGS for a in args):
        fail(
            ConfigError(
                "hydra.run.dir: a sweep writes under hydra.sweep.dir=DIR (one folder per job)"
            )
        )
    if len(given) > 1 or any(a.startswith("out_dir=") for a in args):
        fail(
            ConfigError(
                "hydra.run.dir: give the run dir once, as out_dir=DIR (or hydra.run.dir=DIR)"
            )
        )
    return [f"out_dir={a.split('=', 1)[1]}" if a in given else a for a in args]
