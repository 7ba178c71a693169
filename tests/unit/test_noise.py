"""The privatizer: noise actually drawn, its records, and the multiplier they give."""

from __future__ import annotations

import math

import pytest
import torch

from dpsub.privacy import (
    NoiseBlock,
    NoiseRecord,
    Privatizer,
    SecureNoise,
    SeededNoise,
    Sensitive,
    effective_multiplier,
)


def seeded(seed=0):
    return Privatizer(SeededNoise(torch.Generator().manual_seed(seed)))


def test_isotropic_release_records_sensitivity_and_std():
    p = seeded()
    s = Sensitive(torch.zeros(20_000), 0.5)
    out = p.gaussian(s, 1.5, "g")
    assert p.records == [NoiseRecord("g", 0.5, 1.5)]
    assert out.std().item() == pytest.approx(1.5, rel=0.03)
    assert p.effective_multiplier() == pytest.approx(3.0)


def test_several_releases_compose_as_one_gaussian_mechanism():
    recs = [
        NoiseRecord("w", 10.0, 10.0 * math.sqrt(2) * 1.3),
        NoiseRecord("r", 2.0, 2.0 * math.sqrt(2) * 1.3),
    ]
    assert effective_multiplier(recs) == pytest.approx(1.3, rel=1e-12)  # GEP: exactly z
    assert effective_multiplier([]) == math.inf
    assert effective_multiplier([NoiseRecord("x", 1.0, 0.0)]) == 0.0


def test_only_sensitive_values_are_privatized():
    with pytest.raises(TypeError):
        seeded().gaussian(torch.zeros(3), 1.0)
    with pytest.raises(ValueError):
        Sensitive(torch.zeros(3), 0.0)


def test_shaped_noise_is_charged_for_its_least_noisy_direction():
    """left = diag(1, 0.25): the record's std is 0.25 * std, and the drawn noise has it."""
    p = seeded()
    rows, cols = 2, 50_000
    left = torch.diag(torch.tensor([1.0, 0.25]))
    s = Sensitive(torch.zeros(rows * cols + 10), 1.0)
    out = p.shaped(s, 2.0, [NoiseBlock(0, rows, cols, left)], "h")
    assert p.records[0].std == pytest.approx(0.5)
    assert p.effective_multiplier() == pytest.approx(0.5)
    block = out[: rows * cols].view(rows, cols)
    assert block[0].std().item() == pytest.approx(2.0, rel=0.03)
    assert block[1].std().item() == pytest.approx(0.5, rel=0.03)
    assert out[rows * cols :].abs().max() > 0  # uncovered coordinates get the plain std


def test_rank_deficient_shaping_gives_multiplier_zero():
    p = seeded()
    s = Sensitive(torch.zeros(6), 1.0)
    p.shaped(s, 1.0, [NoiseBlock(0, 3, 2, torch.ones(3, 1))])
    assert p.effective_multiplier() == 0.0


def test_anisotropic_2d_gaussian_multiplier_matches_direct_computation():
    """Noise covariance std^2 L L^T with eigenvalues (a^2, b^2) std^2: z = min(a, b) std / C."""
    theta = 0.3
    rot = torch.tensor([[math.cos(theta), -math.sin(theta)], [math.sin(theta), math.cos(theta)]])
    left = rot @ torch.diag(torch.tensor([2.0, 0.6]))
    p = seeded()
    p.shaped(Sensitive(torch.zeros(2), 0.8), 1.5, [NoiseBlock(0, 2, 1, left)])
    cov = 1.5**2 * left @ left.T
    direct = math.sqrt(torch.linalg.eigvalsh(cov.double()).min().item()) / 0.8
    assert p.effective_multiplier() == pytest.approx(direct, rel=1e-6)


def test_secure_noise_is_standard_normal_and_not_reproducible():
    src = SecureNoise()
    a, b = src.normal((200_000,), "cpu"), src.normal((200_000,), "cpu")
    assert a.mean().abs().item() < 0.02 and a.std().item() == pytest.approx(1.0, rel=0.01)
    assert not torch.equal(a, b)
    # fourth moment of a standard normal is 3
    assert (a.double() ** 4).mean().item() == pytest.approx(3.0, rel=0.05)
    u = src.uniform(100_000, "cpu")
    assert 0 <= u.min() and u.max() < 1 and u.mean().item() == pytest.approx(0.5, abs=0.01)


# ------------------------------------------------------------ independence
# Moments alone miss a sampler whose coordinates are dependent (Box-Muller's second half
# written as r*cos(theta+pi) gives pairs of exact negatives: adding two coordinates of a
# release removes the noise). These check correlations: with n samples a correlation has
# standard deviation 1/sqrt(n), and the bound is 6 of those (a false alarm over all the
# pairs tested is below 1e-6; the broken samplers give |r| = 1).
def _max_offdiagonal_correlation(rows: torch.Tensor) -> float:
    c = torch.corrcoef(rows.double().T)
    return (c - torch.diag(torch.diag(c))).abs().max().item()


@pytest.mark.parametrize("source", ["secure", "seeded"])
def test_noise_coordinates_are_uncorrelated(source):
    src = SecureNoise() if source == "secure" else SeededNoise(torch.Generator().manual_seed(3))
    n = 4000
    for d in (16, 17):  # within one release of d coordinates (even and odd sizes)
        rows = torch.stack([src.normal((d,), "cpu") for _ in range(n)])
        assert _max_offdiagonal_correlation(rows) < 6 / n**0.5, d
    # one large release: its two halves (Box-Muller's cosine and sine halves) and neighbours
    for size in (200_000, 200_001):
        z = src.normal((size,), "cpu").double()
        m = size // 2
        pairs = [(z[:m], z[m : 2 * m]), (z[:-1], z[1:]), (z[0::2][:m], z[1::2][:m])]
        for a, b in pairs:
            r = torch.corrcoef(torch.stack([a, b]))[0, 1].item()
            assert abs(r) < 6 / m**0.5, (size, r)
        # the noise on a sum of two coordinates has variance 2, not 0
        assert (z[:m] + z[m : 2 * m]).var().item() == pytest.approx(2.0, rel=0.03)
    # consecutive releases are independent of each other
    a, b = src.normal((50_000,), "cpu").double(), src.normal((50_000,), "cpu").double()
    assert abs(torch.corrcoef(torch.stack([a, b]))[0, 1].item()) < 6 / 50_000**0.5
