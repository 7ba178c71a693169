"""``dpsub-audit``: an empirical lower bound on epsilon for the configured run.

Hydra composes ``conf/dpsub_audit.yaml``: the training config (every group) plus the
``audit/`` group (``whitebox``, ``onerun`` or ``pate``: a PATE aggregator alone). The run's config is validated first
(one line, exit code 2, nothing written on a bad value); then the audit builds the run
with :func:`~dpsub.training.build.build_run` and writes, into ``out_dir``:
``config.yaml``, ``train.log`` (with one ``audit:`` line), ``summary.json`` (the run's
steps and accountant epsilon; the one-run audit's test accuracy) and ``audit.json``
beside it (the lower bound, its confidence, the trials, the accountant's upper bound).
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from dpsub.cli.common import CONF_DIR, fail, interruptible, job_dir
from dpsub.errors import ConfigError
from dpsub.rundir import CONFIG, LOG, SUMMARY

log = logging.getLogger("dpsub")

KINDS = ("whitebox", "onerun", "pate")


def split(cfg: DictConfig) -> tuple[DictConfig, DictConfig]:
    """(the training config, the audit options), both checked."""
    from dpsub.config import validate

    cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    audit = cfg.pop("audit")
    if audit.kind == "onerun":
        from dpsub.audit.onerun import check_options

        check_options(audit)
    if audit.kind not in KINDS:
        raise ConfigError(f"audit.kind: must be one of {KINDS}, got {audit.kind!r}")
    if audit.kind == "pate":
        from dpsub.audit.aggregator import check_options as check_pate

        check_pate(audit)
    positive = ("steps", "trials", "direct_trials", "canaries", "guesses", "norm_scale",
                "pilot_trials", "teachers")  # fmt: skip
    for key in positive:
        if key in audit and not audit[key] > 0:
            raise ConfigError(f"audit.{key}: must be > 0, got {audit[key]!r}")
    if not 0 < audit.alpha < 1:
        raise ConfigError(f"audit.alpha: must be in (0, 1), got {audit.alpha!r}")
    validate(cfg)
    return cfg, audit


def whitebox(cfg: DictConfig, audit: DictConfig) -> tuple[dict, object]:
    from dpsub.audit.whitebox import WhiteboxOptions, whitebox_audit
    from dpsub.training.build import build_run

    opts = {k: v for k, v in OmegaConf.to_container(audit).items() if k != "kind"}
    try:
        options = WhiteboxOptions(**opts)
    except (TypeError, ValueError) as e:
        raise ConfigError(str(e)) from None
    from dpsub.training.distributed import init_distributed

    run = build_run(cfg, dist=init_distributed(cfg.device))  # torchrun: every rank audits
    return whitebox_audit(run, options), run


def aggregator(cfg: DictConfig, audit: DictConfig) -> tuple[dict, None]:
    """``audit=pate``: the aggregator alone (no training run is built)."""
    from dpsub.audit.aggregator import audit_from_config

    return audit_from_config(audit, float(cfg.privacy.delta)), None


def audit_line(report: dict) -> str:
    lb = report["lower_bound"]
    gdp = report.get("gdp")
    fit = f" | mu-GDP fit {gdp['mu']:.4f} -> epsilon {gdp['epsilon']:.4f}" if gdp else ""
    nominal = report.get("epsilon_nominal")
    nom = f" (nominal {nominal:.4f})" if nominal is not None else ""
    t = report["trials"]
    n = (
        f"{t['in']}+{t['out']} trials"
        if "in" in t
        else f"{t['guesses']} guesses, {t['correct']} correct"
    )
    view = " (scored on its releases)" if report.get("view") == "releases" else ""
    return (
        f"audit: {report['kind']} {report['mechanism']}{view} | lower bound epsilon {lb['epsilon']:.4f} "
        f"({100 * lb['confidence']:.0f}% confidence, {n}){fit} | accountant epsilon "
        f"{report['epsilon_upper']:.4f}{nom} (delta={report['delta']})"
    )


def write(run_dir: Path, cfg: DictConfig, audit: DictConfig, report: dict, run) -> None:
    from dpsub.training.progress import attach_run_log

    run_dir.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(OmegaConf.merge(cfg, {"audit": audit}), run_dir / CONFIG)
    summary = {"epsilon": report["epsilon_upper"], "delta": report["delta"],
               "accountant": report["accountant"]}  # fmt: skip
    if run is not None:  # audit=pate builds no training run
        summary.update(steps=report["steps"], noise_multiplier=run.z)
    if report["kind"] == "onerun":
        from dpsub.training.loop import evaluate

        acc, loss = evaluate(run.model, run.data.test_x, run.data.test_y, cfg.train.eval_batch_size)
        summary.update(test_accuracy=acc, test_loss=loss)
    (run_dir / SUMMARY).write_text(json.dumps(summary, indent=2) + "\n")
    (run_dir / "audit.json").write_text(json.dumps(report, indent=2, default=float) + "\n")
    detach = attach_run_log(run_dir / LOG)
    try:
        log.info("%s | run dir %s", audit_line(report), run_dir)
    finally:
        detach()


def run_audit(cfg: DictConfig, run_dir: Path) -> dict:
    try:
        cfg, audit = split(cfg)
        if audit.kind == "whitebox":
            report, run = whitebox(cfg, audit)
        elif audit.kind == "pate":
            report, run = aggregator(cfg, audit)
        else:
            from dpsub.audit.onerun import onerun_audit

            report, run = onerun_audit(cfg, audit, log)
    except Exception as e:  # noqa: BLE001 -- dpsub's own errors become one line
        from dpsub.errors import exit_code

        if exit_code(e) is None:
            raise
        fail(e)
    if run is None or run.dist.main:
        write(run_dir, cfg, audit, report, run)
    if run is not None:
        run.dist.shutdown()
    return report


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="dpsub_audit")
def main(cfg: DictConfig) -> float:
    report = run_audit(cfg, job_dir(cfg))
    eps = report["lower_bound"]["epsilon"]
    return eps if math.isfinite(eps) else float("inf")


@interruptible
def cli() -> None:
    """Unknown groups, options and training keys: one line and exit 2 (as dpsub-train)."""
    import sys

    from dpsub.cli.common import check_args, run_dir_arg

    sys.argv[1:] = args = run_dir_arg(sys.argv[1:])
    check_args(args, config_name="dpsub_audit")
    main()


if __name__ == "__main__":
    cli()
