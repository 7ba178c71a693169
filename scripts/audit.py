"""Thin wrapper: ``python scripts/audit.py [overrides]`` is ``dpsub-audit [overrides]``.

uv run python scripts/audit.py mechanism=dpsgd privacy.epsilon=2 audit=whitebox
uv run python scripts/audit.py dataset=mnist audit=onerun
"""

from dpsub.cli.audit import cli

if __name__ == "__main__":
    cli()
