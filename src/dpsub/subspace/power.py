"""Orthonormal gradient subspaces: power method, grouped bases, projections.

Notation of GEP (Yu et al., ICLR 2021, Section 3.1 and Algorithm 1; ``docs/methods.md``,
"GEP and B-GEP"): rows are vectors.  Anchor gradients ``G_a`` (m x p), a basis ``B``
(k x p) with orthonormal rows, private per-example gradients ``G`` (n x p).

* Power method (Algorithm 1, lines 3-7): random Gaussian start ``B``; ``t`` times
  ``A = G_a B^T`` (m x k), ``B = A^T G_a`` (k x p), orthonormalize the rows of ``B``.
* Embedding (line 10): ``W = G B^T`` (n x k).
* Residual (line 11): ``R = G - W B`` (n x p), computed from the *unclipped* ``W``.
* Reconstruction (line 15): ``v = (w^T B + r) / n``; :meth:`GroupedBasis.reconstruct`
  computes ``w^T B``.

With parameter grouping (Section 3.1, "we divide the parameters into different groups
and compute one orthonormal basis for each group"; Section 4) every group j has its own
basis ``B_j`` (k_j x p_j) over its range of the flat vector, ``W = [G_1 B_1^T, ...,
G_g B_g^T]`` and ``W B`` is the concatenation of the ``W_j B_j``.  Because the groups are
disjoint and each ``B_j`` has orthonormal rows, ``P = blockdiag(B_j^T B_j)`` is an
orthogonal projection and, per row, ||g||^2 = ||w||^2 + ||r||^2.

PDP-SGD (Zhou, Wu, Banerjee, ICLR 2021) projects onto the top-k eigenvectors of
``M = (1/m) sum_i g_i g_i^T`` of m public gradients (:func:`top_eigvecs_from_gram`);
RPDP-SGD and RGP-random use a random orthonormal basis (:func:`orthonormal_random_basis`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from .grouping import Group, split_quota

__all__ = [
    "RESIDUAL_SLACK",
    "GroupedBasis",
    "GroupedPowerStep",
    "PowerStep",
    "fit_grouped_basis",
    "grouped_quota",
    "orthonormal_random_basis",
    "power_iteration",
    "random_starts",
    "resolve_dtype",
    "top_eigvecs_from_gram",
    "warm_starts",
]

#: Relative margin of :meth:`GroupedBasis.residual_norms` (book-keeping residual norms).
RESIDUAL_SLACK = 1e-4

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "float64": torch.float64,
    "fp64": torch.float64,
    "double": torch.float64,
}


def resolve_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """``torch.float32`` for ``"float32"``/``"fp32"``, likewise bf16 / fp16 / fp64."""
    if isinstance(dtype, torch.dtype):
        return dtype
    key = str(dtype).lower().removeprefix("torch.")
    if key not in _DTYPES:
        raise ValueError(f"unknown compute dtype {dtype!r}; valid: {', '.join(sorted(_DTYPES))}")
    return _DTYPES[key]


def _randn(shape: tuple[int, ...], generator, device, dtype=torch.float32) -> Tensor:
    """Gaussian tensor drawn from ``generator`` (whatever its device), placed on ``device``."""
    gen_device = generator.device if generator is not None else torch.device(device)
    return torch.randn(*shape, generator=generator, device=gen_device, dtype=dtype).to(device)


def _qr_rows(B: Tensor) -> Tensor:
    """Orthonormalize the rows of ``B`` (k x d, k <= d): ``Q, _ = qr(B^T)``, return ``Q^T``."""
    q, _ = torch.linalg.qr(B.T, mode="reduced")
    return q.T.contiguous()


def _cast_scaled(Ga: Tensor, dtype: torch.dtype) -> tuple[Tensor, float]:
    """``(Ga * s, s)`` with ``s = 1 / max|Ga|``, cast to a low-precision ``dtype`` without an
    fp32 temporary.

    The scale keeps float16 from underflowing on small gradient entries (bfloat16 has
    float32's range, the scale is harmless there); :class:`PowerStep` undoes it exactly.
    """
    amax = float(Ga.abs().max()) if Ga.numel() else 0.0
    inv = 1.0 / amax if amax > 0 else 1.0
    out = torch.empty(Ga.shape, dtype=dtype, device=Ga.device)
    torch.mul(Ga, inv, out=out)
    return out, inv


class PowerStep:
    """One step of subspace iteration, ``B' = orth((Ga B^T)^T Ga)``, streamed over row chunks.

    GEP Algorithm 1, lines 4-6, with the anchor gradients ``Ga`` given in chunks of rows
    (micro-batches): ``A^T Ga = sum_c A_c^T Ga_c`` with ``A_c = Ga_c B^T``, so the m x d
    anchor matrix is never formed; :meth:`add` each chunk, then :meth:`finish`.

    The two matmuls run in ``compute_dtype``. For bfloat16 / float16 each chunk is scaled
    by ``s = 1/max|Ga_c|`` and ``A_c`` by ``a = 1/max|A_c|`` (float16's range); the chunk's
    contribution is accumulated in float32 divided by ``a s^2``, so chunks keep their
    relative weights. The accumulator and QR are float32 (float64 for a float64 start).
    """

    def __init__(self, start: Tensor, compute_dtype: torch.dtype | str = torch.float32) -> None:
        if start.dim() != 2:
            raise ValueError(f"start must be a (k, d) matrix, got shape {tuple(start.shape)}")
        self.compute_dtype = resolve_dtype(compute_dtype)
        self.low = self.compute_dtype in (torch.float16, torch.bfloat16)
        acc_dtype = torch.float64 if start.dtype == torch.float64 else torch.float32
        self._B = start.to(self.compute_dtype if self.low else acc_dtype)
        self._acc = torch.zeros(start.shape, dtype=acc_dtype, device=start.device)
        self.rows = 0

    def add(self, chunk: Tensor) -> None:
        """Accumulate ``A_c^T Ga_c`` of a chunk (n, d) of anchor gradients."""
        if chunk.shape[-1] != self._acc.shape[1]:
            raise ValueError(f"expected chunks (n, {self._acc.shape[1]}), got {tuple(chunk.shape)}")
        self.rows += int(chunk.shape[0])
        if not self.low:
            Gc = chunk if chunk.dtype == self._acc.dtype else chunk.to(self._acc.dtype)
            self._acc.addmm_((Gc @ self._B.T).T, Gc)
            return
        Gc, s = _cast_scaled(chunk, self.compute_dtype)
        A = Gc @ self._B.T  # (n, k)
        amax = float(A.abs().max().float()) if A.numel() else 0.0
        a = 1.0 / amax if amax > 0 else 1.0
        A = A * a
        self._acc.add_((A.T @ Gc).to(self._acc.dtype), alpha=1.0 / (a * s * s))

    @property
    def k(self) -> int:
        return int(self._acc.shape[0])

    def finish(self) -> Tensor:
        """The new basis: the accumulated ``A^T Ga`` with its rows orthonormalized by QR."""
        if self._acc.shape[0] == 0:
            return self._acc
        return _qr_rows(self._acc)


def power_iteration(
    Ga: Tensor,
    k: int,
    iters: int = 1,
    generator: torch.Generator | None = None,
    compute_dtype: torch.dtype | str = torch.float32,
    start: Tensor | None = None,
) -> Tensor:
    """Top-k right singular subspace of ``Ga`` (m x d) by the power method.

    GEP Algorithm 1, lines 3-7: start from a random Gaussian ``B`` (k x d); ``iters``
    times compute ``A = Ga B^T`` (m x k), ``B = A^T Ga`` (k x d) and orthonormalize the
    rows of ``B`` by QR (``Q, _ = qr(B^T)``, ``B = Q^T``).  One iteration is one step of
    subspace iteration on ``Ga^T Ga``; directions are amplified by sigma_i^2.

    ``start`` (k x d) replaces the random start: tracking a slowly moving subspace from
    the previous basis (a warm start) continues the iteration where it stopped.

    The two matmuls run in ``compute_dtype`` (float32; bfloat16 or float16 for speed, at
    an accuracy cost measured in ``tests/unit/test_subspace.py``); see :class:`PowerStep`.
    QR always runs in float32 (float64 if ``Ga`` is float64).

    Args:
        Ga: anchor gradients, one per row.
        k: number of basis vectors, ``1 <= k <= min(m, d)``.
        iters: number of power iterations t >= 1 (GEP uses t = 1).
        generator: source of the random start (any device; the start is moved to
            ``Ga.device``); unused with ``start``.
        compute_dtype: dtype of the matmuls (a ``torch.dtype`` or a name such as ``"bf16"``).
        start: optional (k x d) starting basis.

    Returns:
        ``B`` (k x d) with orthonormal rows, float32 (float64 for a float64 ``Ga``), on
        ``Ga.device``.  If ``Ga`` is rank-deficient the directions beyond its rank are an
        arbitrary orthonormal completion.
    """
    if Ga.dim() != 2:
        raise ValueError(f"Ga must be a matrix (m, d), got shape {tuple(Ga.shape)}")
    m, d = Ga.shape
    k = int(k)
    if not 1 <= k <= min(m, d):
        raise ValueError(f"power_iteration needs 1 <= k <= min(m, d) = min({m}, {d}); got k = {k}")
    if int(iters) < 1:
        raise ValueError(f"iters must be >= 1, got {iters}")
    qr_dtype = torch.float64 if Ga.dtype == torch.float64 else torch.float32
    if start is None:
        B = _randn((k, d), generator, Ga.device, dtype=qr_dtype)
    elif tuple(start.shape) != (k, d):
        raise ValueError(f"start must have shape ({k}, {d}), got {tuple(start.shape)}")
    else:
        B = start.to(device=Ga.device, dtype=qr_dtype)
    for _ in range(int(iters)):
        step = PowerStep(B, compute_dtype)
        step.add(Ga)
        B = step.finish()
    return B


def orthonormal_random_basis(
    d: int,
    k: int,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """Random k-dimensional subspace of R^d: Gaussian (k x d) with rows orthonormalized.

    Used by RPDP-SGD (Zhou et al., "V_k random") and RGP-random (Yu et al., ICML 2021).
    The span is uniformly (Haar) distributed.  Returns (k x d) with orthonormal rows.
    """
    d, k = int(d), int(k)
    if not 1 <= k <= d:
        raise ValueError(f"orthonormal_random_basis needs 1 <= k <= d = {d}; got k = {k}")
    if device is None:
        device = generator.device if generator is not None else torch.device("cpu")
    qr_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    B = _randn((k, d), generator, device, dtype=qr_dtype)
    return _qr_rows(B).to(dtype)


def top_eigvecs_from_gram(
    Ga: Tensor, k: int, return_eigenvalues: bool = False
) -> Tensor | tuple[Tensor, Tensor]:
    """Exact top-k eigenvectors of ``M = (1/m) Ga^T Ga`` (d x d) via the m x m Gram matrix.

    PDP-SGD (Zhou, Wu, Banerjee, ICLR 2021; ``docs/methods.md``): ``V_k`` = top-k eigenvectors
    of the second-moment matrix ``M = (1/m) sum_i g_i g_i^T`` of m public gradients.  With
    m small (<= a few hundred) this is exact without forming M: if ``K = Ga Ga^T = U L
    U^T`` then ``Ga^T Ga (Ga^T u) = l (Ga^T u)`` and ``v = Ga^T u / sqrt(l)`` are the
    eigenvectors of M with eigenvalues ``l / m``.  Computed in float64; the vectors are
    re-orthonormalized by QR (signs kept), so directions beyond the rank of ``Ga`` (zero
    eigenvalues) are an arbitrary orthonormal completion.

    Args:
        Ga: public gradients (m x d), one per row.
        k: number of eigenvectors, ``1 <= k <= min(m, d)``.
        return_eigenvalues: also return the eigenvalues of ``M`` (descending, (k,)).

    Returns:
        ``V`` (k x d) with orthonormal rows in ``Ga``'s dtype (float32 for low precision),
        ordered by decreasing eigenvalue; and the eigenvalues if asked.
    """
    if Ga.dim() != 2:
        raise ValueError(f"Ga must be a matrix (m, d), got shape {tuple(Ga.shape)}")
    m, d = Ga.shape
    k = int(k)
    if not 1 <= k <= min(m, d):
        raise ValueError(
            f"top_eigvecs_from_gram needs 1 <= k <= min(m, d) = min({m}, {d}); got k = {k}"
        )
    out_dtype = Ga.dtype if Ga.dtype in (torch.float32, torch.float64) else torch.float32
    G64 = Ga.to(torch.float64)
    evals, evecs = torch.linalg.eigh(G64 @ G64.T)  # ascending
    evals = evals.flip(0)[:k].clamp_min(0.0)
    U = evecs.flip(1)[:, :k]  # (m, k)
    V = G64.T @ U  # (d, k), column norms sqrt(l)
    V = V / V.norm(dim=0).clamp_min(1e-300)
    q, r = torch.linalg.qr(V, mode="reduced")
    sign = torch.sign(torch.diagonal(r))
    sign[sign == 0] = 1.0
    V = (q * sign).T.contiguous().to(out_dtype)
    if return_eigenvalues:
        return V, (evals / m).to(out_dtype)
    return V


class GroupedBasis:
    """One orthonormal basis per parameter group, acting on flat gradients.

    ``groups[j]`` is a range ``[start_j, end_j)`` of the flat vector (dimension ``dim`` =
    p) and ``bases[j]`` (k_j x size_j) has orthonormal rows.  The embedding has
    ``k = sum k_j`` coordinates, group j's in the block ``block_slices[j]``.  Groups must
    be disjoint; coordinates in no group are projected to 0 (they belong to the residual).

    All maps are batched matmuls (one per group, none per example), GEP Algorithm 1:
    ``embed`` W = G B^T (line 10), ``residual`` R = G - W B (line 11), ``reconstruct``
    w -> w^T B (line 15).
    """

    def __init__(self, groups: Sequence[Group], bases: Sequence[Tensor], dim: int) -> None:
        groups, bases = list(groups), list(bases)
        if len(groups) != len(bases):
            raise ValueError(f"{len(groups)} groups but {len(bases)} bases")
        dim = int(dim)
        prev_end = 0
        for g, b in sorted(zip(groups, bases, strict=True), key=lambda gb: gb[0].start):
            if g.end > dim:
                raise ValueError(f"group {g.name!r} [{g.start}, {g.end}) exceeds dim {dim}")
            if g.start < prev_end:
                raise ValueError(f"group {g.name!r} overlaps the previous group")
            prev_end = g.end
            if b.dim() != 2 or b.shape[1] != g.size:
                raise ValueError(
                    f"basis of group {g.name!r} must be (k_j, {g.size}), got {tuple(b.shape)}"
                )
        self.groups: list[Group] = groups
        self.bases: list[Tensor] = bases
        self.dim = dim
        self.ks: list[int] = [int(b.shape[0]) for b in bases]
        self.k = sum(self.ks)
        self.block_slices: list[slice] = []
        off = 0
        for kj in self.ks:
            self.block_slices.append(slice(off, off + kj))
            off += kj
        self._grams: list[Tensor] | None = None

    # ------------------------------------------------------------ constructors
    @classmethod
    def single(cls, basis: Tensor, name: str = "all") -> GroupedBasis:
        """A one-group basis over the whole vector from a (k x p) matrix."""
        return cls([Group(name, 0, int(basis.shape[1]))], [basis], int(basis.shape[1]))

    # ------------------------------------------------------------- properties
    @property
    def device(self) -> torch.device:
        return self.bases[0].device if self.bases else torch.device("cpu")

    @property
    def dtype(self) -> torch.dtype:
        return self.bases[0].dtype if self.bases else torch.float32

    def __repr__(self) -> str:
        parts = ", ".join(
            f"{g.name}:{kj}/{g.size}" for g, kj in zip(self.groups, self.ks, strict=True)
        )
        return f"GroupedBasis(dim={self.dim}, k={self.k}, groups=[{parts}])"

    @staticmethod
    def _as(b: Tensor, like: Tensor) -> Tensor:
        return b if (b.dtype == like.dtype and b.device == like.device) else b.to(like)

    # ---------------------------------------------------------------- algebra
    def embed(self, G: Tensor) -> Tensor:
        """``W = G B^T``: (n, p) -> (n, k), or (p,) -> (k,); block j is G[:, range_j] B_j^T."""
        vec = G.dim() == 1
        G2 = G.unsqueeze(0) if vec else G
        if G2.shape[-1] != self.dim:
            raise ValueError(f"expected last dimension {self.dim}, got {tuple(G.shape)}")
        blocks = [
            G2[:, g.start : g.end] @ self._as(b, G2).T
            for g, b in zip(self.groups, self.bases, strict=True)
        ]
        W = torch.cat(blocks, dim=1) if blocks else G2.new_zeros(G2.shape[0], 0)
        return W[0] if vec else W

    def reconstruct(self, W: Tensor) -> Tensor:
        """``W B``: (n, k) -> (n, p), or (k,) -> (p,); group j's range gets W_j B_j, others 0."""
        vec = W.dim() == 1
        W2 = W.unsqueeze(0) if vec else W
        if W2.shape[-1] != self.k:
            raise ValueError(f"expected last dimension {self.k}, got {tuple(W.shape)}")
        out = W2.new_zeros(W2.shape[0], self.dim)
        for g, b, sl in zip(self.groups, self.bases, self.block_slices, strict=True):
            if sl.stop > sl.start:
                out[:, g.start : g.end].addmm_(W2[:, sl], self._as(b, W2))
        return out[0] if vec else out

    def residual(self, G: Tensor, W: Tensor | None = None) -> Tensor:
        """``R = G - W B`` (GEP Algorithm 1, line 11); ``W`` defaults to ``embed(G)``.

        Pass the *unclipped* embedding.  Allocates one (n, p) tensor (no temporary
        reconstruction).
        """
        if W is None:
            W = self.embed(G)
        vec = G.dim() == 1
        G2, W2 = (G.unsqueeze(0), W.unsqueeze(0)) if vec else (G, W)
        if G2.shape[0] != W2.shape[0]:
            raise ValueError(f"G has {G2.shape[0]} rows but W has {W2.shape[0]}")
        R = G2.clone()
        for g, b, sl in zip(self.groups, self.bases, self.block_slices, strict=True):
            if sl.stop > sl.start:
                R[:, g.start : g.end].addmm_(W2[:, sl], self._as(b, W2), alpha=-1.0)
        return R[0] if vec else R

    def grams(self) -> list[Tensor]:
        """``M_j = B_j B_j^T`` per group (k_j x k_j; cached: bases are not changed in place)."""
        if self._grams is None:
            self._grams = [b @ b.T for b in self.bases]
        return self._grams

    def residual_norms(self, G_norms: Tensor, W: Tensor, slack: float = RESIDUAL_SLACK) -> Tensor:
        """Upper bounds of ``||g_i - w_i B||`` from ``||g_i||`` and ``W``, without forming R.

        Book-keeping (GEP's residual). With the embedding actually computed, ``w^ = B g + d``
        (``d``: rounding of the matmul), and ``M_j = B_j B_j^T``, the residual actually
        released, ``r = g - w^ B``, has ``||r||^2 = ||g||^2 - 2 ||w^||^2 + sum_j w^_j^T M_j
        w^_j + 2 w^.d`` exactly, for any basis (for an orthonormal one, ||g||^2 - ||w||^2).
        The bound adds ``slack ||g||^2`` for the unknown ``2 w^.d`` and the rounding of
        ``M`` and of the norms: it holds while those stay below ``(slack / 4) ||g||^2``;
        float32 gives ~1e-7 (``tests/unit/test_gep_speed.py`` measures them on ResNet-20).
        The margin costs a relative ``slack / (2 (||r|| / ||g||)^2)`` of a clipped
        residual: 0.1% at a per-example projection error of 0.2.
        """
        gn2 = G_norms.double().square()
        W64 = W.double()
        rn2 = gn2 - 2.0 * W64.square().sum(dim=1)
        for sl, M in zip(self.block_slices, self.grams(), strict=True):
            Wj = W64[:, sl]
            rn2 += ((Wj @ M.double()) * Wj).sum(dim=1)
        return (rn2.clamp_min(0.0) + slack * gn2).sqrt().to(G_norms.dtype)

    def project(self, v: Tensor) -> Tensor:
        """Orthogonal projection ``v B^T B`` onto the span, for (p,) or (n, p)."""
        return self.reconstruct(self.embed(v))

    # ------------------------------------------------------------ device, I/O
    def to(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        """A copy with the bases on ``device`` (and in ``dtype``)."""
        bases = [b.to(device=device, dtype=dtype) for b in self.bases]
        return GroupedBasis(self.groups, bases, self.dim)

    def state_dict(self) -> dict:
        return {
            "dim": self.dim,
            "groups": [(g.name, g.start, g.end) for g in self.groups],
            "bases": [b.detach().cpu() for b in self.bases],
        }

    @classmethod
    def from_state_dict(cls, state: dict, device: torch.device | str | None = None) -> GroupedBasis:
        groups = [Group(str(n), int(s), int(e)) for n, s, e in state["groups"]]
        bases = [b.to(device) if device is not None else b for b in state["bases"]]
        return cls(groups, bases, int(state["dim"]))


def grouped_quota(groups: Sequence[Group], k: int, m: int) -> list[int]:
    """Basis vectors per group: ``k`` split by sqrt(size) with caps ``min(size_j, m)``."""
    return split_quota([g.size for g in groups], k, cap=[min(g.size, m) for g in groups])


def random_starts(
    groups: Sequence[Group],
    quota: Sequence[int],
    generator: torch.Generator | None,
    device: torch.device | str,
    dtype: torch.dtype = torch.float32,
) -> list[Tensor]:
    """Gaussian (k_j x size_j) starts of the power method, one per group, drawn in order."""
    return [
        _randn((kj, g.size), generator, device, dtype)
        if kj
        else torch.zeros(0, g.size, device=device, dtype=dtype)
        for g, kj in zip(groups, quota, strict=True)
    ]


def warm_starts(
    start: GroupedBasis,
    groups: Sequence[Group],
    quota: Sequence[int],
    device: torch.device | str,
    dtype: torch.dtype = torch.float32,
) -> list[Tensor]:
    """The bases of ``start`` as power-method starts (ValueError if groups or quota differ)."""
    if list(start.ks) != list(quota) or [(g.start, g.end) for g in start.groups] != [
        (g.start, g.end) for g in groups
    ]:
        raise ValueError(f"start {start!r} does not match the groups and quota {list(quota)}")
    return [b.to(device=device, dtype=dtype) for b in start.bases]


class GroupedPowerStep:
    """:class:`PowerStep` for every parameter group at once, streamed over row chunks.

    ``add(G)`` takes a chunk of flat anchor gradients (n, p) and feeds each group its
    columns; ``finish()`` is the new :class:`GroupedBasis` (groups with k_j = 0 keep an
    empty basis: their coordinates belong to the residual).
    """

    def __init__(
        self,
        groups: Sequence[Group],
        starts: Sequence[Tensor],
        dim: int,
        compute_dtype: torch.dtype | str = torch.float32,
    ) -> None:
        self.groups, self.dim = list(groups), int(dim)
        self.steps = [PowerStep(b, compute_dtype) for b in starts]

    def add(self, G: Tensor) -> None:
        if G.dim() != 2 or G.shape[1] != self.dim:
            raise ValueError(f"expected anchor gradients (n, {self.dim}), got {tuple(G.shape)}")
        for g, step in zip(self.groups, self.steps, strict=True):
            if step.k:
                step.add(G[:, g.start : g.end])

    def finish(self) -> GroupedBasis:
        return GroupedBasis(self.groups, [s.finish() for s in self.steps], self.dim)


def fit_grouped_basis(
    Ga: Tensor,
    groups: Sequence[Group],
    k: int,
    iters: int = 1,
    generator: torch.Generator | None = None,
    compute_dtype: torch.dtype | str = torch.float32,
    start: GroupedBasis | None = None,
) -> GroupedBasis:
    """GEP's anchor subspace with parameter grouping (Algorithm 1 lines 2-7, Section 4).

    The quota ``k`` is split by :func:`grouped_quota` in proportion to sqrt(group size)
    with caps ``min(size_j, m)``; each group with k_j > 0 then gets :func:`power_iteration`
    on its columns ``Ga[:, start_j:end_j]`` (groups with k_j = 0 get an empty (0, size_j)
    basis: their coordinates go entirely to the residual).

    Args:
        Ga: anchor gradients (m x p).
        groups: from :func:`~dpsub.subspace.grouping.group_parameters`.
        k: total number of basis vectors.
        iters, generator, compute_dtype: as in :func:`power_iteration`.
        start: a previous basis over the same groups (warm start) instead of random starts.
    """
    if Ga.dim() != 2:
        raise ValueError(f"Ga must be a matrix (m, p), got shape {tuple(Ga.shape)}")
    m, p = Ga.shape
    groups = list(groups)
    quota = grouped_quota(groups, k, m)
    dtype = torch.float64 if Ga.dtype == torch.float64 else torch.float32
    if start is not None:
        starts = warm_starts(start, groups, quota, Ga.device, dtype)
    else:
        starts = random_starts(groups, quota, generator, Ga.device, dtype)
    for _ in range(int(iters)):
        step = GroupedPowerStep(groups, starts, p, compute_dtype)
        step.add(Ga)
        basis = step.finish()
        starts = basis.bases
    return basis
