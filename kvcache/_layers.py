"""The layer-index preconditions every layout shares (LAYER-RANGE, ARG-INT on `layer`).

Both caches take a layer index in their backend faces (`SequenceCache.plan`, `depth`, ...,
`CellCache.place_step`). The checks live here, beside neither layout, so the layout modules depend on
this one and not on each other.
"""

from __future__ import annotations

from typing import Any, Protocol

import icontract

from ._errors import LayerIndexError, not_an_int
from ._ints import is_int


class _Layered(Protocol):
    """A cache with layers."""

    n_layers: int


def _layer_error(self: _Layered, layer: int) -> LayerIndexError:
    return LayerIndexError("LAYER-RANGE", "layer", "must lie in [0, n_layers)", layer=layer,
                           n_layers=self.n_layers)


def _layer_index_in_range(self: _Layered, layer: int) -> bool:
    return 0 <= layer < self.n_layers


def _layer_index_is_int(layer: Any) -> bool:
    return is_int(layer)


# Icontract evaluates preconditions bottom-up, so in each stack the type check sits nearest the
# function. Their conditions are named functions, not lambdas: icontract (and CrossHair through it)
# reads a lambda condition back from the decorator line it sits on, which a shared decorator does not have.
layer_in_range = icontract.require(
    _layer_index_in_range, "LAYER-RANGE: 0 <= layer < n_layers", error=_layer_error, enabled=True)
layer_is_int = icontract.require(
    _layer_index_is_int, "ARG-INT: layer is an int", error=lambda layer: not_an_int("layer", layer),
    enabled=True)
