"""A last check of `optimize`'s result: the input and the optimized program, run by the
reference interpreter on the same random inputs, must agree.

Every rule is checked for soundness and extraction only picks nodes of their own e-class, yet
the optimized program is only as right as the e-graph engine: egglog 13.2 was caught putting a
new term in an unrelated e-class (the fusion pass now avoids the form that did it), which gave
a program reading one parameter where another belonged. Running both programs costs a few
milliseconds for the small programs a wrong answer would most likely be noticed on, so
`optimize` does it whenever the interpreter's estimated time fits in `BUDGET` of the time
limit and `MAX_SECONDS`, and keeps the input where the two clearly disagree.

Only clear disagreement counts, on two independent draws: rounding differences (reassociated
sums, fused multiply-adds) stay far inside the tolerance, and values that are NaN or infinite
in either program (rules such as log(exp(x)) => x are allowed to change them) are not
compared. Cancellation can leave a result made of rounding alone (the gradient of
sum(softmax(x)) is 0 in exact arithmetic, -8e-8 here and 0 there), far from the tolerance of
its own magnitude, and a comparison of values equal in exact arithmetic flips at random. So
where a result seems to differ, the input runs once more with each value it computes moved by
a rounding error, and `NOISE` times how far that moves a float result is tolerated too (`FLIPS`
times how many elements it changes of a bool or integer one). A wrong program differs by the
size of the values, not of their rounding.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..ir.interpreter import interpret_function
from ..ir.module import Function, Module, inlined_totals
from ..ir.samples import random_arguments

BUDGET = 0.05  # of the time limit, at most, spent interpreting both programs ...
MAX_SECONDS = 0.15  # ... and no more than this (a compile of a large program must stay quick)
SECONDS_PER_STMT = 8e-6  # the interpreter's cost per statement run ...
SECONDS_PER_ELEMENT = 20e-9  # ... and per element it computes ...
# ... and per multiply-add of a matmul (numpy's runs 128x784 @ 784x10 in 6 ms on a loaded core)
SECONDS_PER_MULTIPLY_ADD = 5e-9
RTOL = 0.05  # of an element's magnitude plus ...
SCALE_TOL = 0.01  # ... this share of the result's largest finite magnitude
DRAWS = 2  # disagreement must show on every draw
NOISE = 64  # times how far one rounding error per computed value moves a result
FLIPS = 4  # times how many elements of a bool or integer result such an error changes


def _work(f: Function) -> float:
    """Estimated interpreter seconds for `f`'s own statements, its calls not included."""
    elements = products = 0
    types = f.types()
    for s in f.body:
        elements += sum(t.size for t in s.types)
        if s.op in ("matmul", "matmul_t", "matmul_epi"):
            a = types[s.operands[0]]
            k = a.shape[-2] if s.attr.get("ta") else a.shape[-1]
            products += s.types[0].size * k
    return (len(f.body) * SECONDS_PER_STMT + elements * SECONDS_PER_ELEMENT
            + products * SECONDS_PER_MULTIPLY_ADD)


def _work_per_call(m: Module) -> dict[str, float]:
    """Estimated interpreter seconds of one call of each function of `m`, its callees' work
    counted at every call: where each of 25 functions calls the one before it twice, the
    last makes 2^24 calls, and counting each function once, the check ran for minutes."""
    return inlined_totals({f.name: f for f in m.functions}, _work)


def affordable(before: Module, after: Module, seconds: float) -> bool:
    """Whether running both programs once fits in `BUDGET` of a `seconds` time limit and in
    `MAX_SECONDS` (a second draw runs only where the first disagrees)."""
    cost = sum(sum(_work_per_call(m).values()) for m in (before, after))
    return cost <= min(BUDGET * seconds, MAX_SECONDS)


