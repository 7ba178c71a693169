"""Command-line overrides checked against the config tree before Hydra composes.

Hydra ignores an unknown option of an optional group (``experiment=typo`` ran the
default experiment) and reports an unknown key in seven lines with exit code 1.
:func:`check_overrides` looks at every override first (torch-free, a fraction of a
second) and raises a :class:`~dpsub.errors.ConfigError` of one line naming it, with
the closest valid names:

* ``GROUP=OPTION`` (also each option of a sweep ``GROUP=a,b``): ``conf/GROUP/OPTION.yaml``
  must exist; ``paper=`` is refused with a pointer to ``dpsub-reproduce``;
* ``KEY=VALUE`` and ``~KEY``: the key must exist in the config composed with the group
  choices (every combination of a sweep's); the message says which option of the group
  has the key when the chosen one lacks it (``mechanism.num_bases`` without ``mechanism=gep``).

Each command checks against its own config (``config_name``): ``audit=``/``audit.*`` belong to
``dpsub-audit`` (``conf/dpsub_audit.yaml``), ``pate=``/``pate.*`` to ``dpsub-pate``; another
command refuses them by name. Keys added with ``+KEY=VALUE`` are left to
:func:`dpsub.config.validate`.

:func:`compose` (also ``dpsub.config.compose``) is the one place Hydra composes a config.

Declared defaults: a group option's defaults are written once, in its Python declaration.
:mod:`dpsub.config` hands them to :func:`declare_defaults` when it is imported; each becomes
the Hydra config ``declared/<group>/<option>``, which ``conf/<group>/<option>.yaml`` lists
first in its defaults (``- /declared/mechanism/gep@_here_``) before its own values (what
differs). So every option is in the composed config (``mechanism.num_bases=500``, no ``+``)
without its default being written in the YAML too.
"""

from __future__ import annotations

import contextlib
import difflib
import itertools
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from dpsub.errors import ConfigError
from dpsub.paths import conf_dir

__all__ = [
    "check_overrides",
    "closest",
    "compose",
    "config_context",
    "config_groups",
    "declare_defaults",
    "group_options",
    "unknown_key",
]

#: Folders of conf/ that are not Hydra config groups a run can select.
NOT_GROUPS = {"hydra": "Hydra's own settings", "paper": "paper tables (dpsub-reproduce TABLE)"}
#: The command of each top-level config (``conf/<config_name>.yaml``).
COMMANDS = {"config": "dpsub-train", "dpsub_audit": "dpsub-audit", "dpsub_pate": "dpsub-pate"}
#: Groups that only one top-level config has in its defaults list.
OWN_GROUPS = {"audit": "dpsub_audit", "pate": "dpsub_pate"}
#: The key of a group that says which option it is, when it is not ``name``; setting it
#: alone keeps the other option's keys (``audit.kind=onerun`` kept the white-box audit's).
NAME_KEYS = {"audit": "kind", "pate": "aggregator"}


# ------------------------------------------------------- declared defaults
#: group -> option -> its declared defaults (``name`` first), as :func:`declare_defaults` got them
DECLARED: dict[str, dict[str, dict]] = {}
#: the package of the declared configs in Hydra's ConfigStore: ``/declared/<group>/<option>``
DECLARED_GROUP = "declared"


