"""What the executables of every target share: a module's compiled functions called by name
(`exe("f", ...)`), as the traced function itself (`exe(f, ...)`) or as attributes (`exe.f`).

A target prepares one `CompiledFunction` per IR function (everything a call needs, made once)
and hands them to `BaseExecutable._install`; dispatch, the lookup of a traced function's name
(once per function), the errors for unknown names and the attribute access are the same for
every target because they are this code.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..errors import UnknownFunction
from ..ir.dsl_function import function_name
from ..ir.module import Function, Module

Results = np.ndarray | tuple[np.ndarray, ...]


class CompiledFunction:
    """One IR function compiled for a target, called on numpy arrays: what `exe.f` is.

    A subclass defines `__call__(*arrays, **named)` (arguments in order or by parameter name;
    one result as an array, several as a tuple) and `__reduce__` (pickled as its module and
    name, compiled again where it is loaded, as the executable is); it holds what its calls
    need, not the executable, so no reference cycle keeps compiled code or device memory
    alive after both are dropped. It is named as the IR function (`__name__`, `__qualname__`)
    and its `__doc__` states the signature, for help(), tracebacks and logs.
    """

    target = ""  # the target's name, as eqsat.compile takes it

    def __init__(self, func: Function, module: Module):
        self.func = func
        self._module = module
        self.__name__ = self.__qualname__ = func.name
        self.__doc__ = signature_doc(func, module, self.target)

    def __repr__(self) -> str:
        return f"<eqsat compiled function @{self.func.name} of @{self._module.name}>"


def signature_doc(func: Function, module: Module, target: str) -> str:
    """What `help(exe.f)` says: the signature with the parameters' names and types and the
    result types, then how to call it."""
    params = ", ".join(f"{p.name}: {p.type}" for p in func.params)
    types = [str(t) for t in func.result_types]
    results = types[0] if len(types) == 1 else f"({', '.join(types)})"
    returns = "one array" if len(types) == 1 else f"a tuple of {len(types)} arrays"
    on = f" for the {target} target" if target else ""
    return (f"{func.name}({params}) -> {results}\n\nThe function @{func.name} of module "
            f"@{module.name}, compiled by eqsat{on}: call it on numpy arrays of these types, "
            f"in order or by parameter name; it returns {returns}.")


class BaseExecutable:
    """Compiled functions of a module: `exe("f", *arrays)`, `exe(f, *arrays)` or
    `exe.f(*arrays)`. A subclass sets `module` (and `_source`, the module as given to
    eqsat.compile, where a traced function is looked up; None: `module`) and its own
    attributes, then calls `_install` with its functions."""

    module: Module
    _source: Module | None = None
    _entries: Mapping[str, CompiledFunction] = {}

    def _install(self, entries: Mapping[str, CompiledFunction]) -> None:
        """Make `entries` the callable functions. `exe.f` is an instance attribute, not found
        through __getattr__ (which Python calls only after the class and instance lookups
        miss: ~1 us a call). Names of the executable's own attributes stay theirs, names
        starting with "_" the internals'."""
        self._entries = dict(entries)
        self._resolved: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        for name, entry in self._entries.items():
            if not name.startswith("_") and not hasattr(type(self), name) \
                    and name not in vars(self):
                setattr(self, name, entry)

    @property
    def functions(self) -> tuple[str, ...]:
        """The names of the callable functions."""
        return tuple(self._entries)

    def __call__(self, name: str, /, *arrays: Any, **named: Any) -> Results:
        """Run function `name` (or the @eqsat.function itself) on numpy arrays (or values numpy
        can convert; a GPU's executable also takes device arrays), passed in order or by
        parameter name."""
        if type(name) is not str:
            name = self._resolve(name)
        entry = self._entries.get(name)
        if entry is None:
            raise UnknownFunction.among("the executable", name, self._entries)
        return entry(*arrays, **named)

    def _resolve(self, function: Any) -> str:
        """The name a traced function has here, looked up once per function (resolving
        compares its IR with the module's: ~2 us a call)."""
        try:
            return self._resolved[function]
        except (KeyError, TypeError):  # not seen yet, or not weakly referable
            name = function_name(function, self.module if self._source is None
                                 else self._source)
        with contextlib.suppress(TypeError):
            self._resolved[function] = name
        return name

    def __getattr__(self, name: str) -> Callable[..., Results]:
        """`exe.f` for function @f (set as an attribute by _install; the executable's own
        attributes, such as `module` and `functions`, keep their names: call functions of
        those names as `exe("module", ...)`). It pickles as the executable does:
        `pool.map(exe.f, batches)` sends it to multiprocessing workers. An unknown name is an
        UnknownFunction, which is also an AttributeError."""
        if name.startswith("_"):
            raise AttributeError(name)
        if name not in self._entries:
            raise UnknownFunction.among("the executable", name, self._entries)
        return self._entries[name]

    def __dir__(self) -> list[str]:
        """The attributes and the callable functions (for tab completion)."""
        return sorted(set(super().__dir__()) | set(self._entries))
