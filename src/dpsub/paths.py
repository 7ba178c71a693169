"""Where dpsub's files are, in a wheel install and in a source checkout.

The Hydra configs live in ``conf/`` at the top of the repository. The wheel ships a
copy as ``dpsub/conf`` inside the package (``force-include`` in pyproject.toml), so an
installed ``dpsub-train`` finds its configs wherever it runs; an editable install or
a checkout on ``PYTHONPATH`` uses the repository's ``conf/`` directly, so edits to
it take effect without reinstalling.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["conf_dir"]

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
