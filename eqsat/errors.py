"""The one hierarchy of errors a user can cause: everything derives from `Error`."""

from __future__ import annotations

from collections.abc import Iterable


class Error(ValueError):
    """Base of every error eqsat raises because of its input."""


class LocatedError(Error):
    """An error at a place in `.eqir` text: `.line` and `.col` are 1-based (0 when unknown)."""

    def __init__(self, message: str, line: int = 0, col: int = 0, source: str | None = None):
        self.message = message
        self.line = line
        self.col = col
        self.source = source
        where = f"line {line}, col {col}: " if line else ""
        prefix = f"{source}: " if source else ""
        super().__init__(f"{prefix}{where}{message}")


class ParseError(LocatedError):
    """The text is not well-formed `.eqir` (or rule text)."""


class VerifyError(LocatedError):
    """The program is well-formed text but ill-typed or inconsistent."""


class TraceError(Error):
    """A shape or type error while tracing a Python function; names the user's source line."""


class TracedAttributeError(TraceError, AttributeError):
    """An ndarray attribute a traced value does not have (`x.flatten()`); also an
    AttributeError, so `hasattr(x, "flatten")` and numpy's own probing of it work."""


class InterpretError(Error):
    """Inputs that do not fit the function, or a computation numpy cannot carry out."""


class UnknownFunction(Error, AttributeError):
    """A function name the module or executable does not have; also an AttributeError, so
    `hasattr(exe, "f")` and `getattr(exe, "f", None)` work on an Executable."""

    @classmethod
    def among(cls, owner: str, name: str, names: Iterable[str]) -> UnknownFunction:
        """`{owner} has no function @name; it has @f, @g` (or none)."""
        have = ", ".join("@" + n for n in names) or "none"
        return cls(f"{owner} has no function @{name}; it has {have}")


class UnknownOp(Error, AttributeError):
    """An op name the table does not have, in the Python rule API (`op.foo`); also an
    AttributeError, so `hasattr(op, "foo")` works."""


class UnknownRule(Error, KeyError):
    """A rule name the RuleSet does not hold; also a KeyError, as a missing key of a mapping."""

    def __str__(self) -> str:  # KeyError's own would quote the message
        return str(self.args[0])


class UnsoundRule(Error):
    """A rewrite rule whose two sides differ on some input; names the rule and the input."""


class ForkedProcessError(Error):
    """Optimization in a process forked from one that had optimized: egglog's thread pool
    stays with the parent, and the child could never free an e-graph."""
