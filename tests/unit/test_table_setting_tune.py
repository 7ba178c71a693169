"""gep-a3-cifar10's reduced CPU setting carries its own tuning grid (tables.Table.tune_of)."""

from __future__ import annotations

from dpsub.experiments import tables


def test_setting_tune_replaces_the_grid_for_every_mechanism():
    t = tables.load_table("gep-a3-cifar10")
    full = t.tune_of("cifar100_resnet")
    cpu = t.tune_of("cifar100_resnet_cpu")
    assert full.lr == [0.01, 0.05, 0.1] and len(full.clip["gep"]) == 9
    assert cpu.lr == [0.01, 0.1] and cpu.validation_size == full.validation_size
    sizes = {m: len(cpu.points(m)) for m in ("dpsgd", "bgep", "gep")}
    assert set(sizes.values()) == {8}  # equal for every private mechanism
