"""The staged DSL: `@function` traces annotated Python functions into IR, once.

    @function
    def predict(x: f32[128, 784], w: f32[784, 10]):
        return relu(x @ w)

Python operators, numpy-named functions and the composites below build typed IR statements;
numpy broadcasting becomes explicit `broadcast` ops and Python scalars `const` ops. A shape or
type error raises `eqsat.TraceError` naming the user's file and line. This module gathers the
public names; the implementation lives in dsl_trace (tracing core), dsl_tracer (traced values),
dsl_array (reductions, layout, indexing), dsl_numpy (numpy-named functions), dsl_nn
(composites) and dsl_function.
"""

from __future__ import annotations

from .dsl_function import TracedFunction, function
from .dsl_nn import gelu, layer_norm, logsumexp, softmax
from .dsl_numpy import *  # noqa: F403  (generated from the op table; listed in its __all__)
from .dsl_numpy import __all__ as _numpy_names
from .dsl_tracer import Tracer

__all__ = sorted(["Tracer", "TracedFunction", "function", "gelu", "layer_norm", "logsumexp",
                  "softmax", *_numpy_names])
