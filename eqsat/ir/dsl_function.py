"""`@function`: trace a Python function once into an IR Function; `TracedFunction` wraps it.

A traced function carries the IR items it needs (its callees first, itself last), so
`Module(f)` brings them along; called with traced values it becomes a `call` statement, called
with numpy arrays it runs the reference interpreter.
"""

from __future__ import annotations

import functools
import inspect
import re
import sys
from collections.abc import Callable, Iterable
from typing import Any

from ..errors import Error, InterpretError, UnknownFunction
from .dsl_trace import (active_trace, constant, current_trace, describe, literal, trace_error,
                        tracing)
from .dsl_tracer import Tracer
from .interpreter import bind_arguments, interpret
from .module import (Function, GradDecl, Item, Module, Param, Stmt, _expand, find_copies,
                     merge_items)
from .printer import format_function, format_grad_decl
from .types import TensorType, shape_problem
from .verifier import Signature, signatures, verify

_IR_NAME = re.compile(r"[A-Za-z0-9_]+\Z")

def _closure(items: Iterable[Any]) -> dict[str, Item]:
    """The IR items that `items` stand for, callees before callers, each once, by name (a
    different item of a name already taken is renamed as `Module` does)."""
    index: dict[str, Item] = {}
    for item in items:
        merge_items(index, _expand(item))
    return index


def function_name(name: Any, module: Module | None = None) -> str:
    """`name`, or the name a traced function has in `module` (without one, its own name):
    callers may pass the function where a name is asked for.

    Anything else is an `UnknownFunction` (an array passed first, the name forgotten, would
    otherwise reach a dict lookup as an unhashable key and raise a TypeError)."""
    if isinstance(name, TracedFunction):
        return name.name if module is None else name.name_in(module)
    if not isinstance(name, str):
        raise UnknownFunction(f"a function is named by a string or an @eqsat.function, got a "
                              f"value of type {type(name).__name__}; the name comes first: "
                              f"exe(\"f\", x, ...)")
    return name


