"""The train entrypoint: ``dpsub-train`` / ``python -m dpsub.train``.

Hydra composes ``conf/config.yaml`` with the command-line overrides and runs
:func:`dpsub.training.trainer.train` in a fresh run dir (``outputs/...``), or in
the given dir with ``resume=<run dir>``.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from dpsub.config import ConfigError

CONF_DIR = str(Path(__file__).resolve().parents[2] / "conf")
EXPERIMENT_DIR = Path(CONF_DIR) / "experiment"


def _run_dir(resume, default):
    """hydra.run.dir: the resumed run's dir, else a fresh one."""
    return str(resume) if resume not in (None, "", "None", "null") else default


OmegaConf.register_new_resolver("dpsub_run_dir", _run_dir, replace=True)


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
def main(cfg: DictConfig) -> float:
    from dpsub.data import DatasetNotFoundError
    from dpsub.training.trainer import train

    logging.getLogger("dpsub").setLevel(logging.INFO)
    if cfg.resume is not None and not Path(cfg.resume).is_dir():
        raise ConfigError(f"resume: {cfg.resume!r} is not a run directory")
    run_dir = HydraConfig.get().runtime.output_dir
    try:
        result = train(cfg, run_dir)
    except ConfigError as e:
        print(f"dpsub: invalid config: {e}", file=sys.stderr)
        sys.exit(2)
    except DatasetNotFoundError as e:
        print(f"dpsub: {e}", file=sys.stderr)
        sys.exit(2)
    return result.test_accuracy  # for Hydra sweepers that optimize a return value


def cli() -> None:
    """``dpsub-train [experiment=NAME] [overrides]``.

    An experiment is a small primary config in ``conf/experiment/`` that extends
    ``config.yaml`` (``defaults: [config, override dataset: ..., _self_]``). Hydra
    is pointed at it with ``--config-dir conf/experiment --config-name NAME``, so
    experiment files need no ``@package _global_`` header.
    """
    args = sys.argv[1:]
    chosen = [a for a in args if a.startswith("experiment=")]
    if chosen:
        name = chosen[-1].split("=", 1)[1]
        available = sorted(p.stem for p in EXPERIMENT_DIR.glob("*.yaml"))
        if name not in available:
            print(
                f"dpsub: experiment: unknown experiment {name!r}; available: {available}",
                file=sys.stderr,
            )
            sys.exit(2)
        rest = [a for a in args if not a.startswith("experiment=")]
        sys.argv = [sys.argv[0], "--config-dir", str(EXPERIMENT_DIR), "--config-name", name, *rest]
    main()


if __name__ == "__main__":
    cli()
