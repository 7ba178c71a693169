"""Config composition over every group, and bad configs failing with the key named."""

from __future__ import annotations

import functools
import re

import pytest
from omegaconf import OmegaConf

from dpsub.config import ConfigError, compose, validate
from dpsub.mechanisms import build_mechanism
from dpsub.models import build_model

from conftest import CONF_DIR, cli_in_process

SHAPES = {
    "digits": (1, 28, 28),
    "mnist": (1, 28, 28),
    "fashion_mnist": (1, 28, 28),
    "synthetic": (1, 28, 28),
    "cifar10": (3, 32, 32),
    "cifar10_subset": (3, 32, 32),
    "svhn": (3, 32, 32),
    "npz": (1, 28, 28),  # your own data: any shape; these are what the test builds
    "imagefolder": (3, 32, 32),
}


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def composed(*overrides: str):
    return compose(overrides)


def test_every_group_has_options():
    for group in ("dataset", "model", "mechanism", "aux", "privacy", "optim", "logger"):
        assert options(group), group
    assert set(SHAPES) == set(options("dataset"))


#: what a model option needs besides ``model=NAME`` (custom: a class to build)
MODEL_ARGS = {"custom": ("model._target_=helpers.nets.GNConvNet",)}


def model_args(model: str) -> tuple[str, ...]:
    return (f"model={model}", *MODEL_ARGS.get(model, ()))


@functools.cache
def model_node(model: str):
    """``model=MODEL``'s node as Hydra composes it (no dataset or mechanism option touches
    the model group: test_a_model_option_composes_the_same_beside_any_other_group)."""
    return composed(*model_args(model)).model


@functools.cache
def built_model(model: str, shape: tuple[int, ...]) -> int:
    mcfg = OmegaConf.to_container(model_node(model))
    net = build_model(mcfg.pop("name"), shape, 10, **mcfg)
    return sum(p.numel() for p in net.parameters())


def test_a_model_option_composes_the_same_beside_any_other_group():
    """What lets the matrix below compose each model once (a Hydra composition is ~0.1 s)."""
    for model in options("model"):
        full = composed("dataset=cifar10", *model_args(model), "mechanism=gep")
        assert full.model == model_node(model), model


@pytest.mark.parametrize("mechanism", options("mechanism"))
@pytest.mark.parametrize("dataset", options("dataset"))
def test_compose_every_dataset_model_mechanism(dataset, mechanism):
    # DP-Hero's measured accounting needs a fixed multiplier (test_dphero_needs_...)
    fixed = ["privacy.noise_multiplier=1"] if mechanism == "dphero" else []
    cfg = composed(f"dataset={dataset}", f"mechanism={mechanism}", *fixed)
    assert cfg.dataset.name == dataset
    for model in options("model"):
        cfg.model = model_node(model)
        validate(cfg)
        assert built_model(model, SHAPES[dataset]) > 0
    kcfg = OmegaConf.to_container(cfg.mechanism)
    mech = build_mechanism(kcfg.pop("name"), **kcfg)
    # a file is a mechanism, or a preset of one (gep_tracked: GEP with other defaults)
    assert mech.name == mechanism or mechanism.startswith(f"{mech.name}_")


@pytest.mark.parametrize("group", ["aux", "optim", "logger", "privacy"])
def test_compose_other_groups(group):
    for opt in options(group):
        validate(composed(f"{group}={opt}"))


@pytest.mark.parametrize("experiment", options("experiment"))
def test_experiments_compose_as_an_ordinary_group(experiment):
    cfg = composed(f"experiment={experiment}")
    validate(cfg)
    assert cfg.run_name != "${dataset.name}-${model.name}-${mechanism.name}"


#: ``experiment=NAME`` (and sweeps ``experiment=a,b``) where a user would copy it from
EXPERIMENT_REF = re.compile(r"(?<![\w.])\+?experiment=([a-z0-9_]+(?:,[a-z0-9_]+)*)(?![\w${<])")


