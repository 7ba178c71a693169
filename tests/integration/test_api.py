"""The Python API (dpsub.make_private): the same releases as dpsub-train, its refusals."""

from __future__ import annotations

import copy
import hashlib
import re

import pytest
import torch
from torch import nn

import dpsub
from dpsub.training.build import build_run, private_data
from dpsub.training.loop import train

from conftest import SYNTH, compose_cfg

GEP = (*SYNTH, "model=linear", "mechanism=gep",
       "mechanism.num_bases=8", "aux=gaussian", "aux.num_samples=24", "privacy.epsilon=3",
       "optim.schedule.milestones=[]", "train.max_steps=4", "train.checkpoint_every=0")  # fmt: skip


def digest(tensors) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def test_a_seeded_gep_run_through_the_api_equals_dpsub_train(tmp_path):
    cfg = compose_cfg(*GEP)
    cli = train(cfg, tmp_path / "cli")
    ckpt = torch.load(tmp_path / "cli" / "checkpoint.pt", weights_only=False)["state"]

    ref = build_run(cfg)  # the same model, data and anchors as the CLI run (seeded)
    s = ref.settings
    torch.manual_seed(s.seed)
    aux, data = private_data(s)
    model = ref.model
    model.load_state_dict(build_run(cfg).model.state_dict())  # the initial weights
    opt = torch.optim.SGD(model.parameters(), lr=s.optim.lr, momentum=s.optim.momentum,
                          weight_decay=s.optim.weight_decay)  # fmt: skip
    private = dpsub.make_private(
        model, opt, (data.train_x, data.train_y), batch_size=s.train.batch_size,
        mechanism="gep", options=dict(vars(ref.mechanism.opts)), aux=aux,
        epsilon=s.privacy.epsilon, delta=s.privacy.delta, steps=cli.steps, seed=s.seed,
        microbatch=ref.engine.microbatch,
    )  # fmt: skip
    for xb, yb in private.batches():
        private.backward(xb, yb)
        opt.step()
    assert private.steps == cli.steps == 4
    assert digest(model.state_dict().values()) == digest(ckpt["model"].values())
    assert private.state_dict()["ledger"] == ckpt["ledger"]
    assert private.epsilon == pytest.approx(cli.epsilon, rel=1e-12)


def test_views_and_averaging_through_the_api_equal_dpsub_train(tmp_path):
    """augmult (views averaged before clipping) and ema: the same seeded releases, weights
    and average as ``train.augmult`` / ``train.ema``, and the same epsilon as one view."""
    cfg = compose_cfg(*SYNTH, "model=mnist_cnn", "train.augmult=2", "train.ema=0.9",
                      "train.max_steps=3", "train.checkpoint_every=0", "privacy.epsilon=3",
                      "optim.schedule.milestones=[]", "grads.microbatch=32")  # fmt: skip
    cli = train(cfg, tmp_path / "cli")
    ckpt = torch.load(tmp_path / "cli" / "checkpoint.pt", weights_only=False)["state"]
    ref = build_run(cfg)
    s = ref.settings
    _, data = private_data(s)
    model = ref.model
    opt = torch.optim.SGD(model.parameters(), lr=s.optim.lr, momentum=s.optim.momentum,
                          weight_decay=s.optim.weight_decay)  # fmt: skip
    kw = dict(batch_size=s.train.batch_size, options=dict(vars(ref.mechanism.opts)),
              epsilon=s.privacy.epsilon, steps=cli.steps, seed=s.seed, microbatch=32)  # fmt: skip
    private = dpsub.make_private(model, opt, (data.train_x, data.train_y), augmult=2, ema=0.9, **kw)
    for _ in range(cli.steps):
        private.step()
    assert digest(model.state_dict().values()) == digest(ckpt["model"].values())
    assert digest(private.run.ema.avg.values()) == digest(ckpt["ema"]["avg"].values())
    assert private.epsilon == pytest.approx(cli.epsilon, rel=1e-12)
    raw = digest(model.parameters())
    with private.averaged() as averaged:
        assert digest(averaged.parameters()) == digest(ckpt["ema"]["avg"].values())
    assert digest(model.parameters()) == raw  # its own weights back
    one = dpsub.make_private(ref.model, opt, (data.train_x, data.train_y), **kw)
    for _ in range(cli.steps):
        one.step()
    assert one.epsilon == private.epsilon  # K views: the noise and epsilon of one


