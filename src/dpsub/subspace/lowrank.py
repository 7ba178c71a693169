"""Low-rank factors of weight-shaped matrices: RGP's gradient carriers and PowerSGD.

Matrices here are the (out x in*kh*kw) views of weights (``ParamLayout.matrix_view``).

* :func:`power_carriers` -- RGP Algorithm 2 (Yu et al., ICML 2021): carriers
  ``L`` (p x r, orthonormal columns) and ``R`` (r x d, orthonormal rows) spanning the top
  singular subspaces of a historical update ``Delta`` by K power iterations from a
  Gaussian start.
* :func:`random_carriers` -- RGP-random: independent uniformly random orthonormal ``L``
  and ``R``.
* :func:`carrier_projection` -- Corollary 2.1.1: ``(dL) R + L (dR) - L L^T (dL) R``, the
  projection of ``dW`` onto matrices whose column space is in span(L) or row space in
  span(R), computed from the carrier gradients ``dL = dW R^T`` and ``dR = L^T dW`` alone.
* :func:`powersgd` -- one PowerSGD compression (Vogels et al., NeurIPS 2019,
  Algorithm 1): ``P = orth(M Q)``, ``Q' = M^T P``, ``M ~ P Q'^T``, with ``Q'`` kept as the
  warm start of the next step.

Orthonormalization is Householder QR (the paper uses Gram-Schmidt: same span, and QR
stays orthonormal when ``Delta`` has rank below r, e.g. 0 at initialization).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .power import _randn, orthonormal_random_basis

__all__ = [
    "carrier_projection",
    "effective_rank",
    "power_carriers",
    "powersgd",
    "powersgd_start",
    "random_carriers",
]


def effective_rank(rank: int, rows: int, cols: int) -> int:
    """``min(rank, rows, cols)``: a rank above a matrix's dimensions adds nothing."""
    return max(1, min(int(rank), int(rows), int(cols)))


def _orth_columns(A: Tensor) -> Tensor:
    """Orthonormal columns spanning (at least) the column space of ``A`` (Householder QR)."""
    q, _ = torch.linalg.qr(A, mode="reduced")
    return q


def power_carriers(
    delta: Tensor, rank: int, iters: int = 1, generator: torch.Generator | None = None
) -> tuple[Tensor, Tensor]:
    """RGP Algorithm 2: carriers ``(L, R)`` of ``delta`` (p x d) by ``iters`` power iterations.

    Start ``R`` ~ N(0, 1) (r x d); K times: ``L = delta R^T``, orthonormalize the columns
    of ``L``, ``R = L^T delta``; finally orthonormalize the rows of ``R``. Returns ``L``
    (p x r) with orthonormal columns and ``R`` (r x d) with orthonormal rows,
    r = :func:`effective_rank`.
    """
    p, d = delta.shape
    r = effective_rank(rank, p, d)
    if iters < 1:
        raise ValueError(f"power_carriers needs iters >= 1, got {iters}")
    R = _randn((r, d), generator, delta.device, dtype=delta.dtype)
    for _ in range(int(iters)):
        L = _orth_columns(delta @ R.T)
        R = L.T @ delta
    return L, _orth_columns(R.T).T.contiguous()


def random_carriers(
    rows: int, cols: int, rank: int, generator: torch.Generator | None = None, device=None
) -> tuple[Tensor, Tensor]:
    """RGP-random: uniformly random orthonormal ``L`` (rows x r) and ``R`` (r x cols)."""
    r = effective_rank(rank, rows, cols)
    L = orthonormal_random_basis(rows, r, generator, device).T.contiguous()
    R = orthonormal_random_basis(cols, r, generator, device)
    return L, R


def carrier_projection(dL: Tensor, dR: Tensor | None, L: Tensor, R: Tensor) -> Tensor:
    """Corollary 2.1.1 (eq. 3): ``(dL) R + L (dR) - L L^T (dL) R``.

    With ``dL = dW R^T`` and ``dR = L^T dW`` (Theorem 2.1, eq. 2) and orthonormal carriers
    this is ``L L^T dW + dW R^T R - L L^T dW R^T R``, the projection of ``dW``. ``dR=None``
    gives ``(dL) R`` alone (the authors' code: frozen right carrier).
    """
    if dR is None:
        return dL @ R
    return dL @ R + L @ (dR - (L.T @ dL) @ R)


def powersgd_start(
    rows: int, cols: int, rank: int, generator: torch.Generator | None = None, device=None
) -> Tensor:
    """PowerSGD's first ``Q`` for a (rows x cols) matrix: N(0, 1) of shape (cols x r)."""
    return _randn((cols, effective_rank(rank, rows, cols)), generator, device)


def powersgd(M: Tensor, Q: Tensor) -> tuple[Tensor, Tensor]:
    """One PowerSGD step on ``M`` (p x d) from ``Q`` (d x r): ``(P Q'^T, Q')``.

    ``P = orth(M Q)`` (p x r), ``Q' = M^T P`` (d x r); ``P Q'^T = P P^T M`` is the
    projection of ``M`` onto span(P). With r = min(p, d) it is ``M`` itself.
    """
    P = _orth_columns(M @ Q)
    Q_new = M.T @ P
    return P @ Q_new.T, Q_new