def test_every_experiment_named_in_the_docs_configs_and_scripts_exists():
    """A mistyped experiment fails now, so every one a document or config names must exist."""
    repo = CONF_DIR.parent
    files = [repo / "README.md", repo / "Makefile", *repo.glob("results/**/README.md")]
    for folder, pattern in (("docs", "*.md"), ("conf", "*.yaml"), ("scripts", "*")):
        files += (p for p in (repo / folder).rglob(pattern) if p.is_file())
    known, seen = set(options("experiment")), set()
    for path in files:
        text = path.read_text(errors="replace")
        own = set(re.findall(r"/experiment/(\w+)\.yaml", text))  # a user's own, made there
        for names in EXPERIMENT_REF.findall(text):
            for name in names.split(","):
                seen.add(name)
                assert name in known | own, (
                    f"{path.relative_to(repo)}: experiment={name} does not exist"
                )
    assert {"demo", "gep_mnist_eps2", "dphero_mnist_lenet"} <= seen  # the scan finds them


def test_model_options_match_the_constructors():
    """validate() checks model.* keys against MODEL_OPTIONS without importing torch."""
    import inspect

    from dpsub.models import MODEL_OPTIONS, MODELS, model_class
    from dpsub.models.wrn import wrn

    assert set(MODEL_OPTIONS) == set(MODELS)
    for name in set(MODELS) - {"custom"}:  # custom: its _target_ class's keywords
        ctor = wrn if name == "wrn" else model_class(name)  # wrn_for_shape(**kw) -> wrn
        params = set(inspect.signature(ctor).parameters) - {"in_shape", "num_classes"}
        assert set(MODEL_OPTIONS[name]) == params - {"in_channels"}, name
    for path in (CONF_DIR / "model").glob("*.yaml"):
        cfg = OmegaConf.load(path)
        assert set(cfg) - {"name"} <= set(MODEL_OPTIONS[cfg.name]), path.name


def test_an_unknown_model_option_names_the_key_and_the_close_ones():
    with pytest.raises(ConfigError, match=r"^model\.gn_group: .*closest: gn_groups"):
        validate(composed("model=wrn28_4", "+model.gn_group=2"))
    validate(composed("model=wrn28_4", "+model.gn_groups=2"))


def test_dphero_needs_a_fixed_noise_multiplier():
    """Calibrated to privacy.epsilon (nominal), its honest epsilon spends the budget at once."""
    with pytest.raises(ConfigError, match="experiment=dphero_mnist_lenet"):
        validate(composed("mechanism=dphero"))
    validate(composed("mechanism=dphero", "privacy.noise_multiplier=1"))
    validate(composed("mechanism=dphero", "mechanism.accounting=nominal"))
    validate(composed("mechanism=dphero_floor"))  # planned accounting: calibration is exact
    validate(composed("experiment=dphero_mnist_lenet"))


def test_mechanism_config_holds_exactly_the_declared_options():
    """Each mechanism's file, composed, has every declared option (its defaults come from
    the declaration: tests/unit/test_declared_once.py)."""
    from dpsub.mechanisms import MECHANISMS
    from dpsub.mechanisms.options import SPECS

    assert set(MECHANISMS) == set(SPECS)
    for name, spec in SPECS.items():
        assert (CONF_DIR / "mechanism" / f"{name}.yaml").exists(), name
        keys = set(composed(f"mechanism={name}").mechanism) - {"name"}
        assert keys == set(spec.option_names), name


def test_backend_names_match_the_engine():
    from dpsub.config import BACKENDS
    from dpsub.grads import BACKENDS as ENGINE_BACKENDS

    assert BACKENDS == ENGINE_BACKENDS


def test_dataset_names_match_the_loaders():
    from dpsub.data import LOADERS
    from dpsub.data.registry import REGISTRY as DATASETS

    assert (
        set(DATASETS)
        == set(LOADERS)
        == {OmegaConf.load(p).name for p in (CONF_DIR / "dataset").glob("*.yaml")}
    )


def test_model_names_match_the_registry():
    from dpsub.models import MODELS

    assert {OmegaConf.load(p).name for p in (CONF_DIR / "model").glob("*.yaml")} == set(MODELS)


