"""``make_private``: a private-training session over the caller's model, optimizer and data."""

from __future__ import annotations

import copy
import math
import os
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from dpsub.api.releases import KEY as RELEASES
from dpsub.api.releases import Journal, ReleaseBook, privacy_mismatch
from dpsub.data.augment import Augmult, view_padding
from dpsub.data.aux import AuxData
from dpsub.data.datasets import DatasetBundle
from dpsub.errors import PrivacyError
from dpsub.grads import GradEngine, check_private_model
from dpsub.grads.loss import LossFn, cross_entropy
from dpsub.mechanisms import build_mechanism
from dpsub.mechanisms.options import SPECS
from dpsub.privacy import PrivacyLedger
from dpsub.privacy.run_account import PrivacyAccount
from dpsub.training.build import (
    UNSAVED_AUGMENT,
    Run,
    StepOutcome,
    assemble_run,
    load_run_state,
    randomness,
    release,
    run_state,
    train_step,
)
from dpsub.training.ema import EMA

Data = tuple[Tensor, Tensor] | torch.utils.data.Dataset


class BudgetExhausted(PrivacyError):
    """The privacy budget (or the planned number of steps) affords no further release."""


def make_private(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    data: Data,
    *,
    batch_size: int,
    mechanism: str = "dpsgd",
    options: dict | None = None,
    epsilon: float | None = None,
    delta: float = 1e-5,
    noise_multiplier: float | None = None,
    steps: int | None = None,
    epochs: float | None = None,
    aux: Tensor | tuple[Tensor, Tensor] | AuxData | None = None,
    loss_fn: LossFn = cross_entropy,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    backend: str = "vmap",
    microbatch: int = 256,
    accountant: str = "rdp",
    secure: bool = False,
    seed: int = 0,
    augmult: int = 1,
    flip: bool = False,
    ema: float | None = None,
    journal: str | os.PathLike | None = None,
    num_classes: int | None = None,
) -> PrivateTraining:
    """A :class:`PrivateTraining` of ``model`` on the private ``data``.

    ``data``: ``(x, y)`` tensors or a map-style Dataset of ``(x, y)`` pairs (stacked once
    onto the model's device). ``batch_size``: the expected batch of Poisson sampling
    (q = batch_size / N). ``mechanism`` and its ``options``: any of ``conf/mechanism/``
    (``dpsgd``, ``gep``, ``bgep``, ``pdpsgd``, ``rgp``...; options as in its YAML).
    ``epsilon`` (calibrates the noise for the planned steps, at ``delta``) or
    ``noise_multiplier`` (fixed; with ``epsilon`` too, the budget still stops it).
    ``steps`` or ``epochs`` plan the run. ``aux``: the public anchors of subspace
    mechanisms: images (random labels redrawn at every refit, GEP's paper), ``(x, y)``
    (their true labels) or an :class:`~dpsub.data.aux.AuxData`. ``loss_fn(outputs,
    targets) -> (B,)``: a per-example loss. ``scheduler``: stepped after every release
    by :meth:`PrivateTraining.step` (your loop steps it itself otherwise). ``secure``:
    noise from the OS's CSPRNG (not reproducible). ``augmult``: K > 1 random views of each
    private image (N, C, H, W), crops of its mirror-padded copy and, with ``flip``, horizontal
    flips (natural images, not digits), whose gradients are averaged *before* clipping: the
    sensitivity and the noise are those of K = 1 (docs/recipe.md). ``ema``: a decay (e.g.
    0.999) for parameter averaging, post-processing of the releases (no privacy cost),
    updated by :meth:`PrivateTraining.step` (in your own loop:
    :meth:`PrivateTraining.update_average`); evaluate with ``with private.averaged(): ...``.
    ``journal``: a file to which every release is appended (fsynced) before it reaches
    ``.grad``; a session opened on an existing one starts with its releases charged, so a
    crash loses none (docs/api.md). ``num_classes``: the range of the random labels of
    ``aux`` images (default: the width of the model's output, never read from the private
    labels). Raises ValueError naming the argument.
    """
    device, dtype = _placement(model)
    x, y = _tensors(data, device, dtype)
    n = int(y.shape[0])
    total = _planned_steps(steps, epochs, batch_size, n)
    mech = build_mechanism(mechanism, **(options or {}))
    if mech.private:
        _check_privacy_args(epsilon, noise_multiplier)
        check_private_model(model)
    num_classes = _classes(model, x, y, num_classes)  # (before the engine hooks the model)
    engine = GradEngine(model, microbatch, backend, loss_fn=loss_fn)
    anchors = _aux(aux, num_classes, device)
    if SPECS[mechanism].needs_aux and anchors is None:
        raise ValueError(f"aux: mechanism {mechanism} needs auxiliary (public) data")
    mech.setup(engine, anchors)
    gens, source, uniform = randomness(seed, secure, device, augment=_views(augmult, x) > 1)
    if augmult > 1:  # public crops and flips from their own stream
        views = gens.pop(UNSAVED_AUGMENT, None) or gens["augment"]  # secure: not checkpointed
        engine.augmult = Augmult(int(augmult), view_padding(x.shape[2]), flip, views)
    budget = math.inf if epsilon is None else float(epsilon)
    account = PrivacyAccount.open(
        n=n, batch_size=batch_size, steps=total, phases=mech.phases(total) if mech.private else None,
        policy=mech.accounting, epsilon=budget, delta=delta, accountant=accountant,
        noise_multiplier=noise_multiplier, uniform=uniform, device=device,
    )  # fmt: skip
    bundle = DatasetBundle("user", x, y, x[:0], y[:0], num_classes, None, (), ())
    run = assemble_run(
        data=bundle, aux=anchors, model=model, engine=engine, mechanism=mech, account=account,
        total_steps=total, optimizer=optimizer, schedule=scheduler, noise_source=source,
        generators=gens, seed=seed, ema=_average(ema, model),
    )  # fmt: skip
    return PrivateTraining(run, _book(journal, account))


