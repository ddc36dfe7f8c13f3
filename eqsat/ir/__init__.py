"""The IR: types, the op table, modules, text format, verifier, interpreter and tracing DSL."""

from . import fused  # noqa: F401  (registers the fused-kernel and layout ops)
from .formatter import format_source
from .interpreter import interpret, interpret_function
from .module import GRAD_KINDS, Function, GradDecl, Loc, Module, Param, Stmt
from .ops import OPS, OpDef, register
from .parser import parse_module
from .printer import print_module
from .types import DType, TensorType
from .verifier import Signature, decl_signature, signatures, verify


def parse(text: str | bytes, source: str | None = None) -> Module:
    """Parse and verify `.eqir` text; errors are ParseError / VerifyError with line and col."""
    return verify(parse_module(text, source))


__all__ = [
    "GRAD_KINDS", "OPS", "DType", "Function", "GradDecl", "Loc", "Module", "OpDef", "Param",
    "Signature", "Stmt", "TensorType", "decl_signature", "format_source", "interpret",
    "interpret_function", "parse", "parse_module", "print_module", "register", "signatures",
    "verify",
]
