"""Where dpsub's files are, in a wheel install and in a source checkout.

The Hydra configs live in ``conf/`` at the top of the repository. The wheel ships a
copy as ``dpsub/conf`` inside the package (``force-include`` in pyproject.toml), so an
installed ``dpsub-train`` finds its configs wherever it runs; an editable install or
a checkout on ``PYTHONPATH`` uses the repository's ``conf/`` directly, so edits to
it take effect without reinstalling. The ``dpsub-reproduce``, ``dpsub-table``... commands
are modules of :mod:`dpsub.experiments` (nothing else is shipped for them).
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["committed_step_times", "conf_dir", "project_root", "wheel_install"]

_PACKAGE = Path(__file__).resolve().parent


def conf_dir() -> Path:
    """The Hydra config directory: the packaged ``dpsub/conf`` when it exists (wheel
    install), else the repository's top-level ``conf/`` (editable / dev install)."""
    for candidate in (_PACKAGE / "conf", _PACKAGE.parents[1] / "conf"):
        if (candidate / "config.yaml").is_file():
            return candidate
    raise FileNotFoundError(
        f"dpsub's Hydra configs are missing: neither {_PACKAGE / 'conf'} (wheel install) nor "
        f"{_PACKAGE.parents[1] / 'conf'} (source checkout) holds config.yaml; reinstall dpsub"
    )


def _packaged(name: str) -> Path | None:
    """``dpsub/<name>`` inside an installed wheel, else None (a source checkout)."""
    return _PACKAGE / name if (_PACKAGE / name).is_dir() else None


def project_root() -> Path:
    """Where the scripts put ``outputs/`` and ``results/`` by default: the repository in a
    source checkout, the working directory in a wheel install (as ``dpsub-train`` does)."""
    return Path.cwd() if _packaged("conf") else _PACKAGE.parents[1]


def wheel_install() -> bool:
    """Installed from a wheel (configs and scripts inside the package), not a checkout."""
    return _packaged("conf") is not None


def committed_step_times() -> Path:
    """The step times committed with the repository (``results/tables/step_times.json``),
    which the wheel ships as ``dpsub/step_times.json``: ``dpsub-reproduce --dry-run``'s costs."""
    packaged = _PACKAGE / "step_times.json"
    return (
        packaged
        if packaged.is_file()
        else _PACKAGE.parents[1] / "results" / "tables" / "step_times.json"
    )
