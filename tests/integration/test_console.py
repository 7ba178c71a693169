"""What a person sees in a terminal (driven through a pseudo-terminal) and in ``train.log``."""

from __future__ import annotations
