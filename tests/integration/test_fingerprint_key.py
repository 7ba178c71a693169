"""The checkpoint's fingerprint of the private training set is keyed (training/checkpoint.py).

A plain hash of the data, shared with a checkpoint, lets anyone who holds every candidate
dataset but one example's test which example it was; an HMAC under a random key kept
beside the checkpoint (``fingerprint.key``, never a small file) says nothing without it,
and still lets a resume check that it trains on the same data.
"""

from __future__ import annotations

import pytest
import torch

from dpsub.config import validate
from dpsub.errors import ResumeError
from dpsub.rundir import FINGERPRINT_KEY, SMALL_FILES
from dpsub.training.build import private_data
from dpsub.training.checkpoint import data_fingerprint, fingerprint_matches
from dpsub.training.loop import train

from conftest import SYNTH, compose_cfg

SHORT = (*SYNTH, "train.max_steps=3", "train.eval_every=0")


def _ckpt(run_dir) -> dict:
    return torch.load(run_dir / "checkpoint.pt", weights_only=False, map_location="cpu")


def test_a_checkpoint_fingerprints_its_data_under_the_runs_secret_key(tmp_path):
    run_dir = tmp_path / "run"
    cfg = compose_cfg(*SHORT)
    train(cfg, run_dir)
    _, data = private_data(validate(cfg))
    key_file = run_dir / FINGERPRINT_KEY
    assert key_file.stat().st_mode & 0o077 == 0  # the owner's alone
    key = bytes.fromhex(key_file.read_text().strip())
    ckpt = _ckpt(run_dir)
    assert ckpt["data_fingerprint"] != data_fingerprint(data.train_x, data.train_y)
    assert ckpt["data_fingerprint"] == data_fingerprint(data.train_x, data.train_y, key)
    assert fingerprint_matches(ckpt, run_dir, data.train_x, data.train_y) is True
    assert fingerprint_matches(ckpt, run_dir, data.train_x[1:], data.train_y[1:]) is False
    assert FINGERPRINT_KEY not in SMALL_FILES


def test_a_resume_without_the_key_is_refused(tmp_path):
    run_dir = tmp_path / "run"
    train(compose_cfg(*SHORT), run_dir)
    (run_dir / FINGERPRINT_KEY).unlink()
    with pytest.raises(ResumeError, match=FINGERPRINT_KEY):
        train(compose_cfg(*SHORT), run_dir, resume=True)


def test_a_checkpoint_from_before_the_keys_resumes_and_is_keyed_after(tmp_path):
    run_dir = tmp_path / "run"
    cfg = compose_cfg(*SHORT)
    train(cfg, run_dir)
    _, data = private_data(validate(cfg))
    ckpt = _ckpt(run_dir)
    ckpt["data_fingerprint"] = data_fingerprint(data.train_x, data.train_y)  # the old plain one
    del ckpt["data_fingerprint_keyed"]
    torch.save(ckpt, run_dir / "checkpoint.pt")
    assert fingerprint_matches(ckpt, run_dir, data.train_x, data.train_y) is True
    train(cfg, run_dir, resume=True)  # its key file may be there (a crash before the save)
    after = _ckpt(run_dir)
    assert after["data_fingerprint_keyed"] is True and (run_dir / FINGERPRINT_KEY).is_file()
    assert after["data_fingerprint"] != ckpt["data_fingerprint"]
    (run_dir / FINGERPRINT_KEY).unlink()  # and without the key file at all
    torch.save(ckpt, run_dir / "checkpoint.pt")
    train(cfg, run_dir, resume=True)
    assert _ckpt(run_dir)["data_fingerprint_keyed"] is True