def _differs(a: np.ndarray, b: np.ndarray, noise: float = 0.0) -> str | None:
    """How `b` (optimized) clearly differs from `a` (input), or None, beyond `noise`: what the
    input's own rounding changes (see `_noise`), which NOISE or FLIPS times over is tolerated."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return f"shape {list(b.shape)} where {list(a.shape)} belongs"
    if a.dtype.kind not in "fc":
        # a comparison of nearly equal floats may flip: only a large share of changes counts,
        # and comparisons of values equal in exact arithmetic flip at random (x*y + x*z == x*(y+z))
        changed = int(np.count_nonzero(a != b))
        return (f"{changed} of {a.size} elements differ" if a.size >= 4 and
                changed > 0.25 * a.size + FLIPS * noise else None)
    with np.errstate(all="ignore"):
        x, y = a.astype(np.float64), b.astype(np.float64)
        both = np.isfinite(x) & np.isfinite(y)
        if not both.any():
            return None
        scale = float(np.max(np.abs(x[both])))
        err = np.where(both, np.abs(x - y), 0.0)
        over = err > RTOL * np.abs(x) + SCALE_TOL * scale + NOISE * noise
    if not over.any():
        return None
    i = int(np.argmax(np.where(over, err, -1.0)))
    return (f"{int(over.sum())} of {a.size} elements differ, e.g. {float(y.flat[i]):.6g} "
            f"where {float(x.flat[i]):.6g} belongs")


def _rounding(rng: np.random.Generator) -> Callable[[np.ndarray], np.ndarray]:
    """A perturbation moving each float element by up to one unit of its dtype's epsilon,
    relative: a rounding error of its own."""
    def perturb(a: np.ndarray) -> np.ndarray:
        if a.dtype.kind != "f":
            return a
        moved = a * (1.0 + np.finfo(a.dtype).eps * rng.uniform(-1.0, 1.0, a.shape))
        return np.asarray(moved, dtype=a.dtype)
    return perturb


def _noise(a: np.ndarray, moved: np.ndarray) -> float:
    """How much `moved` differs from `a`: floats by the largest change over elements finite in
    both, others by how many elements changed."""
    a, moved = np.asarray(a), np.asarray(moved)
    if a.shape != moved.shape:
        return 0.0
    if a.dtype.kind not in "fc":
        return float(np.count_nonzero(a != moved))
    with np.errstate(all="ignore"):
        x, y = a.astype(np.float64), moved.astype(np.float64)
        both = np.isfinite(x) & np.isfinite(y)
        return float(np.max(np.abs(x - y)[both])) if both.any() else 0.0


def _first(want: list[np.ndarray], got: list[np.ndarray], noise: list[float] | None = None
           ) -> str | None:
    """How the first result that differs does, or None."""
    noise = noise or [0.0] * len(want)
    return next((f"result {k}: {w}" for k, w in
                 enumerate(_differs(a, b, n) for a, b, n in zip(want, got, noise)) if w), None)


def disagreement(before: Module, after: Module, seed: int = 0) -> str | None:
    """Why `after` does not compute what `before` does (each function on random inputs, on
    every one of `DRAWS` draws), or None where they agree or cannot run on such inputs. Both
    are plain modules with the same functions and signatures."""
    for f in before.functions:
        why = None
        for draw in range(DRAWS):
            rng = np.random.default_rng((seed, draw, len(f.body)))
            args = random_arguments(f, -2.0, 2.0, rng)
            try:
                with np.errstate(all="ignore"):
                    want = interpret_function(before, f.name, *args)
                    got = interpret_function(after, f.name, *args)
                    found = _first(want, got)
                    if found is not None:  # beyond what the input's own rounding explains?
                        moved = interpret_function(before, f.name, *args,
                                                   perturb=_rounding(rng))
                        found = _first(want, got, [_noise(a, m) for a, m in zip(want, moved)])
            except Exception:  # noqa: BLE001 (what these inputs cannot run says nothing)
                break
            why = found
            if why is None:
                break
        if why is not None:
            return f"@{f.name} {why}"
    return None
