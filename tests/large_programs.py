"""Random programs with shapes large enough for the CPU backend's big-data paths.

The small-shape strategies of `eqsat.testing` (dims 1..5) never reach the code that only
switches on for big data: the packed GEMM, the host BLAS and its in-place transposed views,
row-chunked kernel groups, a reduction sharing its element values with the next map, streamed
output, threads, arena reuse of big buffers. The strategies here draw models of the kind real
users write (MLP layers, row reductions such as softmax and layernorm, attention with operands
stored in any axis order, chains of layout ops around them) with dims from `DIMS`, whose odd
sizes fall on the GEMM's tile edges. Programs are traced with eqsat's own DSL tracer.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from hypothesis import strategies as st

import eqsat
from eqsat.backend import entry
from eqsat.ir import DType, Function, GradDecl, Module, TensorType
from eqsat.ir import dsl
from eqsat.ir.dsl_trace import tracing
from eqsat.ir.dsl_tracer import Tracer

# Odd sizes and tails matter: f32 GEMM tiles are 6 x 64 (f64 6 x 32), chunking needs >= 16 rows.
DIMS = (1, 7, 16, 17, 63, 64, 65, 100, 128, 130, 257, 300)
ROWS = tuple(d for d in DIMS if d >= 16)
BATCH = (1, 2, 3, 4, 7, 16)
PERMS3 = tuple(itertools.permutations(range(3)))
FLOATS = (DType.f32, DType.f64)
# Budgets that keep one example around a second: elements of any value, multiply-adds of a
# product.
MAX_ELEMENTS = 1 << 21
MAX_FLOPS = 1 << 25


@dataclass
class Case:
    """A module, the functions to run, and how to draw their arguments."""

    module: Module
    names: list[str]
    scales: dict[str, float] = field(default_factory=dict)  # parameter -> input amplitude
    seed: int = 0


class Program:
    """A function traced with parameters declared as the body needs them."""

    def __init__(self, trace, scales: dict[str, float]):
        self.trace = trace
        self.params: list[tuple[str, TensorType]] = []
        self.scales = scales

    def param(self, dtype: DType, shape: Sequence[int], scale: float = 1.0) -> Tracer:
        """A new parameter of `dtype[shape]`, its inputs drawn with amplitude `scale`."""
        name = f"p{len(self.params)}"
        t = TensorType(dtype, tuple(shape))
        self.params.append((name, t))
        self.scales[name] = scale
        return Tracer(self.trace, name, t)


def trace(name: str, body: Callable[[Program], Sequence[Tracer]],
          scales: dict[str, float], callees: list | None = None) -> Function:
    """Trace `body` (which declares its parameters on the Program) into a Function; the IR
    items of the functions it calls are appended to `callees`."""
    from eqsat.ir.module import Param
    with tracing(name) as tr:
        prog = Program(tr, scales)
        outs = list(body(prog))
    if callees is not None:
        callees.extend(tr.items.values())
    return Function(name, tuple(Param(n, t) for n, t in prog.params),
                    tuple(o.type for o in outs), tuple(tr.body), tuple(o.name for o in outs))


def with_grad(f: Function, wrt: Sequence[str], kind: str = "vjp",
              callees: Sequence = ()) -> Module:
    """Module of `f` (after its callees) and `@<f>_<kind> = kind @f wrt ...`, for the float
    parameters `wrt`."""
    return Module(*callees, f, GradDecl(f"{f.name}_{kind}", kind, f.name, tuple(wrt)), name="m")


def arguments(case: Case, name: str) -> list[np.ndarray]:
    """Arguments for function `name` of the case's (differentiated) module: floats uniform in
    +-scale (seeds of a vjp at amplitude 1), masks fair coins."""
    f = eqsat.differentiate(case.module)[name]
    rng = np.random.default_rng(case.seed)
    out = []
    for p in f.params:
        t = p.type
        if t.dtype is DType.bool:
            out.append(rng.random(t.shape) < 0.5)
        else:
            s = case.scales.get(p.name, 1.0)
            out.append((rng.uniform(-s, s, t.shape)).astype(t.dtype.np))
    return out


def tolerance(m: Module, name: str) -> float:
    """Norm-wise relative tolerance: f32's wherever an f32 value is involved, else f64's."""
    f = eqsat.differentiate(m)[name]
    types = list(f.types().values())
    return 2e-4 if any(t.dtype is DType.f32 for t in types) else 1e-9


def assert_close(got, want, rtol: float, what: str) -> None:
    """Same dtypes, shapes, NaN and infinity patterns; finite floats within `rtol` of the
    largest magnitude of the result (sums in another order differ element-wise, and a product
    can cancel to near zero in one element)."""
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    assert len(got) == len(want), what
    for k, (g, w) in enumerate(zip(got, want)):
        label = f"{what}, result {k}"
        assert g.dtype == w.dtype and g.shape == w.shape, label
        if w.dtype.kind != "f":
            np.testing.assert_array_equal(g, w, err_msg=label)
            continue
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w), err_msg=label)
        fin = np.isfinite(w)
        np.testing.assert_array_equal(g[~fin], w[~fin], err_msg=label)
        if not fin.any():
            continue
        err = np.abs(g[fin].astype(np.float64) - w[fin])
        scale = max(1.0, float(np.abs(w[fin]).max()))
        assert err.max() <= rtol * scale, (
            f"{label}: max error {err.max():.3g} > {rtol:g} x {scale:.3g} at "
            f"{np.unravel_index(np.argmax(np.where(fin, np.abs(g - w), 0)), w.shape)}")


def check_case(case: Case, optimize: Sequence[bool] = (False, True)) -> None:
    """Compile the case's module (unoptimized and optimized) and compare every function of
    `case.names` with the interpreter."""
    m = case.module
    for name in case.names:
        args = arguments(case, name)
        want = eqsat.interpret(m, name, *args)
        for opt in optimize:
            exe = eqsat.compile(m, optimize=opt)
            assert_close(exe(name, *args), want, tolerance(m, name),
                         f"@{name}, optimize={opt}, module:\n{m}")


# ---------------------------------------------------------------- strategies

def dims(draw, choices: Sequence[int] = DIMS) -> int:
    return draw(st.sampled_from(choices))


def fit(sizes: list[int], budget: int) -> list[int]:
    """`sizes` with the largest halved until their product is within `budget`."""
    sizes = list(sizes)
    while math.prod(sizes) > budget:
        k = max(range(len(sizes)), key=sizes.__getitem__)
        sizes[k] = max(1, sizes[k] // 2 + 1) if sizes[k] > 2 else 1
    return sizes


ACTIVATIONS: dict[str, Callable[[Tracer], Tracer]] = {
    "relu": dsl.relu, "tanh": dsl.tanh, "sigmoid": dsl.sigmoid, "gelu": dsl.gelu,
    "leaky": lambda h: dsl.where(h > 0.0, h, h * 0.1), "none": lambda h: h,
}
SMOOTH = ("tanh", "sigmoid", "gelu", "none")


@st.composite
def mlps(draw) -> Case:
    """One or two dense layers (matmul, bias, activation), an optional head (softmax,
    layernorm, logsumexp), a squared-error loss and its gradient."""
    dtype = draw(st.sampled_from(FLOATS))
    m, k, h, n = (dims(draw) for _ in range(4))
    m, k, h = fit([m, k, h], MAX_FLOPS)
    layers = draw(st.integers(1, 2))
    # f32 gradients through a kink can flip on a rounding difference: smooth ones only there.
    acts = tuple(ACTIVATIONS) if dtype is DType.f64 else SMOOTH
    act = draw(st.sampled_from(acts))
    head = draw(st.sampled_from(("none", "softmax", "layernorm", "logsumexp")))
    scales: dict[str, float] = {}

    def body(p: Program):
        x = p.param(dtype, (m, k))
        out = ACTIVATIONS[act](x @ p.param(dtype, (k, h), 1 / math.sqrt(k))
                               + p.param(dtype, (h,)))
        if layers == 2:
            out = out @ p.param(dtype, (h, n), 1 / math.sqrt(h)) + p.param(dtype, (n,))
        if head == "softmax":
            out = dsl.softmax(out)
        elif head == "layernorm":
            out = dsl.layer_norm(out, gamma=p.param(dtype, out.shape[-1:]))
        elif head == "logsumexp":
            out = dsl.logsumexp(out, axis=-1)
        d = out - p.param(dtype, out.shape)
        return [dsl.mean(d * d)]

    f = trace("loss", body, scales)
    wrt = [q.name for q in f.params[1:] if q.name not in (f.params[-1].name,)]
    return Case(with_grad(f, wrt, "grad"), ["loss", "loss_grad"], scales,
                draw(st.integers(0, 2**31)))


@st.composite
def row_reductions(draw) -> Case:
    """Row statistics followed by maps (softmax, layernorm, rmsnorm, centering,
    logsumexp), rank 2 or 3, over the last axis or another, then maybe a product."""
    dtype = draw(st.sampled_from(FLOATS))
    if draw(st.integers(0, 3)) == 0:  # a result the entry streams (see entry.STREAM_MIN)
        rows, cols = draw(st.sampled_from((257, 300))), draw(st.sampled_from((257, 300)))
        lead = -(-entry.STREAM_MIN // (rows * cols * dtype.itemsize))
        shape = [lead + draw(st.integers(0, 3)), rows, cols]
    else:
        shape = [dims(draw, ROWS), dims(draw)]
        if draw(st.booleans()):
            shape.insert(0, draw(st.sampled_from(BATCH)))
        shape = fit(shape, MAX_ELEMENTS // 2)
    axis = draw(st.sampled_from([-1, -1, -1, -2]))
    kind = draw(st.sampled_from(("softmax", "layernorm", "rmsnorm", "center", "logsumexp")))
    then = draw(st.sampled_from(("none", "residual", "tanh", "matmul")))
    n = dims(draw)
    scales: dict[str, float] = {}

    def body(p: Program):
        x = p.param(dtype, shape, 3.0)
        if kind == "softmax":
            y = dsl.softmax(x, axis=axis)
        elif kind == "layernorm":
            y = dsl.layer_norm(x, axis=axis)
        elif kind == "rmsnorm":
            y = x * dsl.rsqrt(dsl.mean(x * x, axis=axis, keepdims=True) + 1e-3)
        elif kind == "center":
            y = x - dsl.max(x, axis=axis, keepdims=True)
        else:
            y = dsl.logsumexp(x, axis=axis, keepdims=True) + x
        if then == "residual":
            y = y * p.param(dtype, shape[-1:]) + x
        elif then == "tanh":
            y = dsl.tanh(y)
        elif then == "matmul":
            k = shape[-1]
            width = max(1, min(n, MAX_FLOPS // math.prod(shape)))
            y = y @ p.param(dtype, (k, width), 1 / math.sqrt(k))
        return [y]

    f = trace("rows", body, scales)
    return Case(with_grad(f, [q.name for q in f.params]), ["rows", "rows_vjp"], scales,
                draw(st.integers(0, 2**31)))


def inverse(perm: Sequence[int]) -> tuple[int, ...]:
    return tuple(int(i) for i in np.argsort(perm))


@st.composite
def attentions(draw) -> Case:
    """softmax(q k^T / sqrt(d) [masked]) v per batch, with q, k, v stored in any axis order
    (transposed back in the program), the output in any axis order, maybe flattened."""
    dtype = draw(st.sampled_from(FLOATS))
    b, s, d = draw(st.sampled_from(BATCH)), dims(draw), dims(draw)
    b, s, d = fit([b, s, d], MAX_FLOPS // 300)
    s = min(s, 300)
    pq, pk, pv, po = (draw(st.sampled_from(PERMS3)) for _ in range(4))
    masked = draw(st.booleans())
    flatten = draw(st.booleans())
    scales: dict[str, float] = {}

    def stored(p: Program, perm: Sequence[int]) -> Tracer:
        logical = (b, s, d)
        x = p.param(dtype, tuple(logical[i] for i in perm))
        return dsl.transpose(x, inverse(perm)) if tuple(perm) != (0, 1, 2) else x

    def body(p: Program):
        q, k, v = stored(p, pq), stored(p, pk), stored(p, pv)
        scores = (q @ dsl.transpose(k, (0, 2, 1))) * (1 / math.sqrt(d))
        if masked:
            scores = dsl.where(p.param(DType.bool, (b, s, s)), scores, -30.0)
        o = dsl.softmax(scores) @ v
        o = dsl.transpose(o, po) if po != (0, 1, 2) else o
        if flatten:
            o = dsl.reshape(o, (o.shape[0] * o.shape[1], o.shape[2]))
        return [o]

    f = trace("attn", body, scales)
    wrt = [q.name for q in f.params if q.type.dtype.is_float]
    return Case(with_grad(f, wrt), ["attn", "attn_vjp"], scales, draw(st.integers(0, 2**31)))


@st.composite
def transposed_products(draw) -> Case:
    """transpose(a, perm) @ b for every perm of a rank-3 parameter (the in-place views of
    the GEMM and the BLAS), and a rank-2 transpose on either side."""
    dtype = draw(st.sampled_from(FLOATS))
    bt, m, k, n = draw(st.sampled_from(BATCH)), dims(draw, DIMS[3:]), dims(draw), dims(draw)
    bt, m, k, n = fit([bt, m, k, n], MAX_FLOPS)
    perm = draw(st.sampled_from(PERMS3))
    side = draw(st.sampled_from(("a", "b", "both")))
    epilogue = draw(st.booleans())
    scales: dict[str, float] = {}

    def operand(p: Program, logical: tuple[int, ...], view: bool) -> Tracer:
        if not view:
            return p.param(dtype, logical)
        stored = tuple(logical[i] for i in inverse(perm))  # transpose(stored, perm) = logical
        return dsl.transpose(p.param(dtype, stored), perm)

    def body(p: Program):
        a = operand(p, (bt, m, k), side in ("a", "both"))
        w = operand(p, (bt, k, n), side in ("b", "both"))
        y = a @ w
        if epilogue:
            y = dsl.relu(y + p.param(dtype, (n,)))
        return [y]

    f = trace("tmm", body, scales)
    return Case(with_grad(f, [q.name for q in f.params]), ["tmm", "tmm_vjp"], scales,
                draw(st.integers(0, 2**31)))


# ---------------------------------------------------------------- chains of layout ops

def _factor(size: int, rank: int, rng: random.Random) -> tuple[int, ...]:
    """A random shape of `rank` with `size` elements (prime factors dealt out)."""
    fs, n, p = [], size, 2
    while p * p <= n:
        while n % p == 0:
            fs.append(p)
            n //= p
        p += 1
    if n > 1:
        fs.append(n)
    out = [1] * rank
    for f in fs:
        out[rng.randrange(rank)] *= f
    return tuple(out)


def _step(p: Program, v: Tracer, rng: random.Random, dtype: DType) -> Tracer:
    """One random op applied to `v` (kept within the size budgets)."""
    shape, size = v.shape, math.prod(v.shape)
    kinds = ["unary", "binary", "reshape", "cast", "select", "concat", "broadcast"]
    if v.ndim >= 1:
        kinds += ["slice", "reduce", "softmax"]
    if v.ndim >= 2:
        kinds += ["transpose", "matmul", "matmul"]
    kind = rng.choice(kinds)
    if kind == "unary":
        op = rng.choice([dsl.tanh, dsl.sigmoid, dsl.abs, dsl.negative, dsl.relu,
                         lambda x: dsl.exp(dsl.tanh(x))])
        return op(v)
    if kind == "binary":
        other = p.param(v.dtype, shape if rng.random() < 0.5 else shape[-1:])
        return rng.choice([dsl.add, dsl.subtract, dsl.multiply, dsl.maximum])(v, other)
    if kind == "reshape":
        return dsl.reshape(v, _factor(size, rng.randint(1, 3), rng))
    if kind == "transpose":
        perm = list(range(v.ndim))
        rng.shuffle(perm)
        return dsl.transpose(v, perm)
    if kind == "cast":
        other = DType.f64 if v.dtype is DType.f32 else DType.f32
        out = dsl.cast(v, other)
        return dsl.cast(out, dtype) if rng.random() < 0.5 else out
    if kind == "select":
        if rng.random() < 0.5:
            return dsl.where(v > 0.0, v, v * 0.5)  # continuous: safe under rounding
        return dsl.where(p.param(DType.bool, shape), v, p.param(v.dtype, shape))
    if kind == "concat":
        axis = rng.randrange(max(1, v.ndim)) if v.ndim else None
        if axis is None or size * 2 > MAX_ELEMENTS:
            return v
        extra = list(shape)
        extra[axis] = rng.choice(DIMS[:6])
        return dsl.concatenate([v, p.param(v.dtype, extra)] if rng.random() < 0.5
                               else [p.param(v.dtype, extra), v, v], axis=axis)
    if kind == "broadcast":
        lead = rng.choice((1, 2, 3))
        if v.ndim >= 3 or size * lead > MAX_ELEMENTS:
            return v
        return dsl.broadcast_to(v, (lead, *shape))
    if kind == "slice":
        key = []
        for d in shape:
            a = rng.randrange(d)
            key.append(slice(a, rng.randint(a + 1, d)) if rng.random() < 0.6 else slice(None))
        return v[tuple(key)]
    if kind == "reduce":
        axis = rng.randrange(v.ndim)
        op = rng.choice([dsl.sum, dsl.mean, dsl.max])
        return op(v, axis=axis, keepdims=rng.random() < 0.5)
    if kind == "softmax":
        return dsl.softmax(v, axis=rng.randrange(v.ndim))
    # matmul: against a new parameter, batched when v has a batch axis, maybe transposed
    k = shape[-1]
    n = rng.choice(DIMS)
    n = max(1, min(n, MAX_FLOPS // max(1, size), MAX_ELEMENTS // max(1, size // k)))
    if v.ndim == 3 and rng.random() < 0.5:
        perm = rng.choice(PERMS3)
        logical = (shape[0], k, n)
        w = dsl.transpose(p.param(v.dtype, tuple(logical[i] for i in inverse(perm)),
                                  1 / math.sqrt(k)), perm)
    elif rng.random() < 0.5:
        w = dsl.transpose(p.param(v.dtype, (n, k), 1 / math.sqrt(k)), (1, 0))
    else:
        w = p.param(v.dtype, (k, n), 1 / math.sqrt(k))
    return v @ w


@st.composite
def chains(draw) -> Case:
    """A big product or row reduction, then a random chain of elementwise, layout (reshape,
    transpose, slice, concat, broadcast), select, cast, reduction and product ops; one or
    two results; its vjp."""
    dtype = draw(st.sampled_from(FLOATS))
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    steps = draw(st.integers(1, 6))
    shape = fit([dims(draw, ROWS), dims(draw)] + ([draw(st.sampled_from(BATCH))]
                                                   if draw(st.booleans()) else []),
                MAX_ELEMENTS // 4)
    scales: dict[str, float] = {}

    def body(p: Program):
        v = p.param(dtype, shape)
        seen = [v]
        for _ in range(steps):
            v = _step(p, v, rng, dtype)
            seen.append(v)
        outs = [v]
        if len(seen) > 2 and rng.random() < 0.3:
            extra = rng.choice(seen[1:-1])
            if extra.name != v.name:
                outs.append(extra)
        if rng.random() < 0.15:  # a parameter, or a reshape viewing it: copied at exit
            x = seen[0]
            outs.append(x if rng.random() < 0.5 else dsl.reshape(x, (math.prod(x.shape),)))
        if rng.random() < 0.1:
            outs.append(v)  # one value returned twice
        return outs

    f = trace("chain", body, scales)
    wrt = [q.name for q in f.params if q.type.dtype.is_float]
    names = ["chain"]
    if any(t.dtype.is_float for t in f.result_types):
        names.append("chain_vjp")
    return Case(with_grad(f, wrt), names, scales, draw(st.integers(0, 2**31)))


@st.composite
def layered(draw) -> Case:
    """A residual stack calling one layer function (`x + act(x @ w + b)`) two or three
    times with different weights: calls with big buffers (the callee's arena inside the
    caller's), then a loss and its gradient through the calls."""
    from eqsat.ir.dsl_function import TracedFunction
    dtype = draw(st.sampled_from(FLOATS))
    m, h = dims(draw, ROWS), dims(draw, DIMS[3:])
    m, h = fit([m, h, h], MAX_FLOPS)[:2]
    act = draw(st.sampled_from(SMOOTH if dtype is DType.f32 else tuple(ACTIVATIONS)))
    depth = draw(st.integers(2, 3))
    scales: dict[str, float] = {}

    def layer_body(p: Program):
        x = p.param(dtype, (m, h))
        return [x + ACTIVATIONS[act](x @ p.param(dtype, (h, h)) + p.param(dtype, (h,)))]

    layer = TracedFunction.from_ir(trace("layer", layer_body, {}))

    def body(p: Program):
        x = p.param(dtype, (m, h))
        for _ in range(depth):
            x = layer(x, p.param(dtype, (h, h), 1 / math.sqrt(h)), p.param(dtype, (h,)))
        d = x - p.param(dtype, (m, h))
        return [dsl.sum(d * d) * (1.0 / (m * h)), x]

    callees: list = []
    f = trace("stack", body, scales, callees)
    wrt = [q.name for q in f.params[1:-1]]
    # vjp: the loss and the activations are both results
    return Case(with_grad(f, wrt, "vjp", callees), ["stack", "stack_vjp", layer.name],
                scales, draw(st.integers(0, 2**31)))


def long_chain(n: int) -> str:
    """A chain of `n` small elementwise ops (five kinds, in turn) summed to a scalar, with its
    gradient declared: the shape of program whose size every stage must handle linearly."""
    ops = ["tanh", "sin", "neg", "exp", "cos"]
    lines, prev = ["func @f(%x: f32[4]) -> f32[] {"], "x"
    for i in range(n):
        lines.append(f"  %v{i} = {ops[i % 5]} %{prev} : f32[4]")
        prev = f"v{i}"
    lines += [f"  %s = sum %{prev}, axes=[0] : f32[]", "  return %s", "}",
              "func @g = grad @f wrt %x", ""]
    return "\n".join(lines)

