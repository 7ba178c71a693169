"""Break each privacy property on purpose and check that a test catches it.

Every mutant below is one deliberate bug (halve a noise std, drop a clip, miscount N,
log private statistics by default...). For each, the script patches the source in
place, runs the tests that guard that property, restores the file (always, also on
Ctrl-C), and reports whether the tests caught it. A mutant that survives means the
suite has a gap. Run it from the repository root after changing a privacy-relevant
part of the code::

    uv run python scripts/mutation_check.py            # every mutant (162; 100 of them took 50 min at nice 19 beside a 2-thread lane, 2 cores)
    uv run python scripts/mutation_check.py --list     # what each mutant breaks
    uv run python scripts/mutation_check.py -k noise   # mutants whose name contains 'noise'

Exit code 1 if any mutant survives (or no longer applies: the pattern moved), or if a
mutant's test run leaves new untracked files in the checkout (a run under a mutant once
wrote toy results beside the committed tables, and they were committed).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from dataclasses import dataclass

from dpsub.paths import project_root

ROOT = project_root()  # the repository (an install: the working directory)


@dataclass(frozen=True)
class Mutant:
    name: str
    file: str
    old: str
    new: str
    tests: tuple[str, ...]


MUTANTS = (
    Mutant(
        "user-data-normalized-by-its-own-statistics",
        "src/dpsub/data/user.py",
        '    mean, std = _norm(user.get("mean"), user.get("std"), tr_x.shape[1])\n'
        "    return _Raw(tr_x, tr_y, te_x, te_y, classes, int(k), mean, std)",
        "    mean = tuple(tr_x.float().div(255).mean(dim=(0, 2, 3)).tolist())\n"
        "    std = tuple(tr_x.float().div(255).std(dim=(0, 2, 3)).tolist())\n"
        "    return _Raw(tr_x, tr_y, te_x, te_y, classes, int(k), mean, std)",
        ("tests/unit/test_user_data.py", "-k", "not_statistics"),
    ),
    Mutant(
        "user-data-classes-from-the-labels",
        "src/dpsub/data/user.py",
        '    k = user.get("num_classes")\n',
        '    k = int(max(a["y_train"].max(), a["y_test"].max())) + 1\n',
        ("tests/unit/test_user_data.py", "-k", "not_statistics"),
    ),
    Mutant(
        "loss-reduced-over-the-batch-accepted",
        "src/dpsub/grads/loss.py",
        "    if loss.shape != (outputs.shape[0],):",
        "    if False:",
        ("tests/unit/test_loss_fn.py", "-k", "batch_reduced"),
    ),
    Mutant(
        "api-releases-any-batch",
        "src/dpsub/api/private.py",
        "if drawn is None or x is not drawn[1] or y is not drawn[2]:",
        "if drawn is None:",
        ("tests/integration/test_api.py", "-k", "only_the_batch"),
    ),
    Mutant(
        "api-steps-beyond-the-plan",
        "src/dpsub/api/private.py",
        "        if self.run.step >= self.run.total_steps:\n            raise BudgetExhausted(",
        "        if False:\n            raise BudgetExhausted(",
        ("tests/integration/test_api.py", "-k", "beyond_the_plan"),
    ),
    Mutant(
        "row-with-overflowing-norm-kept",
        "src/dpsub/grads/clip.py",
        "    ok = torch.isfinite(norms)\n    if bool(ok.all()):",
        "    ok = torch.stack([finite_rows(_rows(t)) for t in parts]).all(0)\n"
        "    if bool(ok.all()):",
        ("tests/integration/test_hostile_inputs.py", "-k", "overflows or times_1e38"),
    ),
    Mutant(
        "dropped-row-not-zeroed",
        "src/dpsub/grads/clip.py",
        "t, torch.zeros_like(t)) for t in parts]",
        "t, t) for t in parts]",
        ("tests/integration/test_hostile_inputs.py", "-k", "moves_each_release"),
    ),
    Mutant(
        "residual-sum-keeps-a-non-finite-row",
        "src/dpsub/grads/clip.py",
        "        if not bool(keep.all()):",
        "        if False:",
        ("tests/integration/test_hostile_inputs.py", "-k", "residual_sum_drops"),
    ),
    Mutant(
        "refused-run-removes-a-dir-another-process-made",
        "src/dpsub/training/loop.py",
        "            run_dir.mkdir(parents=True)\n",
        "            run_dir.mkdir(parents=True, exist_ok=True)\n",
        ("tests/integration/test_run_dir.py", "-k", "never_removes"),
    ),
    Mutant(
        "features-normalized-on-private-train",
        "src/dpsub/features/__init__.py",
        'mean, std = public_stats(extract(public, "public"))',
        "mean, std = public_stats(train)",
        ("tests/unit/test_features.py", "-k", "private_split"),
    ),
    Mutant(
        "feature-extractor-mixing-the-batch-accepted",
        "src/dpsub/features/__init__.py",
        "    if not torch.allclose(together, alone, rtol=1e-3, atol=tol):",
        "    if False:",
        ("tests/unit/test_features.py", "-k", "mixes_the_batch"),
    ),
    Mutant(
        "efficientnet-input-normalized-by-the-batch",
        "src/dpsub/features/efficientnet.py",
        "        x = (x - self.mean) / self.std",
        "        x = (x - x.mean((0, 2, 3), keepdim=True)) / x.std((0, 2, 3), keepdim=True)",
        ("tests/unit/test_features.py", "-k", "efficientnet_input_normalization"),
    ),
    Mutant(
        "feature-cache-key-ignores-the-weights",
        "src/dpsub/features/efficientnet.py",
        '"name": name, "weights": file_hash(path),',
        '"name": name,',
        ("tests/unit/test_features.py", "-k", "invalidated_by_the_weights"),
    ),
    Mutant(
        "pate-data-dependent-epsilon-still-covered",
        "src/dpsub/cli/pate.py",
        '"covered_by_epsilon": not dd,',
        '"covered_by_epsilon": True,',
        ("tests/integration/test_pate_run.py",),
    ),
    Mutant(
        "simulated-run-marked-covered",
        "src/dpsub/training/loop.py",
        '        uncover(run, "simulated_noise")\n',
        "        pass\n",
        ("tests/integration/test_simulated_run.py", "-k", "labelled"),
    ),
    Mutant(
        "simulated-run-charged-the-reference-noise",
        "src/dpsub/privacy/run_account.py",
        "noise_multiplier, epsilon = simulation.noise_multiplier, math.inf",
        "noise_multiplier, epsilon = simulation.noise_multiplier_ref, math.inf",
        ("tests/unit/test_simulate.py", "-k", "charges_the_noise_drawn"),
    ),
    Mutant(
        "dpsgd-half-noise",
        "src/dpsub/mechanisms/dpsgd.py",
        'noisy, std = ctx.noise.release(clipped.sum, ctx.z, "gradient")',
        'noisy, std = ctx.noise.release(clipped.sum, 0.5 * ctx.z, "gradient")',
        ("tests/unit/test_mechanisms.py", "-k", "noise_std"),
    ),
    Mutant(
        "release-std-below-the-sensitivity",
        "src/dpsub/privacy/noise.py",
        "        std = noise_std(z, s.sensitivity)\n",
        "        std = noise_std(z, 0.5 * s.sensitivity)\n",
        ("tests/unit/test_mechanisms.py", "-k", "noise_std"),
    ),
    Mutant(
        "no-clipping",
        "src/dpsub/grads/clip.py",
        "factor = (bound / (norms + 1e-12)).clamp(max=1.0)",
        "factor = torch.ones_like(norms)",
        ("tests/unit/test_mechanisms.py", "-k", "sensitivity_is_clip"),
    ),
    Mutant(
        "noise-reused-across-steps",
        "src/dpsub/privacy/noise.py",
        "return torch.randn(tuple(shape), generator=self.generator, device=device)",
        "return torch.randn(tuple(shape), generator=torch.Generator(device).manual_seed(7), "
        "device=device)",
        ("tests/unit/test_mechanisms.py", "-k", "fresh"),
    ),
    Mutant(
        "bgep-half-noise",
        "src/dpsub/mechanisms/gep.py",
        "return noise_std(z, o.clip_embedding), 0.0",
        "return noise_std(0.5 * z, o.clip_embedding), 0.0",
        ("tests/unit/test_mechanisms.py", "-k", "bgep_noise_measured"),
    ),
    Mutant(
        "gep-residual-half-noise",
        "src/dpsub/mechanisms/gep.py",
        "noise_std(z2, o.clip_residual)",
        "noise_std(0.5 * z2, o.clip_residual)",
        ("tests/unit/test_mechanisms.py", "-k", "gep_noise_measured"),
    ),
    Mutant(
        "trainer-trusts-the-mechanism",
        "src/dpsub/privacy/run_account.py",
        "        if not z_rec >= z * (1 - REL_TOL):",
        "        if False:",
        ("tests/integration/test_run.py", "-k", "less_noise"),
    ),
    Mutant(
        "shaped-noise-charged-at-the-plan",
        "src/dpsub/privacy/noise.py",
        "self.records.append(NoiseRecord(name, s.sensitivity, std * smallest))",
        "self.records.append(NoiseRecord(name, s.sensitivity, std))",
        ("tests/unit/test_noise.py", "tests/integration/test_run.py", "-k", "least_noisy"),
    ),
    Mutant(
        "N-counted-before-public-removal",
        "src/dpsub/training/build.py",
        "    n_train = int(data.train_y.shape[0])",
        "    n_train = int(data.train_y.shape[0]) + (len(aux) if s.aux['name'] == 'public_train' else 0)",
        ("tests/integration/test_run.py", "-k", "public_examples"),
    ),
    Mutant(
        "non-finite-rows-kept",
        "src/dpsub/grads/clip.py",
        "    parts = [torch.where(ok.view(-1, *[1] * (t.dim() - 1)), t, torch.zeros_like(t)) "
        "for t in parts]\n",
        "",
        ("tests/unit/test_mechanisms.py", "-k", "non_finite"),
    ),
    Mutant(
        "ghost-first-layer-stride-and-dilation-swapped",
        "src/dpsub/grads/ghost.py",
        "stride=m.dilation, dilation=m.stride, groups=b,",
        "stride=m.stride, dilation=m.dilation, groups=b,",
        ("tests/unit/test_ghost.py", "-k", "first_layer"),
    ),
    Mutant(
        "ghost-norm-trusted-where-its-terms-cancel",
        "src/dpsub/grads/ghost.py",
        "    if T == 1:\n        return sq\n",
        "    if True:\n        return sq\n",
        ("tests/unit/test_ghost.py", "-k", "rounding_bound"),
    ),
    Mutant(
        "ghost-gram-in-float32",
        "src/dpsub/grads/ghost.py",
        "    A, B = A.double(), B.double()\n    return (torch.bmm",
        "    return (torch.bmm",
        ("tests/unit/test_ghost.py", "-k", "cancelling"),
    ),
    Mutant(
        "ghost-book-keeping-sum-in-the-working-dtype",
        "src/dpsub/grads/ghost.py",
        "functools.partial(_book, lay, io, exact=T > 1)",
        "functools.partial(_book, lay, io, exact=False)",
        ("tests/unit/test_ghost.py", "-k", "ride or reduced_precision"),
    ),
    Mutant(
        "no-step-0-checkpoint-before-the-first-release",
        "src/dpsub/training/loop.py",
        "    if run.step == 0 or run.reseeded:\n",
        "    if run.reseeded:\n",
        ("tests/integration/test_run_dir.py", "-k", "refuses_other"),
    ),
    Mutant(
        "ghost-row-buffer-shared-by-layers",
        "src/dpsub/grads/ghost.py",
        "        buf = self.buffers.get(key)\n",
        '        buf = self.buffers.get(key := "one")\n',
        ("tests/unit/test_ghost.py", "-k", "matches_reference_on_every_model"),
    ),
    Mutant(
        "clip-factor-on-the-first-parameter-only",
        "src/dpsub/grads/clip.py",
        "    total = torch.cat([c @ _rows(t) for t in parts])",
        "    total = torch.cat([(c if i == 0 else torch.ones_like(c)) @ _rows(t) "
        "for i, t in enumerate(parts)])",
        ("tests/unit/test_mechanisms.py", "-k", "sensitivity_is_clip"),
    ),
    Mutant(
        "budget-guard-refuses-everything",
        "src/dpsub/privacy/accountants.py",
        "            return eps <= self.budget + 1e-9",
        "            return False",
        ("tests/unit/test_privacy.py", "-k", "largest"),
    ),
    Mutant(  # a PRV ledger reporting its running RDP curve as the PRV epsilon
        "prv-ledger-reports-rdp",
        "src/dpsub/privacy/accountants.py",
        "    rdp_exact: ClassVar[bool] = False",
        "    rdp_exact: ClassVar[bool] = True",
        ("tests/unit/test_privacy.py", "tests/unit/test_account.py"),
    ),
    Mutant(  # dpsub runs Opacus' RDP search itself (no `import opacus` at start-up)
        "rdp-calibration-accepts-an-epsilon-over-the-target",
        "src/dpsub/privacy/accountants.py",
        "        if eps < epsilon:",
        "        if eps < 1.1 * epsilon:",
        ("tests/unit/test_privacy.py", "-k", "calibrat"),
    ),
    Mutant(
        "distributed-noise-added-per-rank",
        "src/dpsub/privacy/noise.py",
        "        return value + std * self.source.normal(value.shape, value.device).to(value.dtype)",
        "        noisy = s.value + std * self.source.normal(value.shape, value.device)\n"
        "        return noisy if self.reduce is None else self.reduce(noisy)",
        ("tests/integration/test_distributed.py", "-k", "noise_once"),
    ),
    Mutant(
        "private-metrics-logged-by-default",
        "src/dpsub/training/loop.py",
        "    if private:\n        metrics.update(window.private_metrics())",
        "    if True:\n        metrics.update(window.private_metrics())",
        ("tests/integration/test_train_e2e.py", "-k", "default_logs"),
    ),
    Mutant(
        "secure-ledger-not-persisted",
        "src/dpsub/training/loop.py",
        "        run.on_release.append(lambda r: r.ledger.save(run_dir / LEDGER_NAME, sync=True))",
        "        pass",
        ("tests/integration/test_run_dir.py", "-k", "secure_run_killed_before"),
    ),
    Mutant(
        "prv-trusts-a-fixed-plan-past-the-budget",
        "src/dpsub/privacy/accountants.py",
        "            return self.steps + 1 <= self._plan_steps_within_budget()",
        "            return True",
        ("tests/unit/test_privacy.py", "-k", "fixed_plan"),
    ),
    Mutant(
        "sweep-job-dir-named-by-a-resumable-setting",
        "src/dpsub/cli/sweeps.py",
        "    excluded = excluded or may_change\n",
        "    excluded = excluded or (lambda k: k in _EXCLUDED_BEFORE)\n",
        ("tests/unit/test_sweep_dirs.py",),
    ),
    Mutant(
        "run-without-checkpoint-started-again-as-new",
        "src/dpsub/training/loop.py",
        "        if started:\n            raise _refuse_new_run(",
        "        if False:\n            raise _refuse_new_run(",
        ("tests/integration/test_run_dir.py", "-k", "killed_before_its_first_checkpoint"),
    ),
    Mutant(
        "secure-restart-from-step-0-forgets-the-journal",
        "src/dpsub/training/loop.py",
        "        if journal is not None and journal.steps > run.ledger.steps:",
        "        if False:",
        ("tests/integration/test_run_dir.py", "-k", "killed_before_its_first_checkpoint"),
    ),
    Mutant(
        "sweep-job-without-checkpoint-started-again-as-new",
        "src/dpsub/cli/sweeps.py",
        "        return train_fn(cfg, run_dir, RunDir(run_dir).started)",
        "        return train_fn(cfg, run_dir, RunDir(run_dir).has_checkpoint)",
        ("tests/integration/test_sweeps.py", "-k", "began"),
    ),
    Mutant(
        "resume-accepts-changed-settings",
        "src/dpsub/training/checkpoint.py",
        "    keys = changed_keys(saved_config, config)",
        "    keys = []",
        ("tests/integration/test_train_e2e.py", "-k", "edited_config"),
    ),
    Mutant(
        "distributed-sums-not-reduced",
        "src/dpsub/training/build.py",
        "Privatizer(noise_source, reduce=dist.all_reduce if dist.active else None)",
        "Privatizer(noise_source, reduce=None)",
        ("tests/integration/test_distributed.py", "-k", "release_what"),
    ),
    Mutant(
        "rgp-half-noise",
        "src/dpsub/mechanisms/rgp.py",
        '        noisy, std = ctx.noise.release(clipped.sum, ctx.z, "carriers")',
        '        noisy, std = ctx.noise.release(clipped.sum, ctx.z / 2, "carriers")',
        ("tests/unit/test_rgp.py", "-k", "records_give"),
    ),
    Mutant(
        "rgp-head-scale-dropped",
        "src/dpsub/subspace/reparam.py",
        "params = {**params, name: p.detach() + s * (p - p.detach())}",
        "params = {**params, name: p.detach() + (p - p.detach())}",
        ("tests/unit/test_rgp.py", "-k", "authors_head"),
    ),
    Mutant(
        "pdpsgd-half-noise",
        "src/dpsub/mechanisms/pdpsgd.py",
        '        noisy, std = ctx.noise.release(clipped.sum, ctx.z, "gradient")',
        '        noisy, std = ctx.noise.release(clipped.sum, ctx.z / 2, "gradient")',
        ("tests/unit/test_pdpsgd.py", "-k", "epsilon_equals"),
    ),
    Mutant(
        "dphero-charged-the-nominal-multiplier",
        "src/dpsub/mechanisms/dphero.py",
        '        self.accounting = "planned" if self.floor else self.opts.accounting',
        '        self.accounting = "nominal"',
        ("tests/unit/test_dphero.py", "-k", "honest or accounting_option"),
    ),
    Mutant(
        "secure-sampler-halves-antithetic",  # coordinate pairs exact negatives: sums noiseless
        "src/dpsub/privacy/noise.py",
        "r * np.sin(theta)",
        "r * np.cos(theta + np.pi)",
        ("tests/unit/test_noise.py", "-k", "uncorrelated"),
    ),
    Mutant(
        "seeded-noise-antithetic",
        "src/dpsub/privacy/noise.py",
        "        return torch.randn(tuple(shape), generator=self.generator, device=device)",
        "        n = math.prod(shape)\n"
        "        h = torch.randn(((n + 1) // 2,), generator=self.generator, device=device)\n"
        "        return torch.cat([h, -h])[:n].reshape(tuple(shape))",
        ("tests/unit/test_noise.py", "-k", "uncorrelated"),
    ),
    Mutant(
        "ledger-file-not-fsynced",
        "src/dpsub/privacy/accountants.py",
        "                os.fsync(f.fileno())",
        "                pass",
        (
            "tests/unit/test_privacy.py",
            "tests/integration/test_run_dir.py",
            "-k",
            "durable or fsynced",
        ),
    ),
    Mutant(
        "ledger-rename-not-durable",
        "src/dpsub/privacy/accountants.py",
        "            fsync_dir(path.parent)",
        "            pass",
        (
            "tests/unit/test_privacy.py",
            "tests/integration/test_run_dir.py",
            "-k",
            "durable or fsynced",
        ),
    ),
    Mutant(
        "secure-ledger-not-fsynced",
        "src/dpsub/training/loop.py",
        "r.ledger.save(run_dir / LEDGER_NAME, sync=True)",
        "r.ledger.save(run_dir / LEDGER_NAME, sync=False)",
        ("tests/integration/test_run_dir.py", "-k", "fsynced"),
    ),
    Mutant(
        "run-dir-not-locked",
        "src/dpsub/training/checkpoint.py",
        "        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)",
        "        pass",
        ("tests/integration/test_run_dir.py", "-k", "lock_is_held"),
    ),
    Mutant(
        "light-checkpoint-from-a-mid-run-checkpoint",
        "src/dpsub/training/checkpoint.py",
        '    if not dropped or not state.get("clean", False):',
        "    if not dropped:",
        ("tests/integration/test_light_checkpoint.py", "-k", "only_a_clean"),
    ),
    Mutant(
        "light-resume-not-recorded",
        "src/dpsub/training/build.py",
        '        run.light_resumes.append({"step": run.step, "dropped": list(state["dropped"])})',
        "        pass",
        ("tests/integration/test_light_checkpoint.py", "-k", "says_so"),
    ),
    Mutant(
        "gpu-cell-override-of-any-key",
        "src/dpsub/experiments/gpu/cells.py",
        '        if "=" not in o or o.split("=", 1)[0] not in CELL_OVERRIDE_KEYS:',
        '        if "=" not in o:',
        ("tests/integration/test_gpu_kit.py", "-k", "bad_setup"),
    ),
    Mutant(
        "harvest-replaces-another-finished-run",
        "src/dpsub/experiments/gpu/cells.py",
        "    return summary.is_file() and summary.read_bytes() != incoming",
        "    return False",
        ("tests/integration/test_gpu_kit.py", "-k", "never_replaces"),
    ),
    Mutant(
        "copy-replaces-another-finished-run",
        "src/dpsub/experiments/make_table.py",
        "        if not same_dir and mine.is_file() and mine.read_bytes() != theirs.read_bytes():",
        "        if False:",
        ("tests/integration/test_simulated_table.py", "-k", "copy_only"),
    ),
    Mutant(
        "curves-simulated-row-unmarked",
        "src/dpsub/experiments/curves.py",
        '    return f"{text} ({variant}){raw}{tables.sim_mark(found, variant, cell)}"',
        '    return f"{text} ({variant}){raw}"',
        ("tests/integration/test_table_curves.py", "-k", "simulated"),
    ),
    Mutant(
        "decision-rule-without-its-test",
        "src/dpsub/experiments/make_table.py",
        '    if c.diff >= d["holds"] and c.p < stats.ALPHA:',
        '    if c.diff >= d["holds"]:',
        ("tests/integration/test_simulated_table.py", "-k", "decision_rule_gives"),
    ),
    Mutant(
        "gains-verdict-never-inconclusive",
        "src/dpsub/experiments/stats.py",
        "        if self.hi - self.lo > min(gain_a, gain_b):",
        "        if False:",
        ("tests/unit/test_stats.py", "-k", "gains_verdict"),
    ),
    Mutant(
        "coverage-forgotten-on-resume",
        "src/dpsub/training/build.py",
        '    run.uncovered = list(state.get("uncovered", []))',
        "    run.uncovered = []",
        ("tests/integration/test_coverage.py", "-k", "relabel"),
    ),
    Mutant(
        "membership-inference-run-covered",
        "src/dpsub/training/loop.py",
        '        uncover(run, "membership_inference")  # before',
        "        pass  # before",
        ("tests/integration/test_mia.py", "-k", "uncovers"),
    ),
    Mutant(
        "private-diagnostics-run-covered",
        "src/dpsub/training/loop.py",
        '        uncover(run, "private_diagnostics")',
        "        pass",
        ("tests/integration/test_train_e2e.py", "-k", "default_logs"),
    ),
    Mutant(
        "shuffle-run-covered",
        "src/dpsub/training/loop.py",
        '        uncover(run, "shuffle_sampling")',
        "        pass",
        ("tests/integration/test_coverage.py", "-k", "shuffle"),
    ),
    Mutant(
        "per-window-throughput-logged",
        "src/dpsub/training/loop.py",
        '        "z_eff": out.z_charged,\n',
        '        "z_eff": out.z_charged,\n        "steps_per_s": window.steps / 1.0,\n',
        ("tests/integration/test_coverage.py", "-k", "per_window"),
    ),
    Mutant(
        "summary-drops-not-covered-statistics",
        "src/dpsub/training/loop.py",
        '    summary["not_covered_statistics"] = not_covered_statistics(summary)\n',
        "",
        ("tests/integration/test_coverage.py", "-k", "unnoised_statistics"),
    ),
    Mutant(
        "secure-mode-logs-timing",
        "src/dpsub/training/loop.py",
        "    if run.secure or run.run_seconds <= 0:",
        "    if run.run_seconds <= 0:",
        ("tests/integration/test_coverage.py", "-k", "secure_mode_logs"),
    ),
    Mutant(
        "cpu-time-not-named-uncovered",
        "src/dpsub/rundir.py",
        '    "cpu_seconds": "CPU time of the training loops: grows with the number of private examples "\n'
        '    "the Poisson samples drew, no noise",\n',
        "",
        ("tests/integration/test_coverage.py", "-k", "throughput or tuning_run"),
    ),
    Mutant(
        "dphero-floor-dropped",
        "src/dpsub/mechanisms/dphero.py",
        "                s = s.clamp_min(1.0)",
        "                s = s",
        ("tests/unit/test_dphero.py", "-k", "floor"),
    ),
    Mutant(
        "audit-threshold-chosen-on-the-evaluated-trials",
        "src/dpsub/audit/bounds.py",
        "ev_in, ev_out = s_in[hi:], s_out[ho:]",
        "ev_in, ev_out = s_in[:hi], s_out[:ho]",
        ("tests/integration/test_audit.py", "-k", "never_saw"),
    ),
    Mutant(
        "audit-canary-not-clipped",
        "src/dpsub/audit/canary.py",
        "clipped, _ = clip_rows(self._canary(value.numel(), value.device)[None], clip)",
        "clipped = self._canary(value.numel(), value.device)[None]",
        ("tests/integration/test_audit.py", "-k", "clipped"),
    ),
    Mutant(
        "audit-gep-canary-without-residual-part",
        "src/dpsub/audit/canary.py",
        "return (s1 * e / e.norm() + s2 * r / r.norm()).float()",
        "return (s1 * e / e.norm() + 0 * r).float()",
        ("tests/unit/test_audit_canary.py",),
    ),
    Mutant(
        "audit-half-noise-scores",
        "src/dpsub/audit/whitebox.py",
        "step.update(std_out=s_out.std, check_error=",
        "step.update(std_out=s_out.std / 2, check_error=",
        ("tests/integration/test_audit.py", "-k", "one_over_z"),
    ),
    Mutant(
        "audit-canary-on-every-rank",
        "src/dpsub/audit/release.py",
        "self.canary.holder = run.dist.main",
        "self.canary.holder = True",
        ("tests/integration/test_audit_canary_rank.py",),
    ),
    Mutant(
        "onerun-delta-term-dropped",
        "src/dpsub/audit/bounds.py",
        "tail += float(window.max()) * delta * 2 * m",
        "tail += 0.0",
        ("tests/integration/test_audit.py", "-k", "papers_maximum"),
    ),
    Mutant(
        "amp-clipped-sum-in-bf16",
        "src/dpsub/grads/engine.py",
        "                grads, (loss, correct) = fn(params, xb, yb)\n            acc.add(",
        "                grads, (loss, correct) = fn(params, xb, yb)\n                acc.add(",
        ("tests/unit/test_amp.py", "-k", "float32"),
    ),
    Mutant(
        "augmult-views-averaged-after-clipping",
        "src/dpsub/grads/engine.py",
        "        fn = self.engine._per_example_fn(target, self.engine.views_of(x))\n"
        "        for xb, yb in self.engine._microbatches(x, y):\n"
        "            with self.engine.autocast(x.device):\n"
        "                grads, (loss, correct) = fn(params, xb, yb)\n"
        '            acc.add("grad", [grads[n] for n in target.layout.names], clip)',
        "        k = self.engine.views_of(x)\n"
        "        fn = self.engine._per_example_fn(target, 1)\n"
        "        xs = x.flatten(0, 1) if k > 1 else x\n"
        "        for xb, yb in self.engine._microbatches(xs, y.repeat_interleave(k)):\n"
        "            with self.engine.autocast(x.device):\n"
        "                grads, (loss, correct) = fn(params, xb, yb)\n"
        '            acc.add("grad", [grads[n] / k for n in target.layout.names], clip / k)',
        ("tests/unit/test_augmult.py", "-k", "average_of_the_views"),
    ),
    Mutant(
        "ema-saved-without-its-state",
        "src/dpsub/training/build.py",
        '**({"ema": run.ema.state_dict()} if run.ema is not None else {}),',
        '**({"ema": {"updates": 0, "avg": {}}} if run.ema is not None else {}),',
        ("tests/unit/test_ema.py", "-k", "resume_bit_exactly"),
    ),
    Mutant(
        "resume-on-another-device-from-mid-run-checkpoint",
        "src/dpsub/training/checkpoint.py",
        "        if not clean:\n",
        "        if False:\n",
        ("tests/integration/test_gpu_kit.py", "-k", "clean_checkpoint"),
    ),
    Mutant(
        "pate-gnmax-half-noise",
        "src/dpsub/pate/aggregators.py",
        "return counts + rng.normal(0.0, self.sigma, size=counts.shape)",
        "return counts + rng.normal(0.0, 0.5 * self.sigma, size=counts.shape)",
        ("tests/unit/test_pate.py", "-k", "gnmax_noise_std"),
    ),
    Mutant(
        "audit-pate-gnmax-half-noise",
        "src/dpsub/pate/aggregators.py",
        "return counts + rng.normal(0.0, self.sigma, size=counts.shape)",
        "return counts + rng.normal(0.0, 0.5 * self.sigma, size=counts.shape)",
        ("tests/integration/test_audit_pate.py", "-k", "below_the_ledgers"),
    ),
    Mutant(
        "pate-lnmax-half-noise",
        "src/dpsub/pate/aggregators.py",
        "noisy = counts + rng.laplace(0.0, self.scale, size=counts.shape)",
        "noisy = counts + rng.laplace(0.0, 0.5 * self.scale, size=counts.shape)",
        ("tests/unit/test_pate.py", "-k", "lnmax_noise"),
    ),
    Mutant(
        "pate-threshold-half-noise",
        "src/dpsub/pate/aggregators.py",
        "if counts.max() + rng.normal(0.0, self.sigma1) < self.threshold:",
        "if counts.max() + rng.normal(0.0, 0.5 * self.sigma1) < self.threshold:",
        ("tests/unit/test_pate.py", "-k", "confident_threshold"),
    ),
    Mutant(
        "pate-refused-query-free",
        "src/dpsub/pate/aggregators.py",
        "return Answer(None, (self.check_record(),))",
        "return Answer(None, ())",
        ("tests/unit/test_pate.py", "-k", "threshold"),
    ),
    Mutant(
        "pate-gnmax-rdp-halved",
        "src/dpsub/pate/accounting.py",
        "return orders * record.sensitivity**2 / (2.0 * record.scale**2)",
        "return orders * record.sensitivity**2 / (4.0 * record.scale**2)",
        ("tests/unit/test_pate.py", "-k", "numeric_composed or exact_gaussian"),
    ),
    Mutant(
        "pate-data-dependent-without-min",
        "src/dpsub/pate/accounting.py",
        "out[mask] = np.minimum(out[mask], log_s / lam)",
        "out[mask] = log_s / lam",
        ("tests/unit/test_pate.py", "-k", "data_dependent"),
    ),
    Mutant(
        "pate-partition-drops-a-teacher",
        "src/dpsub/pate/votes.py",
        "teacher_of[perm] = np.arange(n_examples) % n_teachers",
        "teacher_of[perm] = np.arange(n_examples) % max(1, n_teachers - 1)",
        ("tests/unit/test_pate.py", "-k", "partition"),
    ),
    Mutant(
        "pate-teacher-sees-all-data",
        "src/dpsub/pate/teachers.py",
        "orders = [p[torch.randperm(len(p), generator=g)] for p, g in zip(parts, gens, strict=True)]",
        "orders = [torch.randperm(int(torch.cat(parts).max()) + 1, generator=g) for g in gens]",
        ("tests/integration/test_pate_run.py", "-k", "vmapped"),
    ),
    Mutant(
        "pate-resume-fresh-noise",
        "src/dpsub/pate/run.py",
        'rng.bit_generator.state = state["rng"]',
        "pass",
        ("tests/integration/test_pate_run.py", "-k", "resume"),
    ),
    Mutant(
        "pate-public-pool-overlaps-evaluation",
        "src/dpsub/pate/pool.py",
        "return np.arange(public_size), np.arange(public_size, n_test)",
        "return np.arange(public_size), np.arange(public_size - 1, n_test)",
        ("tests/unit/test_pate.py", "-k", "overlaps"),
    ),
    Mutant(
        "pate-student-reads-the-private-training-set",
        "src/dpsub/pate/student.py",
        "return public_x[labels[:, 0]], labels[:, 1], public_x[~answered]",
        "return public_x[labels[:, 0]], labels[:, 1], torch.cat([public_x[~answered], "
        "pools.train_x[:8]])",
        ("tests/unit/test_pate_student.py", "-k", "never_reads"),
    ),
    Mutant(
        "pate-smooth-local-sensitivity-halved",
        "src/dpsub/pate/smooth.py",
        "return BoundGrid(step, r, b, np.maximum(np.maximum(up, down), 0.0))",
        "return BoundGrid(step, r, b, 0.5 * np.maximum(np.maximum(up, down), 0.0))",
        ("tests/unit/test_pate_smooth.py", "-k", "brute_force"),
    ),
    Mutant(
        "pate-smooth-release-noise-halved",
        "src/dpsub/pate/smooth.py",
        "rdp_at_order + ss * sigma * rng.normal()",
        "rdp_at_order + 0.5 * ss * sigma * rng.normal()",
        ("tests/unit/test_pate_smooth.py", "-k", "noise_of_the_smooth"),
    ),
    Mutant(
        "pate-smooth-release-cost-dropped",
        "src/dpsub/pate/smooth.py",
        "eps = rdp_to_epsilon(np.array([noisy + cost]), delta, [order])",
        "eps = rdp_to_epsilon(np.array([noisy]), delta, [order])",
        ("tests/unit/test_pate_smooth.py", "-k", "noise_of_the_smooth"),
    ),
    Mutant(
        "pate-smooth-release-cost-not-in-epsilon",
        "src/dpsub/pate/run.py",
        "ledger = PateLedger(cfg.privacy.delta, cfg.privacy.epsilon, rdp_reserved=reserved(pate))",
        "ledger = PateLedger(cfg.privacy.delta, cfg.privacy.epsilon)",
        ("tests/integration/test_pate_run.py", "-k", "smooth_sensitivity_release"),
    ),
    Mutant(
        "pate-hash-partition-by-position",
        "src/dpsub/pate/votes.py",
        "return (h % np.uint64(n_teachers)).astype(np.int64)",
        "return partition(len(rows), n_teachers, seed)",
        ("tests/unit/test_pate.py", "-k", "hash_partition_keeps"),
    ),
    Mutant(
        "pate-teacher-epoch-from-its-chunk",
        "src/dpsub/pate/teachers.py",
        "own = torch.tensor([math.ceil(len(p) / opts.batch_size) for p in parts])",
        "own = torch.tensor([max(math.ceil(len(p) / opts.batch_size) for p in parts)] * len(parts))",
        ("tests/integration/test_pate_run.py", "-k", "neighbours_sizes"),
    ),
    Mutant(
        "pate-run-dir-continued-without-resume",
        "src/dpsub/pate/run.py",
        "if not resume and (saved.is_file() or (run_dir / STATE).is_file()):",
        "if False:",
        ("tests/integration/test_pate_run.py", "-k", "holding_a_run"),
    ),
    Mutant(
        "pate-resume-under-other-settings",
        "src/dpsub/pate/run.py",
        'check_resume(OmegaConf.to_container(OmegaConf.load(saved)), config, None, "")',
        "pass",
        ("tests/integration/test_pate_run.py", "-k", "other_settings"),
    ),
    Mutant(
        "selection-run-over-its-bound-accepted",
        "src/dpsub/api/selection.py",
        "        _check_run(ledger, bound)\n",
        "        pass\n",
        ("tests/unit/test_selection.py", "-k", "over_its_declared_bound"),
    ),
    Mutant(
        "selection-score-released-without-noise",
        "src/dpsub/api/selection.py",
        "score = float(correct) + score_sigma * normal()",
        "score = float(correct)",
        ("tests/unit/test_selection.py", "-k", "released_score"),
    ),
    Mutant(
        "selection-score-noise-not-charged",
        "src/dpsub/privacy/selection.py",
        "base = np.asarray(run_rdp, dtype=np.float64) + gaussian_rdp(score_sigma, orders)",
        "base = np.asarray(run_rdp, dtype=np.float64)",
        ("tests/unit/test_selection.py", "-k", "costs_more"),
    ),
    Mutant(
        "selection-tnb-without-log-mean",
        "src/dpsub/privacy/selection.py",
        "out[live] = r[live] + log_mean / (a[live] - 1) + const",
        "out[live] = r[live] + const",
        ("tests/unit/test_selection.py", "-k", "independent"),
    ),
    Mutant(
        "selection-poisson-without-delta-hat",
        "src/dpsub/privacy/selection.py",
        "out[i] = r[i] + repetitions.mean * d_hat + log_mean / (a[i] - 1)",
        "out[i] = r[i] + log_mean / (a[i] - 1)",
        ("tests/unit/test_selection.py", "-k", "independent"),
    ),
    Mutant(
        "selection-poisson-sampler-never-zero",
        "src/dpsub/privacy/selection.py",
        "k, cdf = (0, 0.0) if self.poisson else (1, 0.0)",
        "k, cdf = (1, 0.0)",
        ("tests/unit/test_selection.py", "-k", "sampler"),
    ),
    Mutant(
        "select-search-folder-kept",
        "src/dpsub/cli/select.py",
        "    shutil.rmtree(scratch, ignore_errors=True)\n    record = {",
        "    record = {",
        ("tests/integration/test_select_cli.py", "-k", "keeps_the_best"),
    ),
    Mutant(
        "select-runs-print-to-the-console",
        "src/dpsub/cli/select.py",
        "propagate, log.propagate = log.propagate, False",
        "propagate = log.propagate",
        ("tests/integration/test_select_cli.py", "-k", "keeps_the_best"),
    ),
    Mutant(
        "select-seed-counts-the-runs",
        "src/dpsub/cli/select.py",
        "s = _with(by_key[cand], seed=next(seeds), out_dir=str(args.out))",
        "s = _with(by_key[cand], seed=int(run_dir.name), out_dir=str(args.out))",
        ("tests/integration/test_select_cli.py", "-k", "keeps_the_best"),
    ),
    Mutant(
        "select-bound-of-the-first-candidate",
        "src/dpsub/cli/select.py",
        "return settings, np.max(curves, axis=0), repetitions",
        "return settings, curves[0], repetitions",
        ("tests/integration/test_select_cli.py", "-k", "largest_plan"),
    ),
    Mutant(
        "select-non-poisson-sampling-accepted",
        "src/dpsub/cli/select.py",
        '("privacy.sampling", p.sampling != "poisson"),',
        '("privacy.sampling", False),',
        ("tests/integration/test_select_cli.py", "-k", "mistake"),
    ),
    Mutant(
        "validation-pick-uniform-reads-the-labels",
        "src/dpsub/data/validation.py",
        '        elif pick == "uniform":',
        '        elif pick == "never":',
        ("tests/unit/test_data.py", "-k", "uniform_validation"),
    ),
    Mutant(
        "validation-pick-hash-by-position",
        "src/dpsub/data/validation.py",
        "            idx = hashed_pick(data.train_x, data.train_y, size / n, SEED_OFFSET)  # (no seed)",
        "            idx = random_pick(n, size, g)",
        ("tests/unit/test_data.py", "-k", "hash_validation"),
    ),
    Mutant(
        "select-takes-a-subset-drawn-with-each-runs-seed",
        "src/dpsub/cli/select.py",
        "    if s.dataset.train_size is not None:  # drawn with each run's own seed",
        "    if False:  # drawn with each run's own seed",
        ("tests/integration/test_select_cli.py", "-k", "subset_drawn"),
    ),
    Mutant(
        "select-holds-out-by-position",
        "src/dpsub/cli/select.py",
        'FORCED = ("dataset.validation_pick=hash",',
        'FORCED = ("dataset.validation_pick=uniform",',
        ("tests/integration/test_select_cli.py", "-k", "keeps_the_best_run"),
    ),
    Mutant(
        "checkpoint-fingerprint-unkeyed",
        "src/dpsub/training/checkpoint.py",
        "h = hmac.new(key, digestmod=hashlib.sha256) if key is not None else hashlib.sha256()",
        "h = hashlib.sha256()",
        (
            "tests/integration/test_fingerprint_key.py",
            "tests/integration/test_select_cli.py",
            "-k",
            "secret_key or plain_hash",
        ),
    ),
    Mutant(
        "resume-without-the-fingerprint-key-accepted",
        "src/dpsub/training/loop.py",
        'if ckpt.get("data_fingerprint_keyed") and fingerprint_key(run_dir) is None:',
        "if False:",
        ("tests/integration/test_fingerprint_key.py", "-k", "without_the_key"),
    ),
    Mutant(
        "tune-extension-chosen-on-test-accuracy",
        "src/dpsub/experiments/tables.py",
        'scores = [read_summary(j.dir).get("validation_accuracy", -math.inf) for j in jobs]',
        'scores = [read_summary(j.dir).get("test_accuracy", -math.inf) for j in jobs]',
        ("tests/integration/test_gpu_kit.py", "-k", "extends_its_edge"),
    ),
    Mutant(
        "private-table-shows-a-runs-epsilon-as-the-searchs",
        "src/dpsub/experiments/private_tables.py",
        """f"{max(r['epsilon'] for r in recs):.3f} | {kept} | {vs} |\"""",
        """f"{max(r['epsilon_of_each_run'] for r in recs):.3f} | {kept} | {vs} |\"""",
        ("tests/integration/test_private_tables.py", "-k", "search_cost"),
    ),
    Mutant(
        "api-rollback-lowers-what-the-session-spent",
        "src/dpsub/api/releases.py",
        "            if rid not in held and account.ledger is not None:",
        "            if False:",
        ("tests/integration/test_api.py", "-k", "rollback_never_lowers"),
    ),
    Mutant(
        "api-state-of-another-session-drops-inherited-releases",
        "src/dpsub/api/releases.py",
        "        self.known = {**held, **self.known}",
        "        self.known = dict(self.known)",
        ("tests/integration/test_api.py", "-k", "between_sessions"),
    ),
    Mutant(
        "api-release-ids-repeat-across-sessions",
        "src/dpsub/api/releases.py",
        "        rid = secrets.token_hex(12)",
        "        rid = str(len(self.known))",
        ("tests/integration/test_api.py", "-k", "between_sessions"),
    ),
    Mutant(
        "api-checkpoints-with-equal-ledgers-taken-for-one-set-of-releases",
        "src/dpsub/api/releases.py",
        "    return {secrets.token_hex(12): (zq, pair(i)) for i, zq in enumerate(honest)}",
        '    return {f"state:{i}": (zq, pair(i)) for i, zq in enumerate(honest)}',
        ("tests/integration/test_api.py", "-k", "between_sessions"),
    ),
    Mutant(
        "two-lanes-share-a-sweep-folder",
        "src/dpsub/experiments/reproduce.py",
        '    return Path(tempfile.mkdtemp(prefix=f"{stamp}_", dir=base / ".sweeps"))',
        '    return base / ".sweeps" / stamp',
        ("tests/unit/test_sweep_dirs.py", "-k", "same_second"),
    ),
    Mutant(
        "api-state-of-another-privacy-setting-accepted",
        "src/dpsub/api/releases.py",
        "        if theirs.get(key) != getattr(ledger, key):",
        "        if False:",
        ("tests/integration/test_api.py", "-k", "another_privacy_setting"),
    ),
    Mutant(
        "a-release-with-a-direction-without-noise-charged",
        "src/dpsub/privacy/run_account.py",
        "            if not z_rec > 0:\n",
        "            if False:\n",
        ("tests/unit/test_dphero.py", "-k", "without_noise"),
    ),
    Mutant(
        "api-journal-not-read-back-after-a-crash",
        "src/dpsub/api/releases.py",
        "        for honest, nominal in held.values():",
        "        for honest, nominal in {}.values():",
        ("tests/integration/test_api_journal.py", "-k", "crashed"),
    ),
    Mutant(
        "feature-cache-named-by-an-unkeyed-hash-of-the-private-images",
        "src/dpsub/features/cache.py",
        'path = folder / f"{cache_key(ident, x, image_size, secret_key(folder))}.pt"',
        'path = folder / f"{cache_key(ident, x, image_size)}.pt"',
        ("tests/unit/test_features.py", "-k", "killed_extraction"),
    ),
    Mutant(
        "imagefolder-channels-decided-by-the-private-images",
        "src/dpsub/data/user.py",
        "    gray = all(im.ndim == 2 for _, im in te)",
        "    gray = all(im.ndim == 2 for _, im in tr + te)",
        ("tests/unit/test_user_data.py", "-k", "channels"),
    ),
    Mutant(
        "secure-checkpoint-keeps-the-augment-stream",
        "src/dpsub/training/build.py",
        "            gens[UNSAVED_AUGMENT] = torch.Generator(",
        '            gens["augment"] = torch.Generator(',
        ("tests/integration/test_coverage.py", "-k", "stream_that_counts"),
    ),
    Mutant(
        "secure-checkpoint-keeps-its-timing",
        "src/dpsub/training/build.py",
        "**({} if run.secure else {",
        "**({} if False else {",
        ("tests/integration/test_coverage.py", "-k", "stream_that_counts"),
    ),
    Mutant(
        "augmult-views-drawn-per-rank",
        "src/dpsub/training/build.py",
        "        x = run.dist.shard(run.engine.augmult.views(run.data.train_x[batch]))",
        "        x = run.engine.augmult.views(x)",
        ("tests/integration/test_distributed.py", "-k", "release_what_one_process"),
    ),
    Mutant(
        "secure-checkpoint-keeps-the-shuffle-permutation",
        "src/dpsub/training/build.py",
        '        **({"sampler": None} if run.secure else {}),\n',
        "",
        ("tests/integration/test_coverage.py", "-k", "shuffle_permutation"),
    ),
    Mutant(
        "a-release-that-is-not-finite-applied",
        "src/dpsub/training/build.py",
        "    if acct.private and not bool(torch.isfinite(res.grad).all()):\n",
        "    if False:\n",
        ("tests/integration/test_api.py", "-k", "not_finite"),
    ),
    Mutant(
        "pate-votes-named-by-their-settings-only",
        "src/dpsub/pate/run.py",
        '    return hashlib.sha256(f"{votes_key(cfg, pate)}:{data}".encode()).hexdigest()[:24]',
        "    return votes_key(cfg, pate)",
        ("tests/integration/test_pate_run.py", "-k", "named_by"),
    ),
    Mutant(
        "pate-held-out-drawn-with-the-runs-seed",
        "src/dpsub/cli/pate.py",
        "                           teacher_seed(cfg, pate))  # fmt: skip",
        "                           cfg.seed)  # fmt: skip",
        ("tests/integration/test_pate_run.py", "-k", "shared_teacher_seed"),
    ),
    Mutant(
        "pate-private-curve-read-whatever-its-count",
        "src/dpsub/pate/run.py",
        '        if curve.get("next", queries) == queries and "rdp_data_dependent" in curve:',
        '        if "rdp_data_dependent" in curve:',
        ("tests/integration/test_pate_run.py", "-k", "kill_between"),
    ),
    Mutant(
        "private-files-left-to-the-umask",
        "src/dpsub/rundir.py",
        'O_CREAT | os.O_TRUNC, 0o600)\n    if hasattr(os, "fchmod"):  # (a file left by a crash keeps its mode through O_CREAT)\n        os.fchmod(fd, 0o600)',
        'O_CREAT | os.O_TRUNC, 0o666)\n    if hasattr(os, "fchmod"):  # (a file left by a crash keeps its mode through O_CREAT)\n        os.fchmod(fd, 0o666)',
        ("tests/integration/test_pate_run.py", "-k", "owners_alone"),
    ),
    Mutant(
        "pate-data-dependent-curve-in-the-public-state",
        "src/dpsub/pate/run.py",
        'public.pop("rdp_data_dependent")',
        'public.get("rdp_data_dependent")',
        ("tests/integration/test_pate_run.py", "-k", "end_to_end"),
    ),
    Mutant(
        "public-part-picked-with-the-private-labels",
        "src/dpsub/data/aux.py",
        '    if pick == "balanced":\n        return _split_off(data, "train"',
        '    if True:\n        return _split_off(data, "train"',
        ("tests/unit/test_pdpsgd.py", "-k", "moves_no_other"),
    ),
    Mutant(
        "balanced-public-part-left-covered",
        "src/dpsub/training/loop.py",
        'uncover(run, "public_part_chosen_with_private_labels")',
        "pass",
        ("tests/unit/test_pdpsgd.py", "-k", "not_covered"),
    ),
    Mutant(
        "api-classes-read-from-the-private-labels",
        "src/dpsub/api/private.py",
        "    num_classes = _classes(model, x, y, num_classes)",
        "    num_classes = int(y.max()) + 1",
        ("tests/integration/test_api.py", "-k", "anchors_labels"),
    ),
    Mutant(
        "api-non-private-session-takes-a-private-state",
        "src/dpsub/api/private.py",
        '    if (acct.ledger is None) != (state.get("ledger") is None):',
        '    if acct.ledger is not None and state.get("ledger") is None:',
        ("tests/integration/test_api.py", "-k", "non_private_session_refuses"),
    ),
    Mutant(
        "api-seeded-rollback-replays-the-same-noise",
        "src/dpsub/api/private.py",
        "        if again:  # a replay",
        "        if False:  # a replay",
        ("tests/integration/test_api.py", "-k", "fresh_noise"),
    ),
    Mutant(
        "api-seeded-fork-shares-the-noise",
        "src/dpsub/api/private.py",
        "        _fresh_streams(fork.run)",
        "        pass",
        ("tests/integration/test_api.py", "-k", "fresh_noise"),
    ),
    Mutant(
        "api-state-of-another-accounting-policy-accepted",
        "src/dpsub/api/private.py",
        '    if acct.ledger is not None and (acct.nominal is None) != (state.get("nominal") is None):',
        "    if False:",
        ("tests/integration/test_api.py", "-k", "another_accounting_policy"),
    ),
    Mutant(
        "api-journal-short-write-left-as-it-is",
        "src/dpsub/api/releases.py",
        "                while done < len(data):\n                    done += os.write(fd, data[done:])",
        "                os.write(fd, data)",
        ("tests/integration/test_api_journal.py", "-k", "disk_refuses"),
    ),
    Mutant(
        "api-journal-refused-row-never-written",
        "src/dpsub/api/releases.py",
        "        self.unwritten.update(releases)",
        "        self.unwritten = dict(releases)",
        ("tests/integration/test_api_journal.py", "-k", "disk_refuses"),
    ),
    Mutant(
        "api-journal-refused-release-left-out-of-the-book",
        "src/dpsub/api/releases.py",
        "        self.known[rid] = (last(account.ledger), nominal)  # first",
        "        self.journal and self.journal.append({rid: (last(account.ledger), nominal)})\n"
        "        self.known[rid] = (last(account.ledger), nominal)  # first",
        ("tests/integration/test_api_journal.py", "-k", "disk_refuses"),
    ),
    Mutant(
        "api-journal-misses-a-loaded-states-releases",
        "src/dpsub/api/releases.py",
        "            self.journal.append({r: c for r, c in held.items() if r not in self.known})",
        "            pass",
        ("tests/integration/test_api_journal.py", "-k", "other_sessions"),
    ),
    Mutant(
        "api-journal-of-another-privacy-setting-accepted",
        "src/dpsub/api/releases.py",
        '        if differs:\n            raise ValueError(f"journal:',
        '        if False:\n            raise ValueError(f"journal:',
        ("tests/integration/test_api_journal.py", "-k", "another_privacy_setting"),
    ),
    Mutant(
        "secure-resume-without-its-ledger-journal",
        "src/dpsub/training/loop.py",
        "        if run.ledger.steps and (journal is None or journal.steps < run.ledger.steps):",
        "        if False:",
        ("tests/integration/test_run_dir.py", "-k", "journal"),
    ),
    Mutant(
        "reseeded-resume-leaves-the-old-devices-checkpoint",
        "src/dpsub/training/loop.py",
        "    if run.step == 0 or run.reseeded:\n",
        "    if run.step == 0:\n",
        ("tests/integration/test_run_dir.py", "-k", "reseeds"),
    ),
    Mutant(
        "api-failed-load-leaves-the-states-ledger-and-weights",
        "src/dpsub/api/private.py",
        "            load_run_state(self.run, kept)",
        "            pass",
        ("tests/integration/test_api.py", "-k", "failed_load"),
    ),
    Mutant(
        "api-rollback-drops-the-nominal-charges",
        "src/dpsub/api/releases.py",
        "                    account.nominal.step(*nominal)",
        "                    pass",
        ("tests/integration/test_api.py", "-k", "nominal_ledger"),
    ),
    Mutant(
        "private-search-log-keeps-the-clock-times",
        "src/dpsub/experiments/private_tables.py",
        'return _CLOCK.sub("", text)',
        "return text",
        ("tests/integration/test_private_tables.py", "-k", "stopped_one"),
    ),
    Mutant(
        "private-search-run-by-two-lanes-at-once",
        "src/dpsub/experiments/private_tables.py",
        'return lock_run_dir(where, "private")',
        "return lambda: None",
        ("tests/integration/test_private_tables.py", "-k", "another_process"),
    ),
    Mutant(
        "private-search-under-another-law-counted-as-done",
        "src/dpsub/experiments/private_tables.py",
        'return "stale:" + ",".join(changed) if changed else "done"',
        'return "done"',
        ("tests/integration/test_private_tables.py", "-k", "another_law"),
    ),
    Mutant(
        "resume-accepts-any-value-of-a-key-added-later",
        "src/dpsub/training/checkpoint.py",
        "return other is _ABSENT or other == ADDED_LATER[key]",
        "return True",
        (
            "tests/unit/test_added_later.py",
            "tests/integration/test_tables.py",
            "-k",
            "old_behaviour or before_a_key",
        ),  # fmt: skip
    ),
)


