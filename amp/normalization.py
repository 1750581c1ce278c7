"""apex's ``apex.normalization``: ``FusedLayerNorm`` and ``FusedRMSNorm`` (and their
``MixedFused*`` forms), so that models written with them build and train anywhere.

apex runs them with its own CUDA kernels; here they are torch's: ``FusedLayerNorm`` is
``torch.nn.LayerNorm`` under apex's name (same parameters, state dict and results), and
``FusedRMSNorm`` computes ``x / sqrt(mean(x**2) + eps) * weight`` over the last
``normalized_shape`` dimensions in float32, returned in the input's dtype as apex's kernel
does. The ``MixedFused*`` forms (Megatron's) return the weight's dtype instead, as apex's do.
"""

from __future__ import annotations

from typing import List, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["FusedLayerNorm", "FusedRMSNorm", "MixedFusedLayerNorm", "MixedFusedRMSNorm"]

# typing's generics: a module-level alias is evaluated at import, and Python 3.8's builtins
# and collections.abc classes cannot be subscripted.
Shape = Union[int, List[int], Tuple[int, ...], torch.Size]


class FusedLayerNorm(nn.LayerNorm):
    """apex's ``FusedLayerNorm(normalized_shape, eps=1e-5, elementwise_affine=True)``: torch's
    ``LayerNorm``. apex's ``memory_efficient`` (a kernel detail) is accepted and ignored."""

    def __init__(
        self,
        normalized_shape: Shape,
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        memory_efficient: bool = False,
    ) -> None:
        super().__init__(normalized_shape, eps=eps, elementwise_affine=elementwise_affine)
        self.memory_efficient = memory_efficient


class MixedFusedLayerNorm(FusedLayerNorm):
    """apex's ``MixedFusedLayerNorm``: half input, float32 weights, output in the weight's
    dtype."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        dtype = self.weight.dtype if self.weight is not None else input.dtype
        return F.layer_norm(
            input.to(dtype), self.normalized_shape, self.weight, self.bias, self.eps
        )


class FusedRMSNorm(nn.Module):
    """apex's ``FusedRMSNorm(normalized_shape, eps=1e-5, elementwise_affine=True)``: root mean
    square normalisation with a ``weight`` (initialised to ones), no bias."""

    def __init__(
        self,
        normalized_shape: Shape,
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        memory_efficient: bool = False,
    ) -> None:
        super().__init__()
        if isinstance(normalized_shape, int):
            normalized_shape = (normalized_shape,)
        self.normalized_shape = tuple(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        self.memory_efficient = memory_efficient
        if elementwise_affine:
            self.weight = nn.Parameter(torch.ones(self.normalized_shape))
        else:
            self.register_parameter("weight", None)

    def reset_parameters(self) -> None:
        if self.weight is not None:
            nn.init.ones_(self.weight)

    def _normalized(self, input: torch.Tensor) -> torch.Tensor:
        dims = tuple(range(-len(self.normalized_shape), 0))
        x = input.float()
        out = x * torch.rsqrt(x.pow(2).mean(dim=dims, keepdim=True) + self.eps)
        if self.weight is not None:
            out = out * self.weight.float()
        return out

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return self._normalized(input).to(input.dtype)

    def extra_repr(self) -> str:
        return (
            f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"
        )


class MixedFusedRMSNorm(FusedRMSNorm):
    """apex's ``MixedFusedRMSNorm``: output in the weight's dtype."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        dtype = self.weight.dtype if self.weight is not None else input.dtype
        return self._normalized(input).to(dtype)
