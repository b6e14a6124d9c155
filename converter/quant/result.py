"""Typed results of the operations on a QuantizedTensor (requantize, the scale search)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from converter.kernels.metrics import Figures
from converter.tensor import QuantizedTensor, TensorSpec

#: Routes of a :class:`RequantResult`.
ROUTES = ("carried", "requantized")


@dataclass(frozen=True)
class ScaleSearch:
    """Totals of the MSE clipping search (:func:`converter.quant.search.mse_scale_search`).

    Attributes
    ----------
    absmax_sse : float
        Squared error summed over the tensor with the plain absmax / min-max scales (ratio 1).
    search_sse : float
        Squared error with the chosen scales (never above ``absmax_sse``).
    ratios_chosen : dict of str -> int
        How many groups chose each clipping ratio (ratios formatted with ``%g``; only those chosen).
    """

    absmax_sse: float
    search_sse: float
    ratios_chosen: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, eq=False)
class RequantResult:
    """The requantized tensor and how it was made (:func:`converter.quant.requant.requantize`).

    Attributes
    ----------
    tensor : QuantizedTensor or TensorSpec
        The result, in the target scheme and groups; its spec when it was produced in row blocks and
        never held whole (:class:`converter.quant.format_quant.QuantizedRows`: ``vs_source`` then holds
        its figures).
    route : ``"carried"`` | ``"requantized"``
        Codes carried from the source, or recomputed (round to nearest or a format quantizer).
    degenerate_groups : int
        Target groups whose source values are all zero.
    identical : bool
        The result's values were checked identical to the source's, value for value (an exact carry).
    vs_source : Figures, optional
        Error figures against the source, summed inside the quantizer's own row blocks (the
        report then needs no second pass).
    values : ndarray of float32, optional
        The source's dequantized values (logical shape), when the quantizer computed them whole.
    scale_search : ScaleSearch, optional
        Totals of ``--scale-search mse``.
    quantizer : str, optional
        Label of the format quantizer that produced the result.
    note : str, optional
        Why a lossy plan still carried the codes.
    """

    tensor: "QuantizedTensor | TensorSpec"
    route: str
    degenerate_groups: int = 0
    identical: bool = False
    vs_source: Figures | None = None
    values: np.ndarray | None = None
    scale_search: ScaleSearch | None = None
    quantizer: str | None = None
    note: str | None = None

    def __post_init__(self) -> None:
        if self.route not in ROUTES:
            raise ValueError(f"unknown route {self.route!r}")
