"""Reverse-mode AD by adjoint code generation: gradients become plain IR functions.

`differentiate(module)` expands every `grad`/`value_and_grad`/`vjp` declaration of a module;
`grad`, `value_and_grad` and `vjp` do the same for traced Python functions. `VJP_RULES` holds
one rule per differentiable op.
"""

from .api import grad, value_and_grad, vjp
from .expand import differentiate, expand_decl
from .vjp_rules import VJP_RULES

__all__ = ["VJP_RULES", "differentiate", "expand_decl", "grad", "value_and_grad", "vjp"]