def blobs(n=600, d=10, k=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    return x, (x @ torch.randn(d, k, generator=g)).argmax(1)


def session(**kw):
    return session_on(blobs(), **kw)


def session_on(data, **kw):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.3)
    args = {"batch_size": 60, "epsilon": 2.0, "steps": 6, **kw}
    return model, opt, dpsub.make_private(model, opt, data, **args)


def test_step_releases_charge_and_refuse_beyond_the_plan():
    _, _, private = session()
    for _ in range(6):
        private.step()
    assert 0 < private.epsilon <= 2.0 + 1e-9 and private.ledger.steps == 6
    with pytest.raises(dpsub.BudgetExhausted, match="planned 6 steps"):
        private.step()
    assert private.ledger.steps == 6


def test_a_fixed_noise_stops_at_the_budget():
    _, _, private = session(noise_multiplier=0.5, epsilon=1.0)
    with pytest.raises(dpsub.BudgetExhausted, match="nothing was released"):
        for _ in range(6):
            private.step()
    assert private.epsilon <= 1.0 + 1e-9


def test_backward_releases_only_the_batch_it_drew():
    _, _, private = session()
    xb, yb = next(private.batches())
    with pytest.raises(ValueError, match="drew last"):
        private.backward(xb.clone(), yb)
    assert private.ledger.steps == 0


def test_state_dict_resumes_exactly():
    model, opt, private = session()
    for _ in range(3):
        private.step()
    state = {k: v for k, v in private.state_dict().items()}
    state = torch.load(_saved(state), weights_only=False)
    for _ in range(3):
        private.step()
    m2, o2, again = session()
    again.load_state_dict(state)
    for _ in range(3):
        again.step()
    assert digest(model.parameters()) == digest(m2.parameters())
    assert again.state_dict()["ledger"] == private.state_dict()["ledger"]


def _free(**kw):
    """A session without a budget (a fixed multiplier): every release is allowed."""
    return session(**{"epsilon": None, "noise_multiplier": 1.0, "steps": 20, **kw})[2]


def _steps(private, n: int):
    for _ in range(n):
        private.step()
    return copy.deepcopy(private.state_dict())


def test_a_rollback_never_lowers_what_the_session_spent():
    """Loading an earlier state into a session that has released since: those releases stay
    charged (secure mode replays them with fresh noise: 2 x 6 releases, not 6)."""
    _, _, private = session(secure=True)
    start = copy.deepcopy(private.state_dict())
    _steps(private, 6)
    private.load_state_dict(start)
    assert private.steps == 0 and private.ledger.steps == 6
    with pytest.raises(dpsub.BudgetExhausted, match="by 6 releases"):
        private.step()  # the budget of epsilon 2 was calibrated for 6 releases
    free = _free(secure=True)
    start, mid = copy.deepcopy(free.state_dict()), _steps(free, 3)
    _steps(free, 3)
    free.load_state_dict(mid)  # its own later state: only the 3 releases after it again
    assert free.ledger.steps == 6
    _steps(free, 3)
    free.load_state_dict(start)
    assert free.ledger.steps == 9  # every release it made, each charged once
    ref = _free()
    _steps(ref, 9)
    assert free.epsilon == ref.epsilon


