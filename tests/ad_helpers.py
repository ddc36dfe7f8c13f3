"""Gradient checks JAX's way: float64 central differences and the inner-product test."""

from __future__ import annotations

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

from eqsat.ad import differentiate
from eqsat.ir import Function, GradDecl, Module, interpret
from eqsat.ir.interpreter import interpret_function


def run(module: Module, name: str, *args: np.ndarray) -> list[np.ndarray]:
    """All results of `name` as a list."""
    out = interpret(module, name, *args)
    return list(out) if isinstance(out, tuple) else [out]


def float_params(f: Function) -> tuple[str, ...]:
    return tuple(p.name for p in f.params if p.type.dtype.is_float)


def vjp_of(module: Module, name: str, wrt: tuple[str, ...]) -> Module:
    """`module` with `@<name>_vjp = vjp @name wrt ...` expanded."""
    decl = GradDecl(f"{name}_vjp", "vjp", name, wrt)
    return differentiate(module.replace(module.items + (decl,)))


def perturbed(args: list[np.ndarray], i: int, h: float):
    """For each element j of args[i]: (j, args with it moved up by h, args with it moved
    down by h), the two sides of a central difference."""
    for j in np.ndindex(args[i].shape):
        plus = [a.copy() for a in args]
        minus = [a.copy() for a in args]
        plus[i][j] += h
        minus[i][j] -= h
        yield j, plus, minus


def central_differences(f, args: list[np.ndarray], i: int, h: float = 1e-6) -> np.ndarray:
    """d f(*args) / d args[i] of a scalar function, by central differences."""
    g = np.zeros(args[i].shape)
    for j, plus, minus in perturbed(args, i, h):
        g[j] = (f(*plus) - f(*minus)) / (2 * h)
    return g


def numeric_vjp(module: Module, name: str, args: list[np.ndarray], wrt: tuple[str, ...],
                seeds: list[np.ndarray], h: float = 1e-6) -> list[np.ndarray]:
    """J^T seed by central differences, one input element at a time (small inputs only)."""
    f = module[name]
    index = {p.name: i for i, p in enumerate(f.params)}
    grads = []
    for w in wrt:
        i = index[w]
        g = np.zeros(args[i].shape)
        for j, plus, minus in perturbed(args, i, h):
            fp, fm = (interpret_function(module, name, *xs) for xs in (plus, minus))
            g[j] = sum(np.sum(s * (p.astype(np.float64) - m) / (2 * h))
                       for s, p, m in zip(seeds, fp, fm) if s.dtype.kind == "f")
        grads.append(g)
    return grads


def check_vjp(module: Module, name: str, args: list[np.ndarray],
              wrt: tuple[str, ...] | None = None,
              rtol: float = 1e-6, atol: float = 1e-7, h: float = 1e-6, seed: int = 0) -> Module:
    """Compare the generated vjp with central differences, element by element; returns the
    module with `@<name>_vjp` expanded."""
    f = module[name]
    wrt = float_params(f) if wrt is None else wrt
    rng = np.random.default_rng(seed)
    seeds = [rng.standard_normal(t.shape).astype(t.dtype.np) for t in f.result_types]
    expanded = vjp_of(module, name, wrt)
    got = run(expanded, f"{name}_vjp", *args, *seeds)
    want = numeric_vjp(expanded, name, args, wrt, seeds, h)
    for w, g, e in zip(wrt, got, want):
        np.testing.assert_allclose(g, e, rtol=rtol, atol=atol, err_msg=f"gradient of %{w}")
    return expanded


def inner_product_gap(module: Module, name: str, args: list[np.ndarray],
                      rng: np.random.Generator) -> tuple[float, float, float] | None:
    """(<t, J^T c>, <J t, c>, scale) with J t by central differences along a random t.

    None when the function is not smooth enough at `args` for finite differences to mean
    anything: a non-finite value, or two step sizes that disagree (a kink or a jump nearby).
    """
    f = module[name]
    wrt = float_params(f)
    index = {p.name: i for i, p in enumerate(f.params)}
    floats = [k for k, t in enumerate(f.result_types) if t.dtype.is_float]
    cots = [rng.standard_normal(t.shape).astype(t.dtype.np) for t in f.result_types]
    tangents = {w: rng.standard_normal(args[index[w]].shape) for w in wrt}

    def phi(step: float) -> float:
        xs = [a.copy() for a in args]
        for w, t in tangents.items():
            xs[index[w]] = (xs[index[w]] + step * t).astype(args[index[w]].dtype)
        outs = interpret_function(module, name, *xs)
        return float(sum(np.sum(cots[k] * outs[k]) for k in floats))

    with np.errstate(all="ignore"):
        base = interpret_function(module, name, *args)
        if not all(np.all(np.isfinite(base[k])) for k in floats):
            return None
        estimates = [(phi(h) - phi(-h)) / (2 * h) for h in (1e-4, 1e-5)]
        expanded = vjp_of(module, name, wrt)
        cotangents = run(expanded, f"{name}_vjp", *args, *cots)
    if not all(np.isfinite(estimates)) or not all(np.all(np.isfinite(c)) for c in cotangents):
        return None
    scale = 1.0 + sum(float(np.sum(np.abs(cots[k] * base[k]))) for k in floats)
    if abs(estimates[0] - estimates[1]) > 1e-5 * scale:
        return None
    lhs = float(sum(np.sum(tangents[w] * c) for w, c in zip(wrt, cotangents)))
    return lhs, estimates[1], scale


def check_inner_product(data: st.DataObject, m: Module, name: str) -> None:
    """The inner-product test of `name`'s gradient on inputs drawn away from 0 (where relu and
    abs bend), for hypothesis tests that draw the program."""
    f = m[name]
    assume(any(p.type.dtype.is_float for p in f.params))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    args = [rng.uniform(0.2, 1.5, p.type.shape) * rng.choice([-1.0, 1.0], p.type.shape)
            if p.type.dtype.is_float else rng.integers(-3, 4, p.type.shape).astype(p.type.dtype.np)
            for p in f.params]
    args = [a.astype(p.type.dtype.np) for a, p in zip(args, f.params)]
    gap = inner_product_gap(m, name, args, rng)
    assume(gap is not None)
    lhs, rhs, scale = gap
    assert abs(lhs - rhs) <= 1e-5 * (abs(lhs) + abs(rhs) + 1.0), (lhs, rhs, str(m))
