"""Where each tensor lives in a flat gradient vector, and its matrix view.

Per-example gradients are flat ``(b, p)`` matrices: clipping, projections and noise
act on rows. :class:`ParamLayout` maps the rows back to named tensors
(:meth:`~ParamLayout.unflatten`), and gives each weight its *matrix* view, out x
in*kh*kw for a convolution (:meth:`~ParamLayout.matrix_view`), which RGP, DP-PowerSGD
and DP-Hero work with.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor, nn


@dataclass(frozen=True)
class ParamLayout:
    """Named tensors laid end to end in a flat vector (in the given order)."""

    names: tuple[str, ...]
    shapes: tuple[torch.Size, ...]
    offsets: tuple[int, ...]  # start of each tensor; offsets[-1] + numels[-1] == dim

    @classmethod
    def of(cls, model: nn.Module) -> ParamLayout:
        """The trainable parameters of ``model`` in ``named_parameters`` order."""
        return cls.of_tensors({n: p for n, p in model.named_parameters() if p.requires_grad})

    @classmethod
    def of_tensors(cls, tensors: Mapping[str, Tensor]) -> ParamLayout:
        names, shapes, offsets, off = [], [], [], 0
        for name, t in tensors.items():
            names.append(name)
            shapes.append(torch.Size(t.shape))
            offsets.append(off)
            off += t.numel()
        return cls(tuple(names), tuple(shapes), tuple(offsets))

    # ------------------------------------------------------------ sizes
    @property
    def numels(self) -> tuple[int, ...]:
        return tuple(int(s.numel()) for s in self.shapes)

    @property
    def dim(self) -> int:
        return self.offsets[-1] + self.numels[-1] if self.names else 0

    def slices(self) -> dict[str, slice]:
        return {
            n: slice(o, o + k)
            for n, o, k in zip(self.names, self.offsets, self.numels, strict=True)
        }

    # -------------------------------------------------------- flat <-> named
    def flatten(self, tensors: Mapping[str, Tensor], batch: bool = False) -> Tensor:
        """Named tensors -> flat ``(p,)`` (or ``(b, p)`` with ``batch``), in layout order."""
        if batch:
            b = next(iter(tensors.values())).shape[0]
            return torch.cat([tensors[n].reshape(b, -1) for n in self.names], dim=1)
        return torch.cat([tensors[n].reshape(-1) for n in self.names])

    def unflatten(self, flat: Tensor) -> dict[str, Tensor]:
        """Flat ``(p,)`` or ``(b, p)`` -> views of shape ``shape`` or ``(b, *shape)``."""
        lead = flat.shape[:-1]
        if flat.shape[-1] != self.dim:
            raise ValueError(f"expected last dimension {self.dim}, got {tuple(flat.shape)}")
        return {
            n: flat[..., o : o + k].view(*lead, *s)
            for n, s, o, k in zip(self.names, self.shapes, self.offsets, self.numels, strict=True)
        }

    # ------------------------------------------------------------- matrices
    def matrix_names(self) -> tuple[str, ...]:
        """Tensors with at least two dimensions (weights of linear and conv layers)."""
        return tuple(n for n, s in zip(self.names, self.shapes, strict=True) if len(s) >= 2)

    def matrix_shape(self, name: str) -> tuple[int, int]:
        """(out, in * kh * kw) of a weight."""
        s = self.shapes[self.names.index(name)]
        if len(s) < 2:
            raise ValueError(f"{name} has shape {tuple(s)}: not a matrix")
        return int(s[0]), int(s.numel() // s[0])

    def matrix_view(self, flat: Tensor, name: str) -> Tensor:
        """The (out, in*kh*kw) view of ``name`` in a flat ``(p,)`` vector (or ``(b, out, in')``)."""
        i = self.names.index(name)
        rows, cols = self.matrix_shape(name)
        o = self.offsets[i]
        return flat[..., o : o + rows * cols].view(*flat.shape[:-1], rows, cols)