def test_an_invalid_config_fails_before_torch_is_imported(tmp_path):
    """Validation imports nothing heavy: the error comes in well under the 3 s torch costs."""
    import subprocess
    import sys

    from conftest import REPO

    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "dpsub.cli.train", "privacy.epsilon=-1",
         "mechanism.clip=0.5", f"out_dir={tmp_path / 'run'}"],
        capture_output=True, text=True, cwd=REPO, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "privacy.epsilon: must be > 0" in proc.stderr
    imported = [
        line.split("|")[-1].strip() for line in proc.stderr.splitlines() if "import time" in line
    ]
    assert "torch" not in imported and "opacus" not in imported
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "override,key",
    [
        ("privacy.epsilon=0", "privacy.epsilon"),
        ("privacy.epsilon=-1", "privacy.epsilon"),
        ("privacy.delta=1", "privacy.delta"),
        ("privacy.delta=1.5", "privacy.delta"),
        ("privacy.accountant=gdp", "privacy.accountant"),
        ("privacy.sampling=fixed", "privacy.sampling"),
        ("train.batch_size=0", "train.batch_size"),
        ("train.batch_size=abc", "train.batch_size"),
        ("train.epochs=0", "train.epochs"),
        ("grads.backend=jax", "grads.backend"),
        ("grads.microbatch=0", "grads.microbatch"),
        ("grads.microbatch=big", "grads.microbatch"),
        ("grads.compile=maybe", "grads.compile"),
        ("optim.lr=-0.1", "optim.lr"),
        ("optim.schedule.milestones=[0.75,0.5]", "optim.schedule.milestones"),
        ("dataset.name=imagenet", "dataset.name"),
        ("model.name=vgg", "model.name"),
        ("mechanism.name=magic", "mechanism.name"),
        ("mechanism.clip=-1", "mechanism.clip"),
        ("+mechanism.clipp=1.0", "mechanism.clipp"),
        ("+train.foo=1", "train.foo"),
        ("logger.mode=loud", "logger.mode"),
    ],
)
def test_bad_values_name_the_key(override, key):
    try:
        cfg = composed(override)
    except Exception as e:  # Hydra rejects some overrides itself (type errors on typed groups)
        assert key.split(".")[-1] in str(e)
        return
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    assert str(err.value).startswith(key), str(err.value)


def test_cli_errors_before_training(tmp_path):
    # batch larger than the dataset: needs the data, still fails before anything is written
    proc = cli_in_process("train.batch_size=5000", run_dir=tmp_path / "a", check=False)
    assert proc.returncode == 2
    assert "train.batch_size" in proc.stderr and "1437" in proc.stderr
    assert not (tmp_path / "a").exists()
    proc = cli_in_process("+model.depthh=3", run_dir=tmp_path / "m", check=False)
    assert proc.returncode == 2 and "depthh" in proc.stderr and not (tmp_path / "m").exists()
    # unknown key: Hydra refuses it and names it
    proc = cli_in_process("train.epochz=3", run_dir=tmp_path / "b", check=False)
    assert proc.returncode != 0 and "epochz" in proc.stderr


@pytest.mark.parametrize(
    "launcher,target", [("local", "JoblibLauncher"), ("slurm", "SlurmLauncher")]
)
def test_launcher_presets_compose(launcher, target):
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    cfg = compose([f"hydra/launcher={launcher}"], return_hydra_config=True)
    assert cfg.hydra.launcher._target_.endswith(target)


def test_missing_dataset_files_give_one_clear_error(tmp_path):
    proc = cli_in_process(
        "dataset=cifar10", f"data.root={tmp_path}", run_dir=tmp_path / "run", check=False
    )
    assert proc.returncode == 2
    assert "data_batch_1" in proc.stderr and "data.root" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_truncated_dataset_file_gives_one_line_and_exit_2(tmp_path):
    """A corrupt .gz: one line naming the file, exit code 2, no traceback, nothing written."""
    from conftest import SHARED

    if SHARED is None:
        pytest.skip("real data not found")
    raw = tmp_path / "data" / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for f in (SHARED / "MNIST" / "raw").glob("*.gz"):
        data = f.read_bytes()
        (raw / f.name).write_bytes(data[: len(data) // 3] if "train-images" in f.name else data)
    proc = cli_in_process(
        "dataset=mnist", f"data.root={tmp_path / 'data'}", run_dir=tmp_path / "run", check=False
    )
    assert proc.returncode == 2, proc.stderr
    assert "train-images-idx3-ubyte.gz" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()
