"""Seeded fingerprints of short training runs: behaviour unchanged across a redesign.

    uv run --frozen python tests/fingerprint.py --out DIR            # record
    uv run --frozen python tests/fingerprint.py --out DIR2 --compare DIR   # check

Each case is a short seeded training run (composed as ``dpsub-train`` composes it) (every mechanism, the vmap / opacus / ghost
backends where they apply) on a 512-example MNIST subset (``DPSUB_DATA`` must hold MNIST).
Its fingerprint is the SHA-256 of the checkpoint's state (every tensor's bytes, every other
value's repr; the saved config left out), of ``metrics.jsonl``, ``ledger.json`` and
``summary.json`` with the wall-clock keys dropped. ``--compare`` exits 1 on any difference.
Runs use one torch thread (two make CPU reductions nondeterministic).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path

COMMON = (
    "dataset=mnist dataset.train_size=512 train.batch_size=64 train.max_steps=3 "
    "train.eval_every=0 train.log_every=1 train.checkpoint_every=0 logger=disabled "
    "seed=3"
).split()
#: name -> extra overrides
CASES = {
    "dpsgd": ["mechanism=dpsgd"],
    "dpsgd_opacus": ["mechanism=dpsgd", "grads.backend=opacus"],
    "dpsgd_ghost": ["mechanism=dpsgd", "grads.backend=ghost"],
    "gep": ["mechanism=gep", "mechanism.num_bases=10", "aux.num_samples=64"],
    "gep_opacus": [
        "mechanism=gep",
        "mechanism.num_bases=10",
        "aux.num_samples=64",
        "grads.backend=opacus",
    ],
    "bgep": ["mechanism=bgep", "mechanism.num_bases=10", "aux.num_samples=64"],
    "pdpsgd": ["mechanism=pdpsgd", "mechanism.num_bases=10", "aux.num_samples=64"],
    "rpdpsgd": ["mechanism=rpdpsgd", "mechanism.num_bases=10"],
    "rgp": ["mechanism=rgp", "mechanism.rank=2", "mechanism.warmup_steps=1"],
    "rgp_ghost": ["mechanism=rgp", "mechanism.rank=2", "grads.backend=ghost"],
    "rgp_random": ["mechanism=rgp_random", "mechanism.rank=2"],
    "dppowersgd": ["mechanism=dppowersgd", "mechanism.rank=2"],
    "dppowersgd_ghost": ["mechanism=dppowersgd", "mechanism.rank=2", "grads.backend=ghost"],
    "dphero": ["mechanism=dphero", "privacy.noise_multiplier=1.0", "privacy.epsilon=1e12"],
    "nonprivate": ["mechanism=nonprivate"],
    "dpsgd_linear_eps": ["mechanism=dpsgd", "model=linear", "privacy.epsilon=4"],
}
WALL_CLOCK = ("time", "seconds", "per_s")


def _feed(h, obj) -> None:
    """Hash a nested checkpoint value: tensors by dtype, shape and bytes; others by repr."""
    import torch

    if isinstance(obj, dict):
        for k in sorted(obj, key=str):
            if any(w in str(k) for w in WALL_CLOCK):  # run_seconds: wall clock
                continue
            h.update(f"<{k}>".encode())
            _feed(h, obj[k])
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _feed(h, v)
    elif isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous()
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    else:
        h.update(repr(obj).encode())


def _clean(rec: dict) -> dict:
    return {k: v for k, v in rec.items() if not any(w in k for w in WALL_CLOCK)}


def fingerprint(run_dir: Path) -> dict[str, str]:
    import torch

    out = {}
    ckpt = torch.load(run_dir / "checkpoint.pt", map_location="cpu", weights_only=False)
    h = hashlib.sha256()
    _feed(h, {k: v for k, v in ckpt.items() if k != "config"})
    out["checkpoint"] = h.hexdigest()
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    metrics = [json.dumps(_clean(json.loads(line)), sort_keys=True) for line in lines]
    out["metrics"] = hashlib.sha256("\n".join(metrics).encode()).hexdigest()
    for name in ("ledger.json", "summary.json"):
        if not (run_dir / name).is_file():  # (a non-private run has no ledger)
            continue
        rec = _clean(json.loads((run_dir / name).read_text()))
        rec.pop("not_covered_statistics", None)
        out[name] = hashlib.sha256(json.dumps(rec, sort_keys=True).encode()).hexdigest()
    return out


def run_case(name: str, extra: list[str], work: Path) -> dict[str, str]:
    """Train one case in this process (composed as the command line composes it)."""
    from dpsub.config import compose, config_context
    from dpsub.training.loop import train

    run_dir = work / name
    with config_context():
        cfg = compose([*COMMON, *extra, f"out_dir={run_dir}"])
    try:
        train(cfg, run_dir)
    except Exception as e:  # noqa: BLE001 -- recorded as the case's result
        return {"error": f"{type(e).__name__}: {e}"}
    return fingerprint(run_dir)


def main() -> None:
    import logging

    import torch

    # one thread: with two, CPU reductions change order between runs of one commit (seen
    # 2026-11-26: 11 of 16 cases differed from themselves), which would hide a real change
    torch.set_num_threads(1)
    logging.disable(logging.INFO)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path, help="folder for fingerprints.json")
    ap.add_argument("--compare", type=Path, help="a folder of earlier fingerprints.json")
    ap.add_argument("-k", default="", help="only the cases whose name contains this")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    result = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, extra in CASES.items():
            if args.k in name:
                result[name] = run_case(name, extra, Path(tmp))
                print(name, json.dumps(result[name]), flush=True)
    (args.out / "fingerprints.json").write_text(json.dumps(result, indent=1, sort_keys=True))
    if args.compare:
        before = json.loads((args.compare / "fingerprints.json").read_text())
        diff = [n for n in result if before.get(n) != result[n] or "error" in result[n]]
        print("DIFFERENT: " + ", ".join(diff) if diff else f"identical: {len(result)} cases")
        sys.exit(1 if diff else 0)


if __name__ == "__main__":
    main()
