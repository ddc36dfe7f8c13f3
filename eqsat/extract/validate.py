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
sums, fused multiply-adds, cancellation) stay far inside the tolerance, and values that are
NaN or infinite in either program (rules such as log(exp(x)) => x are allowed to change them)
are not compared.
"""

from __future__ import annotations

import numpy as np

from ..ir.interpreter import interpret
from ..ir.module import Function, Module
from ..ir.samples import random_arguments

BUDGET = 0.05  # of the time limit, at most, spent interpreting both programs ...
MAX_SECONDS = 0.15  # ... and no more than this (a compile of a large program must stay quick)
SECONDS_PER_STMT = 8e-6  # the interpreter's cost per statement run ...
SECONDS_PER_ELEMENT = 20e-9  # ... and per element it computes (matmul: per multiply-add)
RTOL = 0.05  # of an element's magnitude plus ...
SCALE_TOL = 0.01  # ... this share of the result's largest finite magnitude
DRAWS = 2  # disagreement must show on every draw


def _work(f: Function) -> float:
    """Estimated interpreter seconds for one call of `f` (callees counted at their calls)."""
    elements = 0
    types = {p.name: p.type for p in f.params}
    for s in f.body:
        types.update(zip(s.results, s.types))
        elements += sum(t.size for t in s.types)
        if s.op in ("matmul", "matmul_t", "matmul_epi"):
            a = types[s.operands[0]]
            k = a.shape[-2] if s.attr.get("ta") else a.shape[-1]
            elements += s.types[0].size * k
    return len(f.body) * SECONDS_PER_STMT + elements * SECONDS_PER_ELEMENT


def affordable(before: Module, after: Module, seconds: float) -> bool:
    """Whether running both programs once fits in `BUDGET` of a `seconds` time limit and in
    `MAX_SECONDS` (a second draw runs only where the first disagrees)."""
    cost = sum(_work(f) for m in (before, after) for f in m.functions)
    return cost <= min(BUDGET * seconds, MAX_SECONDS)


def _differs(a: np.ndarray, b: np.ndarray) -> str | None:
    """How `b` (optimized) clearly differs from `a` (input), or None."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return f"shape {list(b.shape)} where {list(a.shape)} belongs"
    if a.dtype.kind not in "fc":
        # a comparison of nearly equal floats may flip: only a large share of changes counts
        changed = int(np.count_nonzero(a != b))
        return (f"{changed} of {a.size} elements differ" if a.size >= 4 and
                changed > 0.25 * a.size else None)
    with np.errstate(all="ignore"):
        x, y = a.astype(np.float64), b.astype(np.float64)
        both = np.isfinite(x) & np.isfinite(y)
        if not both.any():
            return None
        scale = float(np.max(np.abs(x[both])))
        err = np.where(both, np.abs(x - y), 0.0)
        over = err > RTOL * np.abs(x) + SCALE_TOL * scale
    if not over.any():
        return None
    i = int(np.argmax(np.where(over, err, -1.0)))
    return (f"{int(over.sum())} of {a.size} elements differ, e.g. {float(y.flat[i]):.6g} "
            f"where {float(x.flat[i]):.6g} belongs")


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
                    want, got = interpret(before, f.name, *args), interpret(after, f.name, *args)
            except Exception:  # noqa: BLE001 (what these inputs cannot run says nothing)
                break
            want = want if isinstance(want, tuple) else (want,)
            got = got if isinstance(got, tuple) else (got,)
            why = next((f"result {k}: {w}" for k, w in
                        enumerate(_differs(a, b) for a, b in zip(want, got)) if w), None)
            if why is None:
                break
        if why is not None:
            return f"@{f.name} {why}"
    return None

