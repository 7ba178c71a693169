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

from dpsub.train import CONF_DIR, fail, job_dir

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
    from dpsub.errors import ConfigError, exit_code
    from dpsub.pate.run import split

    try:
        cfg, pate = split(cfg)
        check_environment(cfg)
        from dpsub.training.run import load_data, pick_device

        data, device = load_data(cfg), pick_device(str(cfg.device))
        from dpsub.pate.pool import public_split

        try:
            public, evaluation = public_split(len(data.test_y), pate.public_size)
        except ValueError as e:
            raise ConfigError(str(e)) from None
    except Exception as e:  # noqa: BLE001 -- dpsub's own errors become one line
        if exit_code(e) is None:
            raise
        fail(e)
    return _execute(cfg, pate, data, device, public, evaluation, run_dir, resume)


def _execute(cfg, pate, data, device, public, evaluation, run_dir: Path, resume: bool) -> dict:
    import numpy as np
    import torch

    from dpsub.pate.run import DD_NOTE, VOTES, answer_queries, compute_votes
    from dpsub.training.progress import attach_run_log

    run_dir.mkdir(parents=True, exist_ok=True)
    if not resume:
        OmegaConf.save(OmegaConf.merge(cfg, {"pate": pate}), run_dir / "config.yaml")
    detach = attach_run_log(run_dir / "train.log")
    try:
        torch.manual_seed(cfg.seed)
        log.info("pate: %s | %d teachers | public pool %d, evaluation %d", data.describe(),
                 pate.teachers, len(public), len(evaluation))  # fmt: skip
        votes_path = run_dir / VOTES
        if votes_path.is_file():
            votes = np.load(votes_path)
        else:
            votes = compute_votes(cfg, pate, data, data.test_x[public], device)
            votes_path.parent.mkdir(exist_ok=True)
            np.save(votes_path, votes)
        metrics = JsonlMetrics(run_dir / "metrics.jsonl")
        out = answer_queries(cfg, pate, votes, data.num_classes, run_dir, metrics)
        summary = _student(cfg, pate, data, device, public, evaluation, out)
        dd = ""
        if pate.get("data_dependent", False):  # unnoised private statistic: not covered
            summary.update(epsilon_data_dependent_note=DD_NOTE)
            dd = f"data-dependent epsilon {summary['epsilon_data_dependent']:.4f} (NOT a guarantee) | "
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        log.info(
            "final: test accuracy %.2f%% | epsilon %.4f (delta=%s, data-independent RDP) | "
            "%s%d queries, %d answered | covered by epsilon: %s | run dir %s",
            100 * summary["test_accuracy"], summary["epsilon"], cfg.privacy.delta, dd,
            summary["queries"], summary["answered"], summary["covered_by_epsilon"], run_dir,
        )  # fmt: skip
    finally:
        detach()
    return summary


def _student(cfg, pate, data, device, public, evaluation, out) -> dict:
    import torch

    from dpsub.models import build_model
    from dpsub.pate.student import StudentOptions, train_student
    from dpsub.training.trainer import evaluate

    ledger = out["ledger"]
    labels = torch.as_tensor(out["labels"], dtype=torch.long).reshape(-1, 2)
    if len(labels) == 0:
        from dpsub.errors import ConfigError

        why = "no query was answered within the budget: raise it or the aggregator's noise"
        fail(ConfigError(f"privacy.epsilon: {why}"))
    x = data.test_x[torch.as_tensor(public)][labels[:, 0]].to(device)
    y = labels[:, 1].to(device)
    mcfg = OmegaConf.to_container(cfg.model, resolve=True)
    torch.manual_seed(cfg.seed)
    model = build_model(mcfg.pop("name"), data.in_shape, data.num_classes, **mcfg).to(device)
    train_student(model, x, y, StudentOptions(**OmegaConf.to_container(pate.student)), cfg.seed)
    ev = torch.as_tensor(evaluation)
    acc, loss = evaluate(model, data.test_x[ev].to(device), data.test_y[ev].to(device),
                         cfg.train.eval_batch_size)  # fmt: skip
    correct = float((y.cpu() == data.test_y[torch.as_tensor(public)][labels[:, 0]]).float().mean())
    dd = bool(pate.get("data_dependent", False))
    out = {
        "test_accuracy": acc,
        "test_loss": loss,
        "epsilon": ledger.epsilon(),
        "delta": cfg.privacy.delta,
        "target_epsilon": cfg.privacy.epsilon,
        "accountant": "rdp (data-independent, PATE aggregator)",
        "aggregator": pate.aggregator,
        "teachers": pate.teachers,
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
    return out


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="dpsub_pate")
def main(cfg: DictConfig) -> float:
    return run_pate(cfg, job_dir(cfg))["test_accuracy"]


def resume(args: list[str]) -> None:
    """``resume=<run dir>`` alone: the run's own config; what is saved is not redone."""
    from dpsub.errors import ResumeError
    from dpsub.train import configure_logging

    run_dir = Path(args[0].split("=", 1)[1])
    if len(args) != 1 or not (run_dir / "config.yaml").is_file():
        fail(
            ResumeError(f"resume: needs a dpsub-pate run dir on its own (config.yaml); got {args}")
        )
    configure_logging()
    run_pate(OmegaConf.load(run_dir / "config.yaml"), run_dir, resume=True)


def cli() -> None:
    """Unknown groups, options and training keys: one line and exit 2 (as dpsub-train)."""
    from dpsub.train import check_args

    args = sys.argv[1:]
    if any(a.startswith("resume=") for a in args):
        resume(args)
        return
    check_args([a for a in args if not a.lstrip("+~").startswith(("pate.", "pate="))])
    check_pate_args(args)
    main()


def check_pate_args(args: list[str]) -> None:
    """``pate=OPTION`` and ``pate.KEY=VALUE`` name things that exist (one line, exit 2)."""
    from dpsub.errors import ConfigError
    from dpsub.pate.options import KEYS, STUDENT_KEYS, TEACHER_KEYS

    options = sorted(p.stem for p in (Path(CONF_DIR) / "pate").glob("*.yaml"))
    sub = {"teacher": TEACHER_KEYS, "student": STUDENT_KEYS}
    for arg in args:
        key, _, value = arg.lstrip("+~").partition("=")
        parts = key.split(".")
        if key == "pate" and value not in options:
            fail(ConfigError(f"pate: unknown option {value!r}; options: {', '.join(options)}"))
        elif parts[0] == "pate" and len(parts) > 1:
            known = parts[1] in KEYS and (len(parts) == 2 or parts[2] in sub.get(parts[1], ()))
            if not known or len(parts) > 3:
                fail(ConfigError(f"{key}: unknown key; valid: pate.{{{', '.join(sorted(KEYS))}}}"))


if __name__ == "__main__":
    cli()