def declare_defaults(group: str, nodes: Mapping[str, Mapping]) -> None:
    """Store each option's declared defaults as the Hydra config ``declared/<group>/<option>``
    (a plain, untyped node: dpsub's validation checks the values, with its own messages)."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    for option, node in nodes.items():
        DECLARED.setdefault(group, {})[option] = dict(node)
        store.store(group=f"{DECLARED_GROUP}/{group}", name=option, node=dict(node))


def _require_declared() -> None:
    if not DECLARED:
        raise RuntimeError(
            "the options' declared defaults are not registered: import dpsub.config "
            "before composing a config"
        )


# --------------------------------------------------------------- composing
def compose(
    overrides: Sequence[str] = (),
    *,
    config_name: str = "config",
    return_hydra_config: bool = False,
) -> DictConfig:
    """``conf/<config_name>.yaml`` (``config``: training, ``dpsub_audit``: audits,
    ``dpsub_pate``: PATE) composed with Hydra ``overrides``, as the command line composes it.

    The one place scripts, tests and the library compose a config (not validated: see
    :func:`dpsub.config.validate`). Inside :func:`config_context` (or a ``@hydra.main`` task, which
    initializes Hydra on the same folder) it reuses that initialization.
    """
    from hydra import compose as hydra_compose
    from hydra.core.global_hydra import GlobalHydra

    _require_declared()
    overrides = list(overrides)
    if _SEARCH and not any(o.startswith("hydra.searchpath=") for o in overrides):
        overrides.append(search_override())

    def run() -> DictConfig:
        return hydra_compose(
            config_name=config_name,
            overrides=overrides,
            return_hydra_config=return_hydra_config,
        )

    if GlobalHydra.instance().is_initialized():
        return run()
    with config_context():
        return run()


#: The user's own config folders of this process (``--config-dir``, ``hydra.searchpath``):
#: Hydra searches them after conf/, and so do the checks here and :func:`compose`.
_SEARCH: list[str] = []


def quote_value(value: str) -> str:
    """A Hydra override value that may hold ``=`` and ``,``."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def use_config_dirs(entries: Sequence[str]) -> None:
    """Search ``entries`` (``file://DIR``, ``DIR`` or ``pkg://PACKAGE``) too, from now on."""
    _SEARCH[:] = [e if "://" in e else f"file://{Path(e).expanduser().resolve()}" for e in entries]


def search_override() -> str:
    """The ``hydra.searchpath=[...]`` override of :func:`use_config_dirs`' folders."""
    return "hydra.searchpath=[" + ",".join(f"'{e}'" for e in _SEARCH) + "]"


def _group_dirs(group: str) -> list[Path]:
    """conf/<group> and <folder>/<group> of each file:// folder searched."""
    extra = [Path(e.removeprefix("file://")) for e in _SEARCH if e.startswith("file://")]
    return [d / group for d in (conf_dir(), *extra)]


@contextlib.contextmanager
def config_context() -> Iterator[None]:
    """Hydra initialized on the config folder once, for many :func:`compose` calls."""
    from hydra import initialize_config_dir

    _require_declared()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        yield


def config_groups(config_name: str = "config") -> list[str]:
    """The config groups a run of ``conf/<config_name>.yaml`` can select (``conf/<group>/``),
    sorted: ``audit`` only for ``dpsub_audit``, ``pate`` only for ``dpsub_pate``."""
    return sorted(
        p.name
        for p in conf_dir().iterdir()
        if p.is_dir()
        and p.name not in NOT_GROUPS
        and OWN_GROUPS.get(p.name, config_name) == config_name
    )


def group_options(group: str) -> list[str]:
    return sorted({p.stem for d in _group_dirs(group) for p in d.glob("*.yaml")})


def closest(word: str, choices: list[str], n: int = 3) -> list[str]:
    """The closest names to a mistyped ``word`` (difflib), or ``[]``."""
    return difflib.get_close_matches(word, choices, n=n, cutoff=0.6)


def _hint(word: str, choices: list[str], what: str = "closest") -> str:
    near = closest(word, choices)
    if near:
        return f"{what}: {', '.join(near)}"
    shown = ", ".join(choices[:12]) + (", ..." if len(choices) > 12 else "")
    return f"choose from {shown}"


