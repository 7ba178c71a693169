"""The errors dpsub reports to a user, in a leaf module (imports nothing of dpsub).

The command line maps each to one line on stderr and an exit code:

* :class:`ConfigError` (exit 2): an invalid configuration value; the message starts
  with the full key, e.g. ``privacy.epsilon: must be > 0, got -1``.
* :class:`DataError` (exit 2): a dataset or auxiliary file is missing or unreadable;
  the message names the file.
* :class:`PrivacyError` (exit 3): a step would release less noise than the privacy plan
  says (a bug in a mechanism), or a release that is not finite; nothing of that step
  reaches the optimizer.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """An invalid configuration value; the message names the key."""


class ResumeError(ConfigError):
    """A resume that cannot continue the run it names (no checkpoint, changed settings)."""


class RunDirInUse(ResumeError):
    """Another process holds the run dir's lock: it is training that run (a sweep skips it)."""


class DataError(Exception):
    """A data file is missing, truncated or malformed; the message names the file."""


class DatasetNotFoundError(DataError, FileNotFoundError):
    """The dataset files are not under the data root (and could not be downloaded)."""


class PrivacyError(RuntimeError):
    """A release that does not carry the noise the privacy plan charges for."""


EXIT_CODES: dict[type[Exception], int] = {ConfigError: 2, DataError: 2, PrivacyError: 3}


def exit_code(err: BaseException) -> int | None:
    """The exit code of a dpsub error (None for anything else)."""
    for cls, code in EXIT_CODES.items():
        if isinstance(err, cls):
            return code
    return None
