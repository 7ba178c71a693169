"""What a GPU command carries (tests/integration/test_gpu_kit.py and its e2e twin)."""

from __future__ import annotations

from pathlib import Path

from dpsub.experiments.gpu import stage

from conftest import REPO

SHARED = REPO.parent / "shared"


def planned_carry(tmp_path: Path, real_data: bool = True) -> list[tuple[str, int]]:
    """What a GPU command carries, measured as the device measures it (a tar): the tree after
    ``gpu_run.py --slim``, the wheels, one cell's checkpoint and (with ``real_data``; packing
    takes half a minute) the staging of the aux set and CIFAR-10."""
    tree = stage.carry_list(REPO, carried=(), slimmed=True)
    items = [(str(p), n) for p, n in tree]
    if (SHARED / "device" / "wheels").is_dir():
        wheels = (SHARED / "device/wheels").glob("*.whl")
        items += [(str(w), stage.travel_bytes(w.stat().st_size)) for w in wheels]
    if real_data and (SHARED / "device" / "wheels").is_dir():
        packed = tmp_path / stage.PACKED_AUX
        items.append(
            ("aux packed", stage.pack_aux(SHARED / "data" / stage.AUX_FILE, packed)["bytes"])
        )
    if real_data and (SHARED / "data" / "cifar10_jpeg" / "cifar10_jpeg.npz").is_file():
        dest = tmp_path / stage.PACKED_CIFAR
        stage.pack_cifar10(SHARED / "data/cifar10_jpeg/cifar10_jpeg.npz", dest)
        items.append(("cifar10 packed", dest.stat().st_size))
    # an in-progress cell: ResNet20's weights and momentum (float32), ledger, logs: < 4 MiB
    items.append(("cell checkpoint", 4 * stage.MiB))
    return items