def _check_option(group: str, option: str) -> None:
    if group == "paper":
        raise ConfigError(
            f"paper={option}: conf/paper holds paper tables, not a config group; run a table "
            f"with `dpsub-reproduce {option}` (docs/tables.md)"
        )
    options = group_options(group)
    if any(e.startswith("pkg://") for e in _SEARCH):
        return  # a package's configs: Hydra checks them
    if option not in options and option != "null":
        raise ConfigError(
            f"{group}={option}: no {group} named {option!r} in conf/{group}/"
            + (" or your config folders' (--config-dir, hydra.searchpath)" if _SEARCH else "")
            + "; "
            + _hint(option, options)
        )


def _flat_keys(node, prefix: str = "") -> list[str]:
    if not isinstance(node, DictConfig):
        return []
    out = []
    for k in node:
        key = f"{prefix}{k}"
        out += [key, *_flat_keys(node._get_node(k), key + ".")]
    return out


def unknown_key(cfg: DictConfig, key: str, config_name: str = "config") -> str | None:
    """None if ``key`` exists in ``cfg``, else one line saying so, with the close keys."""
    parts = key.split(".")
    node = cfg
    for i, part in enumerate(parts):  # keys(): ``in`` is False for a mandatory ``???`` value
        if isinstance(node, DictConfig) and part in node.keys():
            node = node._get_node(part)
            continue
        parent = ".".join(parts[:i])
        if not isinstance(node, DictConfig):
            return f"{key}: {parent} is a value, not a section (it is {node._value()!r})"
        return _describe_missing(cfg, parent, part, node, config_name)
    return None


def _describe_missing(
    cfg: DictConfig, parent: str, part: str, node: DictConfig, config_name: str
) -> str:
    key = f"{parent}.{part}" if parent else part
    siblings = [str(k) for k in node]
    groups = config_groups(config_name)
    if not parent:  # top level: a key or a config group
        near = closest(part, sorted(set(siblings) | set(groups)))
        return f"{key}: no such key or config group" + (
            f"; closest: {', '.join(near)}" if near else ""
        )
    if parent == "model" and node.get("name") == "custom":  # the class's keywords: new keys
        return f"{key}: model=custom passes its class's keywords as new keys: write +{key}=..."
    is_group = parent in groups
    where = f"{parent}={node.get(NAME_KEYS.get(parent, 'name'), '?')}" if is_group else parent
    near = closest(part, siblings) or [s for s in siblings if s.startswith(part)][:3]
    if near:
        msg = f"{key}: no such key in {where}; closest: {', '.join(f'{parent}.{n}' for n in near)}"
    elif len(siblings) <= 8:
        msg = f"{key}: no such key; {where} has: {', '.join(siblings)}"
    else:
        msg = f"{key}: no such key in {where}"
    if is_group:
        owners = [o for o in group_options(parent) if part in option_keys(parent, o)]
        if owners:
            msg += (
                f"; {part} is a key of {parent}={', '.join(owners)} (select one with {parent}=...)"
            )
    return msg


def option_keys(group: str, option: str) -> set[str]:
    """The keys ``GROUP=OPTION`` gives its group: those of its YAML file and of the configs
    its defaults list takes (its declared defaults, another option of the group), without
    composing (a Hydra composition per option would make an error message slow)."""
    node = OmegaConf.load(_yaml(group, option))
    keys = {str(k) for k in node} - {"defaults"}
    for entry in node.get("defaults") or []:
        if not isinstance(entry, str) or entry == "_self_":
            continue  # ``override /aux@...: natural``: another group's
        path, _, package = entry.partition("@")
        if path.startswith(f"/{DECLARED_GROUP}/{group}/") and package == "_here_":
            keys |= set(DECLARED.get(group, {}).get(path.rpartition("/")[2], {}))
        elif "/" not in path and not package:  # another option of this group: its keys too
            keys |= option_keys(group, path)
    return keys


def _yaml(group: str, option: str) -> Path:
    return next(
        d / f"{option}.yaml" for d in _group_dirs(group) if (d / f"{option}.yaml").is_file()
    )


