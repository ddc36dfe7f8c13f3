"""The reference interpreter: numpy semantics for every op; the oracle for every other stage.

Calls run on an explicit frame stack, so call depth and program length are bounded by memory,
not by Python's recursion limit.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import Error, InterpretError
from .module import Function, GradDecl, Module, Param
from .ops import OPS
from .types import DType, TensorType
from .verifier import verify


@dataclass
class _Frame:
    func: Function
    env: dict[str, np.ndarray]
    pc: int = 0
    pending: tuple[str, ...] = field(default=())


def bind_arguments(name: str, params: Sequence[Param], args: Sequence[Any],
                   kwargs: dict[str, Any], error: Callable[[str], Error] = InterpretError
                   ) -> tuple[Any, ...]:
    """`args` with the keyword arguments placed by parameter name, in the order of function
    @name's `params`; `error` names an unknown, repeated or missing argument."""
    if len(args) > len(params):
        raise error(f"@{name} takes {len(params)} argument(s), got {len(args)}")
    values: dict[str, Any] = {p.name: a for p, a in zip(params, args)}
    names = [p.name for p in params]
    for key, value in kwargs.items():
        if key not in names:
            raise error(f"@{name} has no parameter {key!r} (its parameters: "
                        f"{', '.join(names)})")
        if key in values:
            raise error(f"@{name} got two values for parameter {key!r}")
        values[key] = value
    missing = [n for n in names if n not in values]
    if missing:
        raise error(f"@{name} is missing argument(s) {', '.join(missing)}")
    return tuple(values[n] for n in names)


def check_inputs(func: Function | Any, args: tuple[Any, ...],
                 skip: Collection[int] = ()) -> list[Any]:
    """Inputs as arrays of exactly the parameter types, or an InterpretError saying which
    differs (by its position among all the arguments). The arguments at the positions in
    `skip` (device arrays, checked by their backend) are returned as given."""
    params = func.params
    if len(args) != len(params):
        sig = ", ".join(f"%{p.name}: {p.type}" for p in params)
        raise InterpretError(f"@{func.name} takes {len(params)} argument(s) ({sig}), "
                             f"got {len(args)}")
    out = []
    for i, (a, p) in enumerate(zip(args, params)):
        if i in skip:
            out.append(a)
            continue
        want: TensorType = p.type
        if isinstance(a, (np.ndarray, np.generic)):
            arr = np.asarray(a)
            if arr.dtype != want.dtype.np and arr.dtype.newbyteorder("=") == want.dtype.np:
                arr = arr.astype(want.dtype.np)  # the other byte order: same values, native
            if arr.dtype != want.dtype.np:
                raise InterpretError(
                    f"argument {i + 1} of @{func.name} (%{p.name}) must be {want}, got an "
                    f"array of dtype {arr.dtype} and shape {arr.shape}; convert it with "
                    f".astype(np.{want.dtype.np.name})")
        else:
            arr = _from_python(a, want, f"argument {i + 1} of @{func.name} (%{p.name})")
        if arr.shape != want.shape:
            raise InterpretError(f"argument {i + 1} of @{func.name} (%{p.name}) must have shape "
                                 f"{list(want.shape)} ({want}), got {list(arr.shape)}")
        out.append(arr)
    return out