def untracked() -> set[str]:
    """The checkout's untracked, not ignored files (a test under a mutant must add none)."""
    cmd = ["git", "ls-files", "--others", "--exclude-standard"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    return set(proc.stdout.splitlines()) if proc.returncode == 0 else set()


def run_mutant(m: Mutant) -> str:
    path = ROOT / m.file
    original = path.read_text()
    if m.old not in original:
        return "PATTERN MOVED"
    before = untracked()
    try:
        path.write_text(original.replace(m.old, m.new, 1))
        cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:logging", *m.tests]
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    finally:
        path.write_text(original)
    left = sorted(untracked() - before)
    if left:  # a mutant's run wrote into the checkout: it could be committed as a result
        return f"LEFT {len(left)} FILES in the checkout (first: {left[0]})"
    return "caught" if proc.returncode == 1 else f"SURVIVED (pytest exit {proc.returncode})"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-k", default="", help="only mutants whose name contains this")
    p.add_argument("--list", action="store_true", help="list the mutants and exit")
    args = p.parse_args(argv)
    chosen = [m for m in MUTANTS if args.k in m.name]
    if args.list:
        for m in chosen:
            print(f"{m.name:36s} {m.file}: {m.old.strip().splitlines()[0][:60]!r}")
        return 0
    bad = 0
    for m in chosen:
        verdict = run_mutant(m)
        bad += verdict != "caught"
        print(f"{m.name:36s} {verdict}", flush=True)
    print(f"{len(chosen) - bad} of {len(chosen)} mutants caught")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
