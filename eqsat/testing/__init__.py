"""Hypothesis strategies that draw random well-typed eqsat programs and their inputs.

>>> from hypothesis import given
>>> from eqsat.testing import functions
>>> import eqsat.ir
>>> @given(functions())
... def test_verifies(f):
...     eqsat.ir.verify(eqsat.ir.Module(f))
>>> test_verifies()

New op families get drawn once a generator for them is registered in `GENERATORS`
(`gen(builder, op_name) -> result name or None`, see `eqsat.testing.builder.Builder`).
"""

from .builder import Builder
from .equivalence import assert_equivalent
from .generators import GENERATORS, Generator
from .strategies import (default_ops, functions, has_generator, inputs, missing_generators,
                         modules, types)

__all__ = [
    "GENERATORS", "Builder", "Generator", "assert_equivalent", "default_ops", "functions",
    "has_generator", "inputs", "missing_generators", "modules", "types",
]
