"""Where a workload's time goes: `python bench/kernels.py NAME [--variant core] [--no-opt]`.

Every statement of the (optimized) module is compiled as a function of its own and timed on
random inputs of its operand types; the table lists them slowest first with their share of
the sum. Kernels that the whole-function entry runs row-chunked together are timed apart
here, so the sum can exceed the time of the whole function, which is printed too. Transposes
that the entry never materializes (a matmul reads them in place) are listed, not timed. Each
row also shows the cpu cost model's estimate and measured / estimated: where the model is
wrong, extraction's choices are.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402
import workloads  # noqa: E402

from eqsat.backend.entry import plan_function  # noqa: E402
from eqsat.extract.cost import cost_model  # noqa: E402
from eqsat.ir.module import Function, Module, Param, Stmt  # noqa: E402

FREE_OPS = {"reshape"}  # views: no kernel runs for them


def _alone(fn: Function, stmt: Stmt) -> Module:
    """A module whose one function computes `stmt` from parameters named like its operands."""
    types = fn.types()
    names = list(dict.fromkeys(stmt.operands))
    params = tuple(Param(n, types[n]) for n in names)
    body = Function("k", params, stmt.types, (stmt,), stmt.results)
    return Module(body, name="profile")


def _random(t, rng: np.random.Generator) -> np.ndarray:
    a = rng.standard_normal(t.shape)
    return (a > 0) if t.dtype.np == np.bool_ else np.asarray(a, dtype=t.dtype.np)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("name", help="workload name (see bench/workloads.py)")
    ap.add_argument("--variant", default="core", help="module variant (core or fused)")
    ap.add_argument("--no-opt", action="store_true", help="profile the module as written")
    ap.add_argument("--top", type=int, default=25, help="rows to print")
    args = ap.parse_args()
    w = next((w for w in workloads.WORKLOADS if w.name == args.name), None)
    if w is None:
        sys.exit(f"no workload {args.name!r}; known: {[w.name for w in workloads.WORKLOADS]}")
    module = harness.prepare(w.modules[args.variant](), optimize=not args.no_opt)
    rng = np.random.default_rng(0)
    whole = harness.compile_here(module)
    inputs = w.make_inputs(rng)
    total = harness.median_seconds(lambda: whole(w.func, *inputs))
    fn = module[w.func]
    views = plan_function(fn, {}).views
    model = cost_model("cpu")
    types = fn.types()
    rows = []
    for stmt in fn.body:
        if stmt.op in FREE_OPS or stmt.results[0] in views:
            continue
        mod = _alone(fn, stmt)
        exe = harness.compile_here(mod)
        args_ = [_random(p.type, rng) for p in mod["k"].params]
        t = harness.median_seconds(lambda: exe("k", *args_))
        est = model.stmt_cost(stmt.op, stmt.attr, [types[o] for o in stmt.operands], stmt.types)
        rows.append((t, est, stmt))
    rows.sort(key=lambda r: -r[0])
    s, est_sum = sum(r[0] for r in rows), sum(r[1] for r in rows)
    print(f"{w.name}: whole function {total * 1e3:.3f} ms; {len(rows)} kernels timed alone, "
          f"sum {s * 1e3:.3f} ms; the cost model's sum {est_sum * 1e3:.3f} ms")
    print(f"{'measured':>12s} {'share':>6s} {'model':>10s} {'ratio':>6s}  statement")
    for t, est, stmt in rows[: args.top]:
        text = str(Module(Function("k", (), (), (stmt,), ()), name="p")).splitlines()
        line = next((ln.strip() for ln in text if "=" in ln and "func" not in ln), stmt.op)
        print(f"{t * 1e3:9.3f} ms {100 * t / s:5.1f}% {est * 1e3:7.3f} ms {t / est:6.2f}  "
              f"{line[:130]}")
    if views:
        print(f"read in place by their matmuls (no kernel): {', '.join('%' + v for v in views)}")


if __name__ == "__main__":
    main()