def test_states_passed_between_sessions_never_drop_a_release():
    a = _free()
    c3, c6 = _steps(a, 3), _steps(a, 3)
    b = _free()
    b.load_state_dict(c6)
    _steps(b, 3)
    b.load_state_dict(c3)  # a's releases 4-6 came with c6: still charged, with b's 3
    assert b.ledger.steps == 9
    b.load_state_dict(c6)  # nothing new: the same 9
    assert b.ledger.steps == 9
    x, y = _free(), _free()
    sx = _steps(x, 3)
    y.load_state_dict(sx)
    sy = _steps(y, 2)
    x.load_state_dict(sy)  # y's state holds x's 3 releases: 5 in all, none twice
    assert x.ledger.steps == 5

    def keyless(state):  # as a dpsub-train checkpoint's: no list of releases
        return {k: v for k, v in state.items() if k != "api_releases"}

    a3, b3 = keyless(_steps(_free(), 3)), keyless(_steps(_free(seed=1), 3))
    c = _free()
    c.load_state_dict(a3)  # two runs' states with equal ledgers are different releases
    _steps(c, 2)
    c.load_state_dict(b3)
    assert c.ledger.steps == 8
    c.load_state_dict(a3)  # loaded again, a keyless state counts again (the safe side)
    assert c.ledger.steps == 11
    fork = _free(secure=True)
    _steps(fork, 2)
    twin = copy.deepcopy(fork)  # a copied session names its next releases apart
    _steps(fork, 1)
    fork.load_state_dict(_steps(twin, 1))
    assert fork.ledger.steps == 4


def test_a_private_session_refuses_a_non_private_state():
    state = copy.deepcopy(session(mechanism="nonprivate", epsilon=None)[2].state_dict())
    private = _free()
    _steps(private, 2)
    with pytest.raises(ValueError, match="no privacy ledger"):
        private.load_state_dict(state)
    assert private.ledger.steps == 2


def test_a_release_interrupted_after_its_charge_or_a_failed_load_keeps_it_charged():
    model, opt, free = session(epsilon=None, noise_multiplier=1.0, steps=20)
    start = copy.deepcopy(free.state_dict())
    step, opt.step = opt.step, lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt)
    with pytest.raises(KeyboardInterrupt):
        free.step()  # released and charged, then the optimizer failed
    opt.step = step
    free.load_state_dict(start)
    assert free.ledger.steps == 1
    broken = copy.deepcopy(start)  # fails after its (empty) ledger was put in place
    del broken["step"]
    with pytest.raises(KeyError):
        free.load_state_dict(broken)
    assert free.ledger.steps == 1


def test_a_failed_load_leaves_the_session_as_it_was():
    """The state's weights hold its releases: left in place, they would train on uncharged."""
    other = _steps(_free(seed=1), 5)
    model, _, private = session(epsilon=None, noise_multiplier=1.0, steps=20, ema=0.99)
    _steps(private, 2)
    before = digest(model.parameters())
    with pytest.raises(KeyError, match="ema"):
        private.load_state_dict(other)  # fails late: it keeps no average
    assert digest(model.parameters()) == before
    assert private.steps == 2 and private.ledger.steps == 2


def test_a_non_private_session_refuses_a_private_state():
    state = _steps(_free(), 3)
    plain = session(mechanism="nonprivate", epsilon=None)[2]
    with pytest.raises(ValueError, match="a non-private session cannot continue it"):
        plain.load_state_dict(state)


def _release(private) -> torch.Tensor:
    private.step()
    return torch.cat([p.grad.flatten() for p in private.run.model.parameters()])


def test_a_seeded_rollback_or_fork_draws_fresh_noise_and_sampling():
    """The same noise on a replay's (or a fork's) other sums would leak their difference
    with no noise at all: a seeded session's streams restart from the OS's randomness."""
    private = _free()
    start = copy.deepcopy(private.state_dict())
    first = _release(private)
    private.load_state_dict(start)
    assert not torch.equal(_release(private), first)
    twin = copy.deepcopy(private)
    assert not torch.equal(_release(twin), _release(private))
    fresh = _free()
    fresh.load_state_dict(start)  # a fresh session continuing a state: exactly (no rollback)
    assert torch.equal(_release(fresh), first)


