"""Teachers: one non-private model per disjoint partition, trained in vmapped chunks.

A chunk of teachers is one stacked set of parameters (``torch.func.stack_module_state``);
``vmap`` over ``grad`` of ``functional_call`` gives every teacher its own gradient on its
own mini-batch at once. Each teacher only ever sees its own partition
(:func:`dpsub.pate.votes.members`), and its initialization and batch order come from a
generator seeded by (seed, teacher index) alone, so a teacher is a function of its own
examples: the vote histogram's sensitivity argument of :mod:`dpsub.pate.votes` holds.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch.func import functional_call, grad, stack_module_state, vmap

from dpsub.pate.student import SGDOptions


@dataclass(frozen=True)
class TeacherOptions(SGDOptions):
    """The student's SGD options, plus how many teachers one vmap trains together."""

    epochs: int = 10
    batch_size: int = 32
    chunk: int = 50


def _teacher_seed(seed: int, t: int) -> int:
    return int(np.random.SeedSequence([seed, 0x7EAC, t]).generate_state(1)[0])


def _batches(parts, opts: TeacherOptions, gens, device):
    """Per step, a (chunk, B) index tensor (each teacher's own examples, its own order) and
    which teachers take that step: an epoch of a teacher is ``ceil(own size / B)`` steps,
    whatever its neighbours' sizes (so removing another teacher's example changes nothing
    of it); the chunk runs as many steps as its largest teacher, the others sit out. A
    teacher the hash partition gave no example never steps: it votes with its initial
    weights (refusing the run instead would say, without noise, whether one was empty)."""
    own = torch.tensor([math.ceil(len(p) / opts.batch_size) for p in parts])
    orders = [p[torch.randperm(len(p), generator=g)] for p, g in zip(parts, gens, strict=True)]
    orders = [o if len(o) else torch.zeros(1, dtype=torch.long) for o in orders]  # (sits out)
    for s in range(int(own.max())):
        pos = torch.arange(s * opts.batch_size, (s + 1) * opts.batch_size)
        yield torch.stack([o[pos % len(o)] for o in orders]).to(device), (own > s).to(device)


def train_chunk(
    make_model: Callable[[], torch.nn.Module],
    x: torch.Tensor,
    y: torch.Tensor,
    parts: list[torch.Tensor],
    first: int,
    seed: int,
    opts: TeacherOptions,
) -> tuple[torch.nn.Module, dict, dict]:
    """Train teachers ``first, first + 1, ...`` (one per part); (base, params, buffers)."""
    models, gens = [], []
    for t in range(first, first + len(parts)):
        torch.manual_seed(_teacher_seed(seed, t))
        models.append(make_model().to(x.device))
        gens.append(torch.Generator().manual_seed(_teacher_seed(seed, t) + 1))
    params, buffers = stack_module_state(models)
    base = copy.deepcopy(models[0]).to("meta")

    def loss(p, b, xb, yb):
        return F.cross_entropy(functional_call(base, (p, b), (xb,)), yb)

    per_teacher_grad = vmap(grad(loss))
    velocity = {k: torch.zeros_like(v) for k, v in params.items()}
    for _ in range(opts.epochs):
        for idx, active in _batches(parts, opts, gens, x.device):
            grads = per_teacher_grad(params, buffers, x[idx], y[idx])
            with torch.no_grad():
                for k in params:
                    on = active.view(-1, *[1] * (params[k].dim() - 1))
                    v = torch.where(on, velocity[k] * opts.momentum + grads[k], velocity[k])
                    params[k] = torch.where(on, params[k] - opts.lr * v, params[k])
                    velocity[k] = v
    return base, params, buffers


@torch.no_grad()
def predict_chunk(base, params, buffers, queries: torch.Tensor, batch_size: int) -> np.ndarray:
    """Labels (chunk, Q) of every teacher of the chunk on the public queries."""

    def logits(p, b, xb):
        return functional_call(base, (p, b), (xb,))

    out = []
    for i in range(0, queries.shape[0], batch_size):
        xb = queries[i : i + batch_size]
        out.append(vmap(logits, in_dims=(0, 0, None))(params, buffers, xb).argmax(-1))
    return torch.cat(out, dim=1).cpu().numpy()


def _claim(path) -> bool:
    """Take ``path`` (a chunk's claim) for this process; a dead holder's claim is taken over."""
    import os

    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        try:
            os.kill(int(path.read_text() or 0), 0)
            return False  # held by a live process
        except (ProcessLookupError, ValueError):
            path.unlink(missing_ok=True)
            return _claim(path)
    with os.fdopen(fd, "w") as f:
        f.write(str(os.getpid()))
    return True


def _wait_for(saved, claim, log):
    """A chunk another process claimed: wait for its file (or take it over if it died)."""
    import time

    while not saved.is_file():
        if _claim(claim):
            return None
        time.sleep(5)
    log.info("teachers: %s trained by another process", saved.name)
    return np.load(saved)


def teacher_votes(
    make_model, x, y, teacher_of, n_teachers, queries, seed, opts, batch_size, log, save_dir=None
):
    """Every teacher's predicted label on every query: (T, Q) int16.

    With ``save_dir``, each chunk's labels are saved there as it finishes
    (``chunk<first>.npy``; private, unnoised) and read back instead of retrained after a
    kill; a process claims a chunk before training it (``chunk<first>.claim``), so several
    processes given the same ``save_dir`` (``pate.votes_cache``) share the chunks.
    """
    from dpsub.pate.votes import members, save_private
    from dpsub.rundir import private_folder

    parts = [torch.as_tensor(m) for m in members(teacher_of, n_teachers)]
    if save_dir is not None:
        private_folder(save_dir)
    preds, later = {}, []
    for first in range(0, n_teachers, opts.chunk):
        chunk = parts[first : first + opts.chunk]
        saved = save_dir / f"chunk{first}.npy" if save_dir is not None else None
        if saved is not None and saved.is_file():
            preds[first] = np.load(saved)
            continue
        if saved is not None and not _claim(save_dir / f"chunk{first}.claim"):
            later.append(first)
            continue
        base, params, buffers = train_chunk(make_model, x, y, chunk, first, seed, opts)
        # a vmapped forward holds chunk x batch activations: keep it near one eval batch
        per = max(16, batch_size // len(chunk))
        preds[first] = predict_chunk(base, params, buffers, queries, per).astype(np.int16)
        if saved is not None:
            save_private(saved, preds[first])
        log.info("teachers: %d / %d trained", first + len(chunk), n_teachers)
    for first in later:
        preds[first] = _wait_for(
            save_dir / f"chunk{first}.npy", save_dir / f"chunk{first}.claim", log
        )
        if preds[first] is None:  # its holder died: train it here
            chunk = parts[first : first + opts.chunk]
            base, params, buffers = train_chunk(make_model, x, y, chunk, first, seed, opts)
            per = max(16, batch_size // len(chunk))
            preds[first] = predict_chunk(base, params, buffers, queries, per).astype(np.int16)
            save_private(save_dir / f"chunk{first}.npy", preds[first])
    return np.concatenate([preds[k] for k in sorted(preds)]).astype(np.int16)