class TracedFunction:
    """An IR function with the items it calls; call it in a trace (a `call`) or on arrays."""

    # How an eager call runs: eqsat's facade may install its own (one that expands gradients).
    runner: Callable[..., Any] = staticmethod(interpret)

    def __init__(self, ir: Function | GradDecl, items: tuple[Item, ...],
                 fn: Callable[..., Any] | None = None):
        self.ir = ir
        self.name = ir.name
        self.fn = fn
        self._items = items
        self._module: Module | None = None
        self._signature: Signature | None = None

    @classmethod
    def from_ir(cls, function: Function | GradDecl, items: Iterable[Any] = ()) -> TracedFunction:
        """Wrap an IR function (or gradient declaration) and the items it refers to.

        `items` may hold Functions, GradDecls and TracedFunctions; their callees come along.
        Names are made unique in this closure as `Module` does (calls follow a renamed item),
        `function` last: read its name back from `.name`.
        """
        if not isinstance(function, (Function, GradDecl)):
            raise Error(f"TracedFunction.from_ir takes a Function or GradDecl, "
                        f"not {type(function).__name__}")
        index = _closure(items)
        name = merge_items(index, [function]).get(function.name, function.name)
        out = cls(index[name], tuple(index.values()))
        out.module  # verify now, so a bad function fails where it is made
        return out

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickles as its IR (what it computes), not as the Python function it was traced
        from: the module-level name of a decorated function is this object, so pickle could
        not find the function by name."""
        return _restore, (self.ir, self._items, {k: getattr(self, k) for k in _WRAPPER_ATTRS
                                                if hasattr(self, k)})

    def name_in(self, module: Module) -> str:
        """The name this function's IR has in `module`: its own where the module's item of
        that name is its IR (calling the same callees), else that of the first item equal to
        it up to names (its name with any suffix `_k`, callees renamed alike, as `Module`
        renames them); an `UnknownFunction` where there is none. Two functions of one body
        calling different callees differ."""
        copies = find_copies(module.items, self._items)[self.name]
        if copies:
            return self.name if self.name in copies else copies[0]
        raise UnknownFunction(f"the traced function {self.name} is not in module "
                              f"@{module.name}" + (f": its @{self.name} is a different function"
                                                   if self.name in module else ""))

    def __eqsat_items__(self) -> list[Item]:
        """The IR items this function needs, callees first, itself last (for `Module`)."""
        return list(self._items)

    @property
    def module(self) -> Module:
        """A verified module of this function and everything it calls."""
        if self._module is None:
            self._module = verify(Module.of(self.name, self._items))
        return self._module

    @property
    def signature(self) -> Signature:
        """The parameters and result types a caller sees."""
        if self._signature is None:
            if isinstance(self.ir, Function):
                self._signature = Signature(self.ir.params, self.ir.result_types)
            else:
                self._signature = signatures(self.module)[self.name]
        return self._signature

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # Called while another function is traced, even with Python scalars only, it is a
        # `call` there: run eagerly, it would hand that trace an array it cannot use.
        traced = current_trace() is not None or any(
            isinstance(v, Tracer) for v in (*args, *kwargs.values()))
        values = list(bind_arguments(self.name, self.signature.params, args, kwargs,
                                     trace_error if traced else InterpretError))
        if traced:
            return self._emit_call(values)
        return type(self).runner(self.module, self.name, *values)

    def _emit_call(self, values: list[Any]) -> Tracer | tuple[Tracer, ...]:
        what = f"call @{self.name}"
        has_tracer = any(isinstance(v, Tracer) for v in values)
        trace = active_trace(what, values) if has_tracer else current_trace()
        sig = self.signature
        operands = []
        for i, (v, p) in enumerate(zip(values, sig.params)):
            if isinstance(v, Tracer):
                if v.type != p.type:
                    raise trace_error(f"argument {i + 1} of @{self.name} (%{p.name}) must be "
                                      f"{p.type}, got {v.type}")
                operands.append(v)
            else:
                operands.append(constant(trace, literal(v, p.type, what), p.type))
        callee = next((n for c, n in trace.callees if c is self), None)
        if callee is None:
            renamed = merge_items(trace.items, self._items, reserved={trace.name})
            callee = renamed.get(self.name, self.name)
            trace.callees.append((self, callee))
        names = tuple(trace.fresh() for _ in sig.results)
        trace.body.append(Stmt(names, "call", tuple(o.name for o in operands),
                               (("callee", callee),), sig.results))
        outs = tuple(Tracer(trace, n, t) for n, t in zip(names, sig.results))
        return outs[0] if len(outs) == 1 else outs

    def __str__(self) -> str:
        blocks = ["\n".join(format_function(it)) if isinstance(it, Function)
                  else format_grad_decl(it) for it in self._items]
        return "\n\n".join(blocks) + "\n"

    __repr__ = __str__


def _local_names(fn: Callable[..., Any], caller: Any) -> dict[str, Any]:
    """Names a string annotation may use besides `fn`'s globals: the locals of the scope that
    decorates it and `fn`'s closure. A model factory's dtype and sizes (`def block(dt, n): ...
    x: dt[n, n]`) are there, and under `from __future__ import annotations` every annotation
    is a string."""
    names = dict(caller.f_locals) if caller is not None else {}
    code = getattr(fn, "__code__", None)
    for var, cell in zip(code.co_freevars if code else (), getattr(fn, "__closure__", None) or ()):
        try:
            names[var] = cell.cell_contents
        except ValueError:  # a cell not yet assigned
            pass
    return names


def _param_types(fn: Callable[..., Any], name: str, caller: Any = None
                 ) -> tuple[list[Param], list[bool], Any]:
    """The annotated parameters of `fn`, whether each is keyword-only, and the return note."""
    try:
        annotations = inspect.get_annotations(fn, eval_str=True,
                                              locals=_local_names(fn, caller))
        parameters = inspect.signature(fn).parameters.values()
    except Exception as e:  # annotations are arbitrary user expressions
        raise trace_error(f"cannot read the annotations of {name}: {e}") from None
    params, keyword_only = [], []
    for p in parameters:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise trace_error(f"{name}: *{p.name} parameters are not supported; every parameter "
                              f"needs its own type, e.g. `x: eqsat.f32[128, 784]`")
        if p.default is not p.empty:
            # a default would be silently dropped: every parameter is an input of each call
            raise trace_error(f"parameter {p.name!r} of {name} has a default ({p.default!r}): "
                              f"every parameter of a traced function is an input given at each "
                              f"call; write a fixed value as a constant in the body instead")
        if p.name not in annotations:
            raise trace_error(f"parameter {p.name!r} of {name} has no type annotation; write "
                              f"e.g. `{p.name}: eqsat.f32[128, 784]`")
        t = annotations[p.name]
        if not isinstance(t, TensorType):
            raise trace_error(f"parameter {p.name!r} of {name} is annotated {t!r}, not a tensor "
                              f"type such as eqsat.f32[128, 784] (a scalar is eqsat.f32[()])")
        if problem := shape_problem(t.shape):
            raise trace_error(f"parameter {p.name!r} of {name}: {problem}")
        if not _IR_NAME.match(p.name):
            raise trace_error(f"parameter {p.name!r} of {name}: IR names use ASCII letters, "
                              f"digits and _ only")
        params.append(Param(p.name, t))
        keyword_only.append(p.kind is p.KEYWORD_ONLY)
    return params, keyword_only, annotations.get("return")


def _results(out: Any, trace: Any, name: str, note: Any) -> tuple[Tracer, ...]:
    """The traced values `fn` returned, checked against its return annotation if it has one."""
    if out is None:
        raise trace_error(f"{name} returns nothing; a traced function returns traced values")
    results = tuple(out) if isinstance(out, (tuple, list)) else (out,)
    if not results:
        raise trace_error(f"{name} returns an empty {type(out).__name__}")
    for i, r in enumerate(results):
        if not isinstance(r, Tracer):
            raise trace_error(f"{name} returns {describe(r)} (result {i + 1}); a traced function "
                              f"returns expressions of its parameters")
        if r.trace is not trace:
            raise trace_error(f"{name} returns %{r.name} of @{r.trace.name}, captured from "
                              f"another function; pass it as a parameter")
    notes = note if isinstance(note, tuple) else (note,)
    if all(isinstance(t, TensorType) for t in notes):
        got = tuple(r.type for r in results)
        if notes != got:
            raise trace_error(f"{name} is annotated to return {', '.join(map(str, notes))} but "
                              f"returns {', '.join(map(str, got))}")
    return results


_WRAPPER_ATTRS = ("__module__", "__name__", "__qualname__", "__doc__")


def _restore(ir: Function | GradDecl, items: tuple[Item, ...],
             attrs: dict[str, Any]) -> TracedFunction:
    """A TracedFunction back from pickle (see TracedFunction.__reduce__): its closure was
    made unique where it was pickled, and names are unique per module, not per process."""
    out = TracedFunction(ir, items)
    for k, v in attrs.items():
        setattr(out, k, v)
    return out


def function(fn: Callable[..., Any]) -> TracedFunction:
    """Trace `fn` once, now, into IR: its parameters must be annotated like `eqsat.f32[3, 4]`.

    >>> from eqsat.ir.types import DType
    >>> @function
    ... def double(x: DType.f32[3]):
    ...     return x * 2.0
    >>> print(double, end="")
    func @double(%x: f32[3]) -> f32[3] {
      %0 = const 2.0 : f32[3]
      %1 = mul %x, %0 : f32[3]
      return %1
    }
    """
    if isinstance(fn, TracedFunction):
        return fn
    if not callable(fn):
        raise trace_error(f"@eqsat.function decorates a Python function, not {describe(fn)}")
    name = getattr(fn, "__name__", "") or ""
    if not _IR_NAME.match(name):
        raise trace_error(f"cannot trace {name or fn!r}: a traced function needs a name of ASCII "
                          f"letters, digits and _ (use a def, not a lambda)")
    params, keyword_only, note = _param_types(fn, name, sys._getframe(1))
    with tracing(name) as trace:
        tracers = [Tracer(trace, p.name, p.type) for p in params]
        out = fn(*[t for t, k in zip(tracers, keyword_only) if not k],
                 **{t.name: t for t, k in zip(tracers, keyword_only) if k})
    results = _results(out, trace, name, note)
    ir = Function(name, tuple(params), tuple(r.type for r in results), tuple(trace.body),
                  tuple(r.name for r in results))
    traced = TracedFunction(ir, (*trace.items.values(), ir), fn)
    traced.module  # verify: the statements were typed one by one, this checks the whole
    functools.update_wrapper(traced, fn)
    return traced
