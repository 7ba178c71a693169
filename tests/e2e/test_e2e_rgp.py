"""RGP's carriers under ghost clipping on a wide residual network (slow)."""

from __future__ import annotations

import torch

from dpsub.models import build_model

from helpers.rgp import check_ghost_carriers


def test_ghost_clipping_of_the_carriers_equals_vmap_on_a_wrn():
    torch.manual_seed(0)
    net = build_model("wrn", (3, 16, 16), 10, depth=10, width=1)
    x, y = torch.randn(7, 3, 16, 16), torch.randint(0, 10, (7,))
    check_ghost_carriers(net, x, y, "full")