def _from_python(a: Any, want: TensorType, what: str) -> np.ndarray:
    """A Python number or (nested) list as an array of `want`'s dtype, refused where numpy's
    conversion would change a value: a float for an integer or bool parameter (3.5 became 3),
    an integer out of the dtype's range, anything but true/false for a bool, a finite value
    that overflows a float dtype (1e39 as f32 is inf), strings and other objects."""
    dt = want.dtype
    try:
        raw = np.asarray(a)
    except (TypeError, ValueError, OverflowError) as e:
        raise InterpretError(f"{what} cannot be read as {want}: {e}") from None
    kind = raw.dtype.kind
    problem = None
    if kind not in "biuf":
        problem = f"numpy reads it as {raw.dtype}, not as numbers"
    elif dt is DType.bool and kind != "b":
        problem = "a bool parameter takes True and False only"
    elif dt.is_int and kind == "f":
        problem = "it holds floats; an integer parameter takes integers only"
    elif dt.is_int and raw.size and kind in "iu":
        info = np.iinfo(dt.np)
        if int(raw.min()) < info.min or int(raw.max()) > info.max:
            problem = f"a value is out of {dt}'s range [{info.min}, {info.max}]"
    if problem is None:
        with np.errstate(over="ignore"):
            arr = raw.astype(dt.np)
        if dt.is_float and kind == "f" and np.any(np.isinf(arr) & np.isfinite(raw)):
            problem = f"a value overflows {dt} (it would become inf)"
        else:
            return arr
    raise InterpretError(f"{what} cannot be read as {want}: {problem}; pass a numpy array of "
                         f"dtype {dt.np.name} to convert on purpose")


def _function(module: Module, name: str) -> Function:
    item = module[name]
    if isinstance(item, GradDecl):
        raise InterpretError(f"@{name} is a gradient declaration; expand it with "
                             f"eqsat.differentiate (eqsat.interpret does this for you)")
    return item


def run_stmt(op_name: str, args: list[np.ndarray], attrs: dict, t: TensorType) -> np.ndarray:
    """One op on numpy arrays, with the result checked against its declared type."""
    out = OPS[op_name].impl(args, attrs, t)
    out = np.asarray(out)
    if out.dtype != t.dtype.np:
        out = out.astype(t.dtype.np)
    if out.shape != t.shape:
        raise AssertionError(f"{op_name} produced shape {out.shape}, expected {t}")
    return out


def interpret_function(module: Module, name: str, *args: Any,
                       perturb: Callable[[np.ndarray], np.ndarray] | None = None
                       ) -> list[np.ndarray]:
    """Run function `name` of a verified module without gradient declarations; all results.
    `perturb`, where given, replaces each statement's result (callees' too) by what it returns
    (optimize's check uses it to see how far rounding alone moves the results)."""
    root = _function(module, name)
    inputs = check_inputs(root, args)
    frames = [_Frame(root, {p.name: a for p, a in zip(root.params, inputs)})]
    try:
        with np.errstate(all="ignore"):
            while True:
                fr = frames[-1]
                if fr.pc == len(fr.func.body):
                    results = [fr.env[r] for r in fr.func.returns]
                    frames.pop()
                    if not frames:
                        return results
                    caller = frames[-1]
                    caller.env.update(zip(caller.pending, results))
                    caller.pc += 1
                    continue
                s = fr.func.body[fr.pc]
                if s.op == "call":
                    callee = _function(module, s.attr["callee"])
                    fr.pending = s.results
                    frames.append(_Frame(callee, {p.name: fr.env[o]
                                                  for p, o in zip(callee.params, s.operands)}))
                    continue
                out = run_stmt(s.op, [fr.env[o] for o in s.operands], s.attr, s.types[0])
                fr.env[s.results[0]] = out if perturb is None else perturb(out)
                fr.pc += 1
    except MemoryError:
        raise InterpretError(f"out of memory while interpreting @{name} (statement "
                             f"%{s.results[0]} = {s.op} : {s.types[0]})") from None


def interpret(module: Module, name: str, /, *args: Any, **kwargs: Any
              ) -> np.ndarray | tuple[np.ndarray, ...]:
    """Run `name` on numpy arrays (positional, or by parameter name): one result as an array,
    several as a tuple of arrays."""
    verify(module)
    fn = _function(module, name)
    if kwargs:
        args = bind_arguments(fn.name, fn.params, args, kwargs)
    params = {p.name for p in fn.params}
    results = interpret_function(module, name, *args)
    # A returned parameter would alias the caller's array; hand back a fresh copy instead.
    results = [np.array(r, copy=True) if r_name in params else r
               for r, r_name in zip(results, fn.returns)]
    return results[0] if len(results) == 1 else tuple(results)
