"""iattn: the implicit attention of gated linear RNNs (Mamba, Mamba-2, Griffin, RWKV, RetNet, GLA, HGRN,
Gated DeltaNet, ...), exact and fast, from Python.

Operators are lazy: build one from arrays (``diagonal``, ``causal_conv``, ``linear_recurrence``,
``semiseparable``, ``group_norm``), compose with ``*``, ``+``, ``flip``, ``row_normalize``, then evaluate
(``apply``, ``materialize``, ``mean``, ``head_means``, ``row``, ``col``, ``block``). Arrays come in as
numpy arrays or torch tensors (float32 or float64, on the CPU) and results go out as numpy arrays that
own their C++ memory (``torch.from_numpy`` wraps them without a copy). See docs/python.md.
"""
from __future__ import annotations

from . import _iattn
from ._iattn import (
    Decomposition,
    Operator,
    causal_conv,
    diagonal,
    flip,
    group_norm,
    linear_recurrence,
    row_normalize,
    semiseparable,
    semiseparable_factored,
)
from ._iattn import models
from . import explain

__version__ = _iattn.__version__

__all__ = [
    "Decomposition",
    "Operator",
    "Weights",
    "causal_conv",
    "diagonal",
    "explain",
    "flip",
    "group_norm",
    "linear_recurrence",
    "models",
    "row_normalize",
    "semiseparable",
    "semiseparable_factored",
]


class Weights(dict):
    """A model's weights: a dict of arrays named as its state_dict's fields, with the model's config.

    ``iattn.models.<name>.init(...)`` returns one; build one from your own arrays with
    ``Weights(arrays, config)`` (config: a dict of the model's config fields, see ``models.<name>.config()``).
    """

    def __init__(self, arrays=(), config=None):
        super().__init__(arrays)
        self.config = dict(config or {})

    def __repr__(self):
        return f"iattn.Weights({len(self)} arrays, config={self.config!r})"