class PrivateTraining:
    """One private training: Poisson batches, private releases, the epsilon spent.

    Two ways to drive it: :meth:`step` (draw, release, ``optimizer.step()``: what
    ``dpsub-train`` does), or your own loop over :meth:`batches` with :meth:`backward`
    and your optimizer. Every release is charged to the ledger before it is returned; a
    release the budget cannot afford raises :class:`BudgetExhausted` and writes nothing.
    """

    def __init__(self, run: Run, book: ReleaseBook | None = None):
        self.run = run
        self._drawn: tuple[Tensor, Tensor, Tensor] | None = None
        self._book = book or ReleaseBook()  # every release the ledger charges (load_state_dict)
        run.on_release.append(self._book.released)  # (bound: a deepcopy hooks the copy's book)

    # ----------------------------------------------------------------- state
    @property
    def epsilon(self) -> float:
        """Epsilon spent so far (inf for a non-private mechanism)."""
        return self.run.account.epsilons(exact=True)["epsilon"]

    @property
    def delta(self) -> float:
        ledger = self.run.ledger
        return float(ledger.delta) if ledger is not None else 0.0

    @property
    def steps(self) -> int:
        """Steps of the current trajectory (a loaded state sets it back; the ledger counts
        every release)."""
        return self.run.step

    @property
    def total_steps(self) -> int:
        return self.run.total_steps

    @property
    def noise_multiplier(self) -> float:
        return self.run.z

    @property
    def ledger(self) -> PrivacyLedger:
        """The honest privacy ledger (every step's multiplier and sample rate)."""
        return self.run.ledger

    def state_dict(self) -> dict:
        """Everything to continue exactly: model, optimizer, ledger, sampler, mechanism, rng,
        and the releases the ledger charges."""
        return {**run_state(self.run), RELEASES: self._book.state()}

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state``. What this session has spent is never lowered: every
        release its ledger charged that ``state`` does not hold is charged again on top of
        the state's ledger (a rollback and replay is charged twice, and a seeded session's
        noise and sampling restart from the OS's randomness: docs/api.md). A load that
        fails part way leaves the session as it was."""
        _check_loadable(state, self.run.account)
        acct, kept = self.run.account, copy.deepcopy(run_state(self.run))
        try:
            load_run_state(self.run, state)
            again = self._book.after_load(state, acct)
        except BaseException:
            load_run_state(self.run, kept)  # the weights too: they hold the state's releases
            raise
        if again:  # a replay must not repeat the noise on sums that may differ
            _fresh_streams(self.run)

    def __deepcopy__(self, memo: dict) -> PrivateTraining:
        """A fork: its own releases (ids apart), and in a seeded session its own noise and
        sampling (the same noise on the two forks' different sums would leak them)."""
        fork = PrivateTraining.__new__(PrivateTraining)
        memo[id(self)] = fork
        fork.__dict__.update(copy.deepcopy(self.__dict__, memo))
        _fresh_streams(fork.run)
        return fork

    # ----------------------------------------------------------------- steps
    def batches(self) -> Iterator[tuple[Tensor, Tensor]]:
        """Poisson batches ``(x, y)`` of the private data until the planned steps are done
        or the budget affords no more; release each with :meth:`backward` before the next."""
        run, sampler = self.run, self.run.account.sampler
        assert sampler is not None  # opened by make_private
        while run.step < run.total_steps and run.account.admit(run.step):
            idx = sampler.sample()
            self._drawn = (idx, run.data.train_x[idx], run.data.train_y[idx])
            yield self._drawn[1], self._drawn[2]
            if self._drawn is not None:
                raise RuntimeError("batches(): release each batch with backward() first")

    def backward(self, x: Tensor, y: Tensor) -> StepOutcome:
        """Release the private gradient of the batch :meth:`batches` just drew into every
        trainable parameter's ``.grad`` (charged to the ledger); then step your optimizer."""
        drawn, self._drawn = self._drawn, None
        if drawn is None or x is not drawn[1] or y is not drawn[2]:
            raise ValueError("backward() releases only the batch batches() drew last")
        self._within_plan()
        return self._charged(lambda: release(self.run, drawn[0]))

    def step(self) -> StepOutcome:
        """Draw a Poisson batch, release its private gradient, step the optimizer (and the
        scheduler, if given)."""
        self._within_plan()
        return self._charged(lambda: train_step(self.run))

    # ------------------------------------------------------------ averaging
    def update_average(self) -> None:
        """Your own loop with ``ema``: move the average after your optimizer's step
        (:meth:`step` does it itself)."""
        self._ema().update(self.run.model)

    @contextmanager
    def averaged(self) -> Iterator[nn.Module]:
        """The model with the averaged weights inside the block, its own ones after."""
        with self._ema().applied(self.run.model) as model:
            yield model

    def _ema(self) -> EMA:
        if self.run.ema is None:
            raise ValueError("ema: make_private(..., ema=<decay>) keeps no average otherwise")
        return self.run.ema

    def _within_plan(self) -> None:
        if self.run.step >= self.run.total_steps:
            raise BudgetExhausted(
                f"the planned {self.run.total_steps} steps are done (epsilon spent "
                f"{self.epsilon:.4g}); nothing was released"
            )

    def _charged(self, make: Callable[[], StepOutcome]) -> StepOutcome:
        """Run one release and keep what it charged (for :meth:`load_state_dict`)."""
        acct, book = self.run.account, self._book
        before, known = (acct.ledger.steps if acct.ledger is not None else 0), len(book.known)
        try:
            out = make()
        finally:  # charged, then interrupted before its hook recorded it: still recorded
            if acct.ledger is not None and acct.ledger.steps > before and len(book.known) == known:
                book.record(acct)
        return self._checked(out)

    def _checked(self, out: StepOutcome) -> StepOutcome:
        if out.stopped_by_budget:
            raise BudgetExhausted(
                f"the privacy budget affords no further step (epsilon spent {self.epsilon:.4g} "
                f"by {self.ledger.steps} releases); nothing was released"
            )
        return out


# ------------------------------------------------------------------ helpers
def _check_loadable(state: dict, acct: PrivacyAccount) -> None:
    """ValueError unless ``state`` continues a session of ``acct``'s privacy setting."""
    if (acct.ledger is None) != (state.get("ledger") is None):
        why = ("it holds no privacy ledger (a non-private session's); a private session "
               "cannot continue from it") if acct.ledger is not None else (
               "it holds a privacy ledger; a non-private session cannot continue it (its "
               "steps add no noise, and the state's epsilon would not count them)")  # fmt: skip
        raise ValueError(f"state: {why}")
    if acct.ledger is not None and (acct.nominal is None) != (state.get("nominal") is None):
        raise ValueError("state: it was saved under another accounting policy (a nominal "
                         "ledger or none); a state continues only a session of the same "
                         "privacy setting")  # fmt: skip
    for name, mine in (("ledger", acct.ledger), ("nominal", acct.nominal)):
        theirs = state.get(name)
        differs = privacy_mismatch(theirs, mine) if mine is not None and theirs else None
        if differs:
            raise ValueError(f"state: its {name} has {differs}: a state continues only a "
                             "session of the same privacy setting")  # fmt: skip


def _fresh_streams(run: Run) -> None:
    """Seeded mode: the sampling and noise streams restart from the OS's randomness (a
    secure session's are never restored, hence always fresh)."""
    for name in ("sampler", "noise"):
        if name in run.generators:
            run.generators[name].manual_seed(secrets.randbits(63))


def _book(journal, account: PrivacyAccount) -> ReleaseBook:
    """A new session's releases, or those of ``journal`` (charged to the fresh ledgers)."""
    if journal is None:
        return ReleaseBook()
    if account.ledger is None:
        raise ValueError("journal: a non-private session has no releases to journal")
    opened, held = Journal.open(journal, account)
    return ReleaseBook(known=held, journal=opened)


def _placement(model: nn.Module) -> tuple[torch.device, torch.dtype]:
    """The model's device and floating-point dtype (float32 unless the user converted it)."""
    p = next((p for p in model.parameters() if p.is_floating_point()), None)
    if p is None:
        return torch.device("cpu"), torch.get_default_dtype()
    return p.device, p.dtype


def _stacked(data: torch.utils.data.Dataset) -> tuple[Tensor, Tensor]:
    """A map-style dataset's (x, y) pairs stacked into two tensors, or a ValueError naming
    the first item that is not a tensor-like pair (e.g. a PIL image without a transform)."""
    pairs = [data[i] for i in range(len(data))]  # type: ignore[arg-type]  # map-style: has len
    bad = next(
        (i for i, p in enumerate(pairs) if not (isinstance(p, tuple | list) and len(p) == 2)), None
    )
    if bad is not None:
        raise ValueError(
            f"data: a Dataset's items must be (x, y) pairs; item {bad} is a {type(pairs[bad]).__name__}"
        )
    try:
        x, y = (torch.stack([torch.as_tensor(p[j]) for p in pairs]) for j in (0, 1))
    except (TypeError, RuntimeError, IndexError) as e:
        got = ", ".join(type(v).__name__ for v in pairs[0]) if pairs else "nothing"
        raise ValueError(
            f"data: a Dataset's items must be (x, y) pairs of tensors or numbers of one shape "
            f"(item 0 holds {got}; a torchvision dataset needs transform=ToTensor()): {e}"
        ) from None
    return x, y


def _tensors(data: Data, device: torch.device, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """Floating inputs in the model's dtype (numpy's float64 arrays train a float32 model)."""
    if isinstance(data, tuple) and len(data) == 2:
        x, y = data
    elif isinstance(data, torch.utils.data.Dataset):
        x, y = _stacked(data)
    elif isinstance(data, torch.utils.data.DataLoader):  # its batches are not Poisson's
        raise ValueError(
            "data: give the DataLoader's dataset (data=loader.dataset): dpsub draws its own "
            "Poisson batches, which the accounting assumes"
        )
    else:
        raise ValueError("data: give (x, y) tensors or a Dataset of (x, y) pairs")
    x, y = torch.as_tensor(x), torch.as_tensor(y)
    if x.shape[0] != y.shape[0] or x.shape[0] == 0:
        raise ValueError(f"data: x and y must hold the same N > 0 examples, got {x.shape[0]}, "
                         f"{y.shape[0]}")  # fmt: skip
    x, y = (t.to(device, dtype) if t.is_floating_point() else t.to(device) for t in (x, y))
    if x.is_floating_point() and not bool(torch.isfinite(x).all()):  # (after the cast)
        raise ValueError("data: x holds NaN or inf (in the model's dtype)")
    return x, y


def _planned_steps(steps, epochs, batch_size: int, n: int) -> int:
    if not 1 <= int(batch_size) <= n:
        raise ValueError(f"batch_size: must be in [1, N={n}], got {batch_size}")
    if (steps is None) == (epochs is None):
        raise ValueError("steps / epochs: give exactly one")
    if steps is not None:
        if int(steps) < 1:
            raise ValueError(f"steps: must be >= 1, got {steps}")
        return int(steps)
    if not epochs > 0:
        raise ValueError(f"epochs: must be > 0, got {epochs}")
    return max(1, round(float(epochs) * n / int(batch_size)))


def _views(augmult: int, x: Tensor) -> int:
    """``augmult``, checked: K >= 1, and K > 1 only for images (N, C, H, W)."""
    if isinstance(augmult, bool) or not isinstance(augmult, int) or augmult < 1:
        raise ValueError(f"augmult: the views per example, an int >= 1, got {augmult!r}")
    if augmult > 1 and x.dim() != 4:
        raise ValueError(f"augmult: views are crops of images (N, C, H, W), got x of shape "
                         f"{tuple(x.shape)}")  # fmt: skip
    return augmult


def _average(decay: float | None, model: nn.Module) -> EMA | None:
    if decay is None:
        return None
    if not 0 < decay < 1:
        raise ValueError(f"ema: a decay in (0, 1), e.g. 0.999, got {decay}")
    return EMA(model, decay)


def _check_privacy_args(epsilon, noise_multiplier) -> None:
    if epsilon is None and noise_multiplier is None:
        raise ValueError("epsilon / noise_multiplier: a private mechanism needs one of them")
    if epsilon is not None and not epsilon > 0:
        raise ValueError(f"epsilon: must be > 0, got {epsilon}")
    if noise_multiplier is not None and not noise_multiplier > 0:
        raise ValueError(f"noise_multiplier: must be > 0, got {noise_multiplier}")


def _classes(model: nn.Module, x: Tensor, y: Tensor, given: int | None) -> int:
    """The classes: ``given``, else the width of the model's output (its shape, not its
    values, so nothing of the private data), never ``y.max()``: one example of a rare class
    would change it, and with it the anchors' random labels and so the subspace."""
    if y.is_floating_point():
        return 0
    if given is not None:
        if isinstance(given, bool) or not isinstance(given, int) or given < 2:
            raise ValueError(f"num_classes: an int >= 2, got {given!r}")
        return given
    with torch.no_grad():  # zeros, not a private example: a stateful layer would keep it
        out = model(torch.zeros_like(x[:1]))
    if out.dim() != 2 or out.shape[1] < 2:
        raise ValueError(f"num_classes: the model's output has shape {tuple(out.shape)}, not "
                         "(batch, classes): give num_classes")  # fmt: skip
    return int(out.shape[1])


def _aux(aux, num_classes: int, device) -> AuxData | None:
    """The caller's public anchors as :class:`AuxData` on ``device``."""
    if aux is None:
        return None
    if isinstance(aux, AuxData):
        out = aux.to(device)
    elif isinstance(aux, tuple | Tensor):
        ax, ay = aux if isinstance(aux, tuple) else (aux, None)
        ax = torch.as_tensor(ax).float().to(device)
        ay = None if ay is None else torch.as_tensor(ay).to(device)
        out = AuxData(ax, ay, num_classes, "user", **({} if ay is None else {"labels": "true"}))
    else:
        raise ValueError("aux: give public images, (images, labels) or an AuxData")
    if out.x.is_floating_point() and not bool(torch.isfinite(out.x).all()):
        raise ValueError("aux: the public images hold NaN or inf (in float32)")
    return out