def _values(override) -> list[str]:
    """The option(s) an override names (each option of a choice sweep)."""
    if override.is_sweep_override():
        if not override.is_choice_sweep() or override.value_type.name == "GLOB_CHOICE_SWEEP":
            return []
        return list(override.sweep_string_iterator())
    return [override.get_value_element_as_str()]


def parse_overrides(overrides: list[str]):
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        return OverridesParser.create().parse_overrides(overrides)
    except HydraException as e:
        first = str(e).strip().splitlines()[0]
        raise ConfigError(f"cannot parse the overrides: {first}") from None


def check_overrides(overrides: list[str], config_name: str = "config") -> None:
    """Raise ConfigError (one line) for an override naming no group option or key of
    ``conf/<config_name>.yaml`` (``config``: dpsub-train; ``dpsub_audit``, ``dpsub_pate``)."""
    parsed = [o for o in parse_overrides(overrides) if not o.is_hydra_override()]
    groups = set(config_groups(config_name)) | {"paper"}
    choices: list[list[str]] = []  # each group override's options, for the key checks
    keys = []
    for o in parsed:
        name = o.key_or_group
        _check_entry(name, config_name)
        if name in groups:
            if not o.is_delete():
                values = _values(o)
                for v in values:
                    _check_option(name, v)
                choices.append([f"{'+' if o.is_add() else ''}{name}={v}" for v in values])
        elif not (o.is_add() or o.is_force_add()):
            keys.append(name)
    if keys:
        _check_keys(keys, choices, config_name)


def _check_entry(name: str, config_name: str) -> None:
    """A group (or its key) of another command, or a group's name key set alone: refused."""
    group, _, key = name.partition(".")
    owner = OWN_GROUPS.get(group, config_name)
    if owner != config_name:
        raise ConfigError(
            f"{name}: the {group} group is {COMMANDS[owner]}'s, not {COMMANDS[config_name]}'s"
        )
    if key and key == NAME_KEYS.get(group):
        raise ConfigError(
            f"{name}: choose the {group} with {group}=OPTION ({', '.join(group_options(group))}); "
            f"{name} alone would keep the other option's keys"
        )


def _check_keys(keys: list[str], choices: list[list[str]], config_name: str) -> None:
    with config_context():
        for job in itertools.product(*[c for c in choices if c]):
            try:
                cfg = compose(job, config_name=config_name)
            except Exception as e:  # noqa: BLE001 -- Hydra's own message, one line
                first = str(e).strip().splitlines()[0]
                raise ConfigError(f"{' '.join(job)}: {first}") from None
            for key in keys:
                msg = unknown_key(cfg, key, config_name)
                if msg:
                    raise ConfigError(msg)


# ------------------------------------------------------------------ resume
def apply_to_saved(saved: DictConfig, overrides: list[str]) -> DictConfig:
    """A run's saved config with ``KEY=VALUE`` and ``GROUP=OPTION`` overrides applied.

    A group override replaces the group's node by that option's (``logger=disabled``);
    a key must exist in the saved config or, for a section an older run lacks, in the
    default one. Whether a change is allowed on resume is checked afterwards
    (:func:`dpsub.training.checkpoint.changed_keys`). Raises ConfigError (one line).
    """
    cfg = saved.copy()
    with config_context():
        default = compose()
        for o in parse_overrides(overrides):
            name, text = o.key_or_group, o.input_line
            if o.is_sweep_override():
                raise ConfigError(f"resume: {text}: one value per key (a sweep cannot resume)")
            if name in config_groups() or name == "paper":
                option = o.get_value_element_as_str()
                _check_option(name, option)
                node = compose([f"{name}={option}"])[name]
                OmegaConf.update(cfg, name, node, merge=False, force_add=True)
                continue
            msg = unknown_key(cfg, name)
            if msg and unknown_key(default, name) is not None:
                raise ConfigError(msg)
            OmegaConf.update(cfg, name, o.value(), merge=False, force_add=True)
    return cfg
