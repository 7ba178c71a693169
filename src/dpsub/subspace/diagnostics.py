"""Diagnostics of gradient subspaces: stable rank and projection errors.

* Stable rank ``||M||_F^2 / ||M||_2^2`` (the "effective" number of directions of a
  gradient matrix; 1 for rank one, n for an n x n identity).  GEP's residual bound
  (Yu et al., ICLR 2021, Eq. 3) and PDP-SGD's analysis (Zhou et al., ICLR 2021) both rest
  on gradients having a small effective rank.
* Relative projection error ``||g - P g|| / ||g||`` with ``P = B^T B`` (GEP Algorithm 1:
  the residual ``r = g - w B`` over the gradient), for one vector, per row of a matrix,
  or for the mean row (what a non-private step would use).
* Orthonormality error ``max_j ||B_j B_j^T - I||_max`` of a :class:`GroupedBasis`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .power import GroupedBasis

__all__ = [
    "captured_energy",
    "orthonormality_error",
    "relative_error_of_mean",
    "relative_projection_error",
    "row_relative_errors",
    "stable_rank",
]


def _as_grouped(basis: GroupedBasis | Tensor) -> GroupedBasis:
    return basis if isinstance(basis, GroupedBasis) else GroupedBasis.single(basis)


def stable_rank(M: Tensor) -> float:
    """``||M||_F^2 / ||M||_2^2`` (a vector counts as a 1 x d matrix); 0.0 for a zero matrix."""
    M = M.detach()
    if M.dim() == 1:
        M = M.unsqueeze(0)
    if M.dim() != 2:
        raise ValueError(f"stable_rank needs a matrix, got shape {tuple(M.shape)}")
    if M.numel() == 0:
        return 0.0
    M = M.to(torch.float64)
    fro2 = float((M * M).sum())
    if fro2 == 0.0:
        return 0.0
    # The spectral norm from the smaller Gram matrix (exact; n or d may be large).
    gram = M @ M.T if M.shape[0] <= M.shape[1] else M.T @ M
    spec2 = float(torch.linalg.eigvalsh(gram)[-1])
    return fro2 / spec2 if spec2 > 0 else 0.0


def row_relative_errors(G: Tensor, basis: GroupedBasis | Tensor) -> Tensor:
    """``||g_i - P g_i|| / ||g_i||`` for every row (0 for a zero row), shape (n,)."""
    basis = _as_grouped(basis)
    G2 = G.unsqueeze(0) if G.dim() == 1 else G
    num = basis.residual(G2).norm(dim=1)
    den = G2.norm(dim=1)
    return torch.where(den > 0, num / den.clamp_min(torch.finfo(den.dtype).tiny), 0.0)


def relative_projection_error(g: Tensor, basis: GroupedBasis | Tensor) -> float:
    """``||g - P g|| / ||g||`` for a vector (p,); for a matrix (n, p), the mean over rows."""
    return float(row_relative_errors(g, basis).mean())


def relative_error_of_mean(G: Tensor, basis: GroupedBasis | Tensor) -> float:
    """Relative projection error of the mean row ``mean_i g_i`` of ``G`` (n, p)."""
    return relative_projection_error(G.mean(dim=0) if G.dim() == 2 else G, basis)


def captured_energy(G: Tensor, basis: GroupedBasis | Tensor) -> float:
    """``sum_i ||P g_i||^2 / sum_i ||g_i||^2`` (= ||W||_F^2 / ||G||_F^2); 0.0 for G = 0."""
    basis = _as_grouped(basis)
    total = float(G.double().pow(2).sum())
    if total == 0.0:
        return 0.0
    return float(basis.embed(G).double().pow(2).sum()) / total


def orthonormality_error(basis: GroupedBasis | Tensor) -> float:
    """``max_j max |B_j B_j^T - I|`` over the groups (0 for an exactly orthonormal basis)."""
    basis = _as_grouped(basis)
    err = 0.0
    for b in basis.bases:
        if b.shape[0] == 0:
            continue
        b64 = b.to(torch.float64)
        eye = torch.eye(b.shape[0], dtype=torch.float64, device=b.device)
        err = max(err, float((b64 @ b64.T - eye).abs().max()))
    return err