def test_a_state_of_another_accounting_policy_is_refused():
    hero = dict(mechanism="dphero", options={"accounting": "nominal"}, epsilon=5.0)
    state = _steps(session(noise_multiplier=2.0, epsilon=None)[2], 2)
    private = session(noise_multiplier=2.0, **hero)[2]
    with pytest.raises(ValueError, match="another accounting policy"):
        private.load_state_dict(state)


def test_the_anchors_labels_never_come_from_the_private_labels():
    """One example of a rare class used to set num_classes (y.max() + 1), and with it the
    range of the anchors' random labels and so GEP's subspace: a membership test."""
    x, y = blobs()
    y = y.clone()
    y[0] = 5  # the only example of class 5 (the model has 6 outputs)

    def basis(n):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 6))
        opt = torch.optim.SGD(model.parameters(), lr=0.3)
        private = dpsub.make_private(model, opt, (x[n:], y[n:]), batch_size=60, steps=2,
                                     epsilon=2.0, mechanism="gep", aux=x[:40],
                                     options={"num_bases": 4})  # fmt: skip
        return private.run.aux.num_classes

    assert basis(0) == basis(1) == 6
    with pytest.raises(ValueError, match="num_classes: an int >= 2"):
        session(num_classes=1)


def test_a_rollback_keeps_the_nominal_ledger_too():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 4), nn.ReLU(), nn.Linear(4, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.3)
    hero = dpsub.make_private(model, opt, blobs(), batch_size=60, epsilon=50.0, steps=6,
                              noise_multiplier=2.0, mechanism="dphero",
                              options={"accounting": "nominal"})  # fmt: skip
    start = copy.deepcopy(hero.state_dict())
    _steps(hero, 3)
    spent = hero.run.account.epsilons()
    hero.load_state_dict(start)
    assert hero.run.account.epsilons() == spent and hero.run.account.nominal.steps == 3


def test_a_state_of_another_privacy_setting_is_refused():
    """Its ledger would bring its own delta and budget: a session declared epsilon 2 at delta
    1e-5 took a state without a budget at delta 1e-2 and released past its budget."""
    other = session(epsilon=None, noise_multiplier=0.8, delta=1e-2, steps=40)[2]
    state = _steps(other, 4)
    _, _, private = session(steps=40)
    with pytest.raises(ValueError, match="delta"):
        private.load_state_dict(state)
    unbudgeted = _steps(session(epsilon=None, noise_multiplier=0.8, steps=40)[2], 2)
    with pytest.raises(ValueError, match="budget"):
        private.load_state_dict(unbudgeted)
    assert private.ledger.steps == 0 and private.delta == 1e-5


def test_a_fresh_session_resumes_a_saved_state_without_extra_charge():
    _, _, private = session()
    state = _steps(private, 3)
    _, _, again = session()
    again.load_state_dict(state)
    assert again.ledger.steps == 3 and again.epsilon == private.epsilon


def _saved(state):
    import io

    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return buf


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        (dict(epsilon=None), "epsilon / noise_multiplier"),
        (dict(batch_size=0), "batch_size"),
        (dict(steps=None), "steps / epochs"),
        (dict(mechanism="gep"), "aux"),
        (dict(mechanism="nope"), "mechanism.name"),
        (dict(options={"clip": -1.0}), "mechanism.clip"),
        (dict(augmult=0), "augmult: the views per example"),
        (dict(augmult=2), r"augmult: views are crops of images \(N, C, H, W\)"),
        (dict(ema=1.0), "ema: a decay in"),
    ],
)
def test_bad_arguments_name_themselves(kw, match):
    with pytest.raises(ValueError, match=match):
        session(**kw)


