"""``dpsub-pate``: teachers, budgeted noisy answers, student (docs/pate.md).

Hydra composes ``conf/dpsub_pate.yaml``: the training config's groups (dataset, model,
privacy, ...) plus the ``pate/`` group. The config is checked first (one line, exit
code 2, nothing written); then the run writes ``config.yaml``, ``train.log``,
``metrics.jsonl``, ``summary.json`` and its resumable state (:mod:`dpsub.pate.run`).

    dpsub-pate dataset=mnist privacy.epsilon=2
    dpsub-pate resume=<run dir>        (continue a killed run with its own config)
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from dpsub.cli.common import CONF_DIR, fail, interruptible, job_dir

log = logging.getLogger("dpsub")


class JsonlMetrics:
    def __init__(self, path: Path):
        self.path = path

    def log(self, metrics: dict, step: int) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps({"step": step, **metrics}) + "\n")


def run_pate(cfg: DictConfig, run_dir: Path, resume: bool = False) -> dict:
    """Validate, then votes -> answers -> student; returns the summary."""
    from dpsub.config import check_environment
    from dpsub.errors import exit_code
    from dpsub.pate.run import split

    try:
        cfg, pate = split(cfg)
        check_environment(cfg)
        from dpsub.pate.pool import make_pools
        from dpsub.training.build import load_data, pick_device

        data, device = load_data(cfg), pick_device(str(cfg.device))
        from dpsub.pate.run import held_out, teacher_seed

        evaluate_held_out = bool(cfg.dataset.get("validation_size"))
        pools = make_pools(data, pate.public_size, held_out(cfg, pate), evaluate_held_out,
                           teacher_seed(cfg, pate))  # fmt: skip
        from dpsub.pate.run import check_release

        check_release(pate, pools.num_classes)
    except Exception as e:  # noqa: BLE001 -- dpsub's own errors become one line
        if exit_code(e) is None:
            raise
        fail(e)
    return _execute(cfg, pate, pools, device, run_dir, resume)


def _execute(cfg, pate, pools, device, run_dir: Path, resume: bool) -> dict:
    import torch

    from dpsub.errors import ConfigError
    from dpsub.pate.run import (
        DD_NOTE,
        RELEASED_NOTE,
        answer_queries,
        claim_run_dir,
        load_or_compute_votes,
        run_config,
    )
    from dpsub.training.progress import attach_run_log

    try:
        unlock = claim_run_dir(run_config(cfg, pate), run_dir, resume)
    except ConfigError as e:
        fail(e)
    if not resume:
        OmegaConf.save(OmegaConf.merge(cfg, {"pate": pate}), run_dir / "config.yaml")
    detach = attach_run_log(run_dir / "train.log")
    try:
        torch.manual_seed(cfg.seed)
        log.info("pate: %s | %d teachers | public pool %d, %s examples %d", pools.describe,
                 pate.teachers, len(pools.public_x), pools.eval_split, len(pools.eval_y))  # fmt: skip
        votes = load_or_compute_votes(cfg, pate, pools, device, run_dir)
        metrics = JsonlMetrics(run_dir / "metrics.jsonl")
        out = answer_queries(cfg, pate, votes, pools.num_classes, run_dir, metrics)
        summary = _student(cfg, pate, pools, device, out)
        dd = ""
        if pate.get("data_dependent", False):  # unnoised private statistic: not covered
            summary.update(epsilon_data_dependent_note=DD_NOTE)
            dd = f"data-dependent epsilon {summary['epsilon_data_dependent']:.4f} (NOT a guarantee) | "
        if "release" in summary:
            summary.update(epsilon_data_dependent_released_note=RELEASED_NOTE)
            dd += (f"released data-dependent epsilon {summary['epsilon_data_dependent_released']:.4f}"
                   f" (smooth sensitivity at order {summary['release']['order']:g}: a noisy "
                   "estimate, not a guarantee) | ")  # fmt: skip
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        log.info(
            "final: %s accuracy %.2f%% | epsilon %.4f (delta=%s, data-independent RDP) | "
            "%s%d queries, %d answered | covered by epsilon: %s | run dir %s",
            pools.eval_split, 100 * summary[f"{pools.eval_split}_accuracy"], summary["epsilon"],
            cfg.privacy.delta, dd, summary["queries"], summary["answered"],
            summary["covered_by_epsilon"], run_dir,
        )  # fmt: skip
    finally:
        detach()
        unlock()
    return summary


def _student(cfg, pate, pools, device, out) -> dict:
    import torch

    from dpsub.models import build_model
    from dpsub.pate.run import partition_kind
    from dpsub.pate.student import StudentOptions, student_data, train_student
    from dpsub.pate.votes import NEIGHBOURS
    from dpsub.training.loop import evaluate

    ledger, release = out["ledger"], out.get("release")
    labels = torch.as_tensor(out["labels"], dtype=torch.long).reshape(-1, 2)
    if len(labels) == 0:
        from dpsub.errors import ConfigError

        why = "no query was answered within the budget: raise it or the aggregator's noise"
        fail(ConfigError(f"privacy.epsilon: {why}"))
    x, y, unlabeled = (t.to(device) for t in student_data(pools, labels))
    mcfg = OmegaConf.to_container(cfg.model, resolve=True)
    torch.manual_seed(cfg.seed)
    model = build_model(mcfg.pop("name"), pools.in_shape, pools.num_classes, **mcfg).to(device)
    opts = StudentOptions(**OmegaConf.to_container(pate.student))
    train_student(model, x, y, opts, cfg.seed, unlabeled)
    acc, loss = evaluate(model, pools.eval_x.to(device), pools.eval_y.to(device),
                         cfg.train.eval_batch_size)  # fmt: skip
    correct = float((y.cpu() == pools.public_y[labels[:, 0]]).float().mean())
    dd = bool(pate.get("data_dependent", False))
    split = pools.eval_split  # "test", or "validation" (a tuning run: test never evaluated)
    out = {
        f"{split}_accuracy": acc,
        f"{split}_loss": loss,
        "epsilon": ledger.epsilon(),
        "delta": cfg.privacy.delta,
        "target_epsilon": cfg.privacy.epsilon,
        "accountant": "rdp (data-independent, PATE aggregator)",
        "aggregator": pate.aggregator,
        "teachers": pate.teachers,
        "neighbours": NEIGHBOURS[partition_kind(pate)],  # what epsilon's "one example" means
        "queries": ledger.queries,
        "answered": ledger.answered,
        "answered_label_accuracy": correct,  # against the public pool's own labels
        "stopped_by_budget": out["stopped_by_budget"],
        "rng": cfg.privacy.rng,
        # the student and its labels are post-processing of the noisy answers; the
        # data-dependent epsilon is not (a function of the unnoised votes): reported only
        # on request, and then the run is not covered (docs/privacy.md)
        "covered_by_epsilon": not dd,
    }
    if dd:
        out["epsilon_data_dependent"] = ledger.epsilon_data_dependent()
    if release is not None:  # noisy (smooth sensitivity), its cost in both epsilons: covered
        out["epsilon_data_dependent_released"] = release["epsilon"]
        out["release"] = release
    from dpsub.rundir import not_covered_statistics

    out["not_covered_statistics"] = not_covered_statistics(out)
    return out


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="dpsub_pate")
def main(cfg: DictConfig) -> float:
    summary = run_pate(cfg, job_dir(cfg))
    return summary.get("test_accuracy", summary.get("validation_accuracy"))


def resume(args: list[str]) -> None:
    """``resume=<run dir>`` alone: the run's own config; what is saved is not redone."""
    from dpsub.cli.common import configure_logging
    from dpsub.errors import ResumeError

    run_dir = Path(args[0].split("=", 1)[1])
    saved = run_dir / "config.yaml"
    if len(args) != 1 or not saved.is_file() or "pate" not in OmegaConf.load(saved):
        fail(ResumeError(
            f"resume: needs a dpsub-pate run dir (config.yaml with pate.*) on its own; got {args}"
        ))  # fmt: skip
    configure_logging()
    run_pate(OmegaConf.load(saved), run_dir, resume=True)


@interruptible
def cli() -> None:
    """Unknown groups, options and training keys: one line and exit 2 (as dpsub-train)."""
    from dpsub.cli.common import check_args, run_dir_arg

    args = sys.argv[1:]
    if any(a.startswith("resume=") for a in args):
        resume(args)
        return
    sys.argv[1:] = args = run_dir_arg(args)
    check_args(args, config_name="dpsub_pate")
    main()


if __name__ == "__main__":
    cli()