def test_data_and_anchors_that_are_not_finite_are_refused():
    """x is checked in the model's dtype (1e300 in float64 is inf in float32), and the
    public anchors are checked too (review 2026-11-29)."""
    x, y = blobs()
    with pytest.raises(ValueError, match="data: x holds NaN or inf"):
        session_on((x.double().index_fill(0, torch.tensor([3]), 1e300), y))
    nan = torch.full((8, 10), float("nan"))
    with pytest.raises(ValueError, match="aux: the public images hold NaN or inf"):
        session(mechanism="gep", aux=nan)
    from dpsub.data.aux import AuxData

    with pytest.raises(ValueError, match="aux: the public images hold NaN or inf"):
        session(mechanism="gep", aux=AuxData(nan, None, 3, "user"))


def test_a_release_that_is_not_finite_stops_charged_and_unapplied():
    """One finite public anchor of 1e20 overflowed GEP's float32 power iteration: the basis,
    then the release and the weights became NaN while every step was charged, silently.
    Now the step stops with a PrivacyError, charged, and the weights are untouched."""
    aux = torch.randn(8, 10)
    aux[0] = 1e20
    model, _, private = session(mechanism="gep", options={"num_bases": 4}, aux=aux)
    tried = 0
    with pytest.raises(dpsub.errors.PrivacyError, match="not finite"):
        for tried in range(1, 4):  # noqa: B007 -- read after the loop
            before = [p.detach().clone() for p in model.parameters()]
            private.step()
    params = list(model.parameters())
    assert all(torch.equal(a, b.detach()) for a, b in zip(before, params, strict=True))
    assert all(torch.isfinite(p).all() for p in params)
    assert private.ledger.steps == tried  # the failed release is charged too


def test_a_dataloader_is_refused_with_what_to_pass_instead():
    """Its batches are not Poisson's; the accounting assumes dpsub draws them."""
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*blobs()), batch_size=8)
    model = nn.Linear(10, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match=r"data=loader\.dataset"):
        dpsub.make_private(model, opt, loader, batch_size=8, epsilon=2.0, steps=2)


class _Items(torch.utils.data.Dataset):
    def __init__(self, item):
        self.item = item

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return self.item


@pytest.mark.parametrize(
    ("item", "match"),
    [
        (torch.zeros(3), r"items must be \(x, y\) pairs; item 0 is a Tensor"),
        (("an image file", 1), r"item 0 holds str, int; a torchvision dataset needs"),
    ],
)
def test_a_dataset_of_other_items_is_refused_naming_what_it_holds(item, match):
    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match=match):
        dpsub.make_private(model, opt, _Items(item), batch_size=2, epsilon=2.0, steps=2)


def test_float64_data_trains_a_float32_model():
    """numpy's default dtype: x (and a regression target) take the model's dtype."""
    x, y = blobs()
    model = nn.Linear(10, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    private = dpsub.make_private(model, opt, (x.double().numpy(), y.numpy()), batch_size=30,
                                 epsilon=2.0, steps=2)  # fmt: skip
    private.step()
    assert private.ledger.steps == 1 and model.weight.dtype == torch.float32


def test_averaging_needs_its_decay():
    _, _, private = session()
    with pytest.raises(ValueError, match="ema=<decay>"):
        private.update_average()


def test_batchnorm_is_refused():
    model = nn.Sequential(nn.Linear(10, 4), nn.BatchNorm1d(4), nn.Linear(4, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="BatchNorm1d"):
        dpsub.make_private(model, opt, blobs(), batch_size=60, epsilon=1.0, steps=2)


def test_the_readme_python_example_runs_and_prints_epsilon(capsys):
    from conftest import REPO

    text = (REPO / "README.md").read_text()
    block = text.split("## Python API", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    exec(compile(block, "README.md (Python API)", "exec"), {})
    out = capsys.readouterr().out
    accuracy, epsilon = (
        float(v) for v in re.findall(r"accuracy ([\d.]+)%, epsilon ([\d.]+)", out)[0]
    )
    assert 0 < epsilon <= 2.0 and accuracy > 50, out
