"""The benchmark workloads: each as eqsat IR (hand-fused where the optimizer cannot yet fuse,
and as plain core ops), a numpy eager reference, and jax / torch versions when installed."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import eqsat
from eqsat.ir import parse


@dataclass
class Workload:
    """One benchmark: inputs, the numpy eager function, and eqsat modules by variant."""

    name: str
    func: str  # the IR function to run
    make_inputs: Callable[[np.random.Generator], list[np.ndarray]]
    numpy: Callable[..., Any]
    modules: dict[str, Callable[[], eqsat.Module]] = field(default_factory=dict)
    jax: Callable[[Any], Callable[..., Any]] | None = None  # given jax.numpy, returns a function
    torch: Callable[[Any], Callable[..., Any]] | None = None  # given torch, returns a function


def _f32(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


# ---------------------------------------------------------------- elementwise chain

EW_N, EW_D = 4096, 1024  # 4M floats; w and b broadcast along the rows


def _np_sigmoid(x: np.ndarray, xp: Any = np) -> np.ndarray:
    return 1.0 / (1.0 + xp.exp(-x))


def ew_numpy(x: np.ndarray, w: np.ndarray, b: np.ndarray, xp: Any = np) -> np.ndarray:
    """tanh(x*w+b) * sigmoid(x), numpy eager."""
    return xp.tanh(x * w + b) * _np_sigmoid(x, xp)


EW_FUSED = f"""module @ew
func @f(%x: f32[{EW_N},{EW_D}], %w: f32[{EW_D}], %b: f32[{EW_D}]) -> f32[{EW_N},{EW_D}] {{
  %y = map %x, %w, %b, body=mul(tanh(add(mul($0, $1), $2)), sigmoid($0)) : f32[{EW_N},{EW_D}]
  return %y
}}
"""

EW_CORE = f"""module @ew
func @f(%x: f32[{EW_N},{EW_D}], %w: f32[{EW_D}], %b: f32[{EW_D}]) -> f32[{EW_N},{EW_D}] {{
  %0 = broadcast %w : f32[{EW_N},{EW_D}]
  %1 = mul %x, %0 : f32[{EW_N},{EW_D}]
  %2 = broadcast %b : f32[{EW_N},{EW_D}]
  %3 = add %1, %2 : f32[{EW_N},{EW_D}]
  %4 = tanh %3 : f32[{EW_N},{EW_D}]
  %5 = sigmoid %x : f32[{EW_N},{EW_D}]
  %6 = mul %4, %5 : f32[{EW_N},{EW_D}]
  return %6
}}
"""

# ---------------------------------------------------------------- softmax and layer norm

R, C = 4096, 1024


def softmax_numpy(x: np.ndarray, xp: Any = np) -> np.ndarray:
    """Row softmax, numpy eager (max subtracted)."""
    e = xp.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


SOFTMAX_FUSED = f"""module @softmax
func @f(%x: f32[{R},{C}]) -> f32[{R},{C}] {{
  %m = map_reduce %x, body=$0, reduce=max, axes=[1] : f32[{R}]
  %m1 = reshape %m : f32[{R},1]
  %s = map_reduce %x, %m1, body=exp(sub($0, $1)), reduce=sum, axes=[1] : f32[{R}]
  %r = map %s, body=recip($0) : f32[{R}]
  %r1 = reshape %r : f32[{R},1]
  %y = map %x, %m1, %r1, body=mul(exp(sub($0, $1)), $2) : f32[{R},{C}]
  return %y
}}
"""

SOFTMAX_CORE = f"""module @softmax
func @f(%x: f32[{R},{C}]) -> f32[{R},{C}] {{
  %m = max %x, axes=[1] : f32[{R}]
  %m1 = reshape %m : f32[{R},1]
  %mb = broadcast %m1 : f32[{R},{C}]
  %d = sub %x, %mb : f32[{R},{C}]
  %e = exp %d : f32[{R},{C}]
  %s = sum %e, axes=[1] : f32[{R}]
  %s1 = reshape %s : f32[{R},1]
  %sb = broadcast %s1 : f32[{R},{C}]
  %y = div %e, %sb : f32[{R},{C}]
  return %y
}}
"""


def layernorm_numpy(x: np.ndarray, g: np.ndarray, b: np.ndarray, xp: Any = np) -> np.ndarray:
    """Row layer norm with scale and shift, numpy eager."""
    mu = x.mean(axis=1, keepdims=True)
    d = x - mu
    var = (d * d).mean(axis=1, keepdims=True)
    return d / xp.sqrt(var + 1e-5) * g + b


LAYERNORM_FUSED = f"""module @layernorm
func @f(%x: f32[{R},{C}], %g: f32[{C}], %b: f32[{C}]) -> f32[{R},{C}] {{
  %s = map_reduce %x, body=$0, reduce=sum, axes=[1] : f32[{R}]
  %mu = map %s, body=mul($0, {1 / C}) : f32[{R}]
  %mu1 = reshape %mu : f32[{R},1]
  %v = map_reduce %x, %mu1, body=mul(sub($0, $1), sub($0, $1)), reduce=sum, axes=[1] : f32[{R}]
  %r = map %v, body=rsqrt(add(mul($0, {1 / C}), 1e-05)) : f32[{R}]
  %r1 = reshape %r : f32[{R},1]
  %y = map %x, %mu1, %r1, %g, %b, body=add(mul(mul(sub($0, $1), $2), $3), $4) : f32[{R},{C}]
  return %y
}}
"""

LAYERNORM_CORE = f"""module @layernorm
func @f(%x: f32[{R},{C}], %g: f32[{C}], %b: f32[{C}]) -> f32[{R},{C}] {{
  %s = sum %x, axes=[1] : f32[{R}]
  %s1 = reshape %s : f32[{R},1]
  %n = const {float(C)} : f32[{R},1]
  %mu = div %s1, %n : f32[{R},1]
  %mub = broadcast %mu : f32[{R},{C}]
  %d = sub %x, %mub : f32[{R},{C}]
  %d2 = mul %d, %d : f32[{R},{C}]
  %v = sum %d2, axes=[1] : f32[{R}]
  %v1 = reshape %v : f32[{R},1]
  %var = div %v1, %n : f32[{R},1]
  %eps = const 1e-05 : f32[{R},1]
  %ve = add %var, %eps : f32[{R},1]
  %r = rsqrt %ve : f32[{R},1]
  %rb = broadcast %r : f32[{R},{C}]
  %y0 = mul %d, %rb : f32[{R},{C}]
  %gb = broadcast %g : f32[{R},{C}]
  %y1 = mul %y0, %gb : f32[{R},{C}]
  %bb = broadcast %b : f32[{R},{C}]
  %y = add %y1, %bb : f32[{R},{C}]
  return %y
}}
"""

# ---------------------------------------------------------------- MLP forward and training step

MB, MI, MH, MO = 256, 784, 1024, 10
_MLP_PARAMS = (f"%w1: f32[{MI},{MH}], %b1: f32[{MH}], %w2: f32[{MH},{MH}], %b2: f32[{MH}], "
               f"%w3: f32[{MH},{MO}], %b3: f32[{MO}]")


def mlp_inputs(rng: np.random.Generator) -> list[np.ndarray]:
    """x and the six parameters (He-scaled)."""
    return [_f32(rng, MB, MI), _f32(rng, MI, MH, scale=math.sqrt(2 / MI)), _f32(rng, MH, scale=0.1),
            _f32(rng, MH, MH, scale=math.sqrt(2 / MH)), _f32(rng, MH, scale=0.1),
            _f32(rng, MH, MO, scale=math.sqrt(2 / MH)), _f32(rng, MO, scale=0.1)]


def mlp_numpy(x, w1, b1, w2, b2, w3, b3, xp=np):
    """The MLP's logits, numpy eager."""
    h = xp.maximum(x @ w1 + b1, 0)
    h = xp.maximum(h @ w2 + b2, 0)
    return h @ w3 + b3


def _dense_core(k: int, x: str, w: str, b: str, rows: int, n: int, relu: bool) -> list[str]:
    t = f"f32[{rows},{n}]"
    lines = [f"%mm{k} = matmul {x}, {w} : {t}", f"%bb{k} = broadcast {b} : {t}",
             f"%z{k} = add %mm{k}, %bb{k} : {t}"]
    if relu:
        lines.append(f"%h{k} = relu %z{k} : {t}")
    return lines


def _mlp_body_core() -> list[str]:
    return (_dense_core(1, "%x", "%w1", "%b1", MB, MH, True)
            + _dense_core(2, "%h1", "%w2", "%b2", MB, MH, True)
            + _dense_core(3, "%h2", "%w3", "%b3", MB, MO, False))


def _func(header: str, lines: list[str], ret: str) -> str:
    return header + " {\n" + "".join(f"  {s}\n" for s in lines) + f"  return {ret}\n}}\n"


MLP_CORE = "module @mlp\n" + _func(
    f"func @f(%x: f32[{MB},{MI}], {_MLP_PARAMS}) -> f32[{MB},{MO}]", _mlp_body_core(), "%z3")

MLP_FUSED = "module @mlp\n" + _func(
    f"func @f(%x: f32[{MB},{MI}], {_MLP_PARAMS}) -> f32[{MB},{MO}]", [
        f"%h1 = matmul_epi %x, %w1, %b1, ta=0, tb=0, body=relu(add($0, $1)) : f32[{MB},{MH}]",
        f"%h2 = matmul_epi %h1, %w2, %b2, ta=0, tb=0, body=relu(add($0, $1)) : f32[{MB},{MH}]",
        f"%z = matmul_epi %h2, %w3, %b3, ta=0, tb=0, body=add($0, $1) : f32[{MB},{MO}]"], "%z")


def train_inputs(rng: np.random.Generator) -> list[np.ndarray]:
    """x, one-hot labels, the six parameters."""
    x, *params = mlp_inputs(rng)
    y = np.eye(MO, dtype=np.float32)[rng.integers(0, MO, MB)]
    return [x, y, *params]


def train_numpy(x, y, w1, b1, w2, b2, w3, b3, xp=np):
    """Mean softmax cross-entropy and its gradients for all parameters, numpy eager."""
    a1 = x @ w1 + b1
    h1 = xp.maximum(a1, 0)
    a2 = h1 @ w2 + b2
    h2 = xp.maximum(a2, 0)
    z = h2 @ w3 + b3
    zc = z - z.max(axis=1, keepdims=True)
    e = xp.exp(zc)
    s = e.sum(axis=1, keepdims=True)
    loss = -(y * (zc - xp.log(s))).sum() / MB
    dz = (e / s * y.sum(axis=1, keepdims=True) - y) / MB
    dw3, db3 = h2.T @ dz, dz.sum(axis=0)
    d2 = (dz @ w3.T) * (a2 > 0)
    dw2, db2 = h1.T @ d2, d2.sum(axis=0)
    d1 = (d2 @ w2.T) * (a1 > 0)
    dw1, db1 = x.T @ d1, d1.sum(axis=0)
    return loss, dw1, db1, dw2, db2, dw3, db3


def _train_loss_core() -> list[str]:
    v = f"f32[{MB},{MO}]"
    return _mlp_body_core() + [
        f"%m = max %z3, axes=[1] : f32[{MB}]", f"%m1 = reshape %m : f32[{MB},1]",
        f"%mb = broadcast %m1 : {v}", f"%zc = sub %z3, %mb : {v}", f"%e = exp %zc : {v}",
        f"%s = sum %e, axes=[1] : f32[{MB}]", f"%ls = log %s : f32[{MB}]",
        f"%ls1 = reshape %ls : f32[{MB},1]", f"%lsb = broadcast %ls1 : {v}",
        f"%lp = sub %zc, %lsb : {v}", f"%t = mul %y, %lp : {v}",
        "%tot = sum %t, axes=[0,1] : f32[]", f"%k = const {-1.0 / MB} : f32[]",
        "%l = mul %tot, %k : f32[]"]


TRAIN_CORE = "module @train\n" + _func(
    f"func @loss(%x: f32[{MB},{MI}], %y: f32[{MB},{MO}], {_MLP_PARAMS}) -> f32[]",
    _train_loss_core(), "%l") + "func @f = value_and_grad @loss wrt %w1, %b1, %w2, %b2, %w3, %b3\n"


# ---------------------------------------------------------------- transformer encoder block

TB, TS, TD, TH, TF = 8, 128, 512, 8, 2048
TDH = TD // TH
TR = TB * TS  # rows of the flattened activations


def transformer_inputs(rng: np.random.Generator) -> list[np.ndarray]:
    """x, then wq wk wv wo, g1 b1, w1 c1, w2 c2, g2 b2."""
    s = 1 / math.sqrt(TD)
    return [_f32(rng, TB, TS, TD), *[_f32(rng, TD, TD, scale=s) for _ in range(4)],
            np.ones(TD, np.float32), np.zeros(TD, np.float32),
            _f32(rng, TD, TF, scale=s), _f32(rng, TF, scale=0.1),
            _f32(rng, TF, TD, scale=1 / math.sqrt(TF)), _f32(rng, TD, scale=0.1),
            np.ones(TD, np.float32), np.zeros(TD, np.float32)]


def transformer_numpy(x, wq, wk, wv, wo, g1, b1, w1, c1, w2, c2, g2, b2, xp=np):
    """A post-norm encoder block (GELU tanh form), numpy eager."""
    x2 = x.reshape(TR, TD)
    q = (x2 @ wq).reshape(TB, TS, TH, TDH).transpose(0, 2, 1, 3)
    k = (x2 @ wk).reshape(TB, TS, TH, TDH).transpose(0, 2, 3, 1)
    v = (x2 @ wv).reshape(TB, TS, TH, TDH).transpose(0, 2, 1, 3)
    p = softmax_numpy((q @ k * (1 / math.sqrt(TDH))).reshape(-1, TS), xp).reshape(TB, TH, TS, TS)
    o = (p @ v).transpose(0, 2, 1, 3).reshape(TR, TD)
    h = layernorm_numpy(x2 + o @ wo, g1, b1, xp)
    f = h @ w1 + c1
    f = 0.5 * f * (1 + xp.tanh(0.7978845608028654 * (f + 0.044715 * f * f * f)))
    return layernorm_numpy(h + f @ w2 + c2, g2, b2, xp).reshape(TB, TS, TD)


def _softmax_core(p: str, x: str, shape: tuple[int, ...]) -> list[str]:
    """Core-op softmax over the last axis of `x`, result `%{p}y`."""
    full = f"f32[{','.join(map(str, shape))}]"
    red = f"f32[{','.join(map(str, shape[:-1]))}]"
    kd = f"f32[{','.join(map(str, shape[:-1]))},1]"
    ax = len(shape) - 1
    return [f"%{p}m = max {x}, axes=[{ax}] : {red}", f"%{p}m1 = reshape %{p}m : {kd}",
            f"%{p}mb = broadcast %{p}m1 : {full}", f"%{p}d = sub {x}, %{p}mb : {full}",
            f"%{p}e = exp %{p}d : {full}", f"%{p}s = sum %{p}e, axes=[{ax}] : {red}",
            f"%{p}s1 = reshape %{p}s : {kd}", f"%{p}sb = broadcast %{p}s1 : {full}",
            f"%{p}y = div %{p}e, %{p}sb : {full}"]


def _layernorm_core(p: str, x: str, g: str, b: str, rows: int, n: int) -> list[str]:
    """Core-op layer norm over rows of `x`, result `%{p}y`."""
    full, kd = f"f32[{rows},{n}]", f"f32[{rows},1]"
    return [f"%{p}s = sum {x}, axes=[1] : f32[{rows}]", f"%{p}s1 = reshape %{p}s : {kd}",
            f"%{p}n = const {float(n)} : {kd}", f"%{p}mu = div %{p}s1, %{p}n : {kd}",
            f"%{p}mub = broadcast %{p}mu : {full}", f"%{p}d = sub {x}, %{p}mub : {full}",
            f"%{p}d2 = mul %{p}d, %{p}d : {full}", f"%{p}v = sum %{p}d2, axes=[1] : f32[{rows}]",
            f"%{p}v1 = reshape %{p}v : {kd}", f"%{p}var = div %{p}v1, %{p}n : {kd}",
            f"%{p}eps = const 1e-05 : {kd}", f"%{p}ve = add %{p}var, %{p}eps : {kd}",
            f"%{p}r = rsqrt %{p}ve : {kd}", f"%{p}rb = broadcast %{p}r : {full}",
            f"%{p}y0 = mul %{p}d, %{p}rb : {full}", f"%{p}gb = broadcast {g} : {full}",
            f"%{p}y1 = mul %{p}y0, %{p}gb : {full}", f"%{p}bb = broadcast {b} : {full}",
            f"%{p}y = add %{p}y1, %{p}bb : {full}"]


def _layernorm_fused(p: str, x: str, g: str, b: str, rows: int, n: int) -> list[str]:
    """Fused layer norm (two row reductions and one map), result `%{p}y`."""
    kd = f"f32[{rows},1]"
    return [f"%{p}s = map_reduce {x}, body=$0, reduce=sum, axes=[1] : f32[{rows}]",
            f"%{p}mu = map %{p}s, body=mul($0, {1 / n}) : f32[{rows}]",
            f"%{p}mu1 = reshape %{p}mu : {kd}",
            f"%{p}v = map_reduce {x}, %{p}mu1, body=mul(sub($0, $1), sub($0, $1)), reduce=sum, "
            f"axes=[1] : f32[{rows}]",
            f"%{p}r = map %{p}v, body=rsqrt(add(mul($0, {1 / n}), 1e-05)) : f32[{rows}]",
            f"%{p}r1 = reshape %{p}r : {kd}",
            f"%{p}y = map {x}, %{p}mu1, %{p}r1, {g}, {b}, "
            f"body=add(mul(mul(sub($0, $1), $2), $3), $4) : f32[{rows},{n}]"]


_T_HEADER = (f"func @f(%x: f32[{TB},{TS},{TD}], %wq: f32[{TD},{TD}], %wk: f32[{TD},{TD}], "
             f"%wv: f32[{TD},{TD}], %wo: f32[{TD},{TD}], %g1: f32[{TD}], %b1: f32[{TD}], "
             f"%w1: f32[{TD},{TF}], %c1: f32[{TF}], %w2: f32[{TF},{TD}], %c2: f32[{TD}], "
             f"%g2: f32[{TD}], %b2: f32[{TD}]) -> f32[{TB},{TS},{TD}]")
_ROWS, _HEADS = f"f32[{TR},{TD}]", f"f32[{TB},{TS},{TH},{TDH}]"
_BH = f"f32[{TB},{TH},{TS},{TDH}]"
_SCORES = f"f32[{TB},{TH},{TS},{TS}]"
_GELU_C = 0.7978845608028654


def _projections(kt_perm: str, kt_type: str) -> list[str]:
    return [f"%x2 = reshape %x : {_ROWS}",
            f"%q0 = matmul %x2, %wq : {_ROWS}", f"%q1 = reshape %q0 : {_HEADS}",
            f"%q = transpose %q1, perm=[0,2,1,3] : {_BH}",
            f"%k0 = matmul %x2, %wk : {_ROWS}", f"%k1 = reshape %k0 : {_HEADS}",
            f"%k = transpose %k1, perm={kt_perm} : {kt_type}",
            f"%v0 = matmul %x2, %wv : {_ROWS}", f"%v1 = reshape %v0 : {_HEADS}",
            f"%v = transpose %v1, perm=[0,2,1,3] : {_BH}"]


def _transformer_core() -> str:
    f = f"f32[{TR},{TF}]"
    lines = _projections("[0,2,3,1]", f"f32[{TB},{TH},{TDH},{TS}]") + [
        f"%sc = matmul %q, %k : {_SCORES}", f"%c8 = const {1 / math.sqrt(TDH)} : {_SCORES}",
        f"%sc2 = mul %sc, %c8 : {_SCORES}",
        *_softmax_core("p", "%sc2", (TB, TH, TS, TS)),
        f"%o = matmul %py, %v : {_BH}", f"%ot = transpose %o, perm=[0,2,1,3] : {_HEADS}",
        f"%o2 = reshape %ot : {_ROWS}", f"%a = matmul %o2, %wo : {_ROWS}",
        f"%r1 = add %x2, %a : {_ROWS}",
        *_layernorm_core("n1", "%r1", "%g1", "%b1", TR, TD),
        *_dense_core(5, "%n1y", "%w1", "%c1", TR, TF, False),
        f"%g0 = mul %z5, %z5 : {f}", f"%g1_ = mul %g0, %z5 : {f}",
        f"%gk = const 0.044715 : {f}", f"%g2_ = mul %gk, %g1_ : {f}",
        f"%g3 = add %z5, %g2_ : {f}", f"%gc = const {_GELU_C} : {f}",
        f"%g4 = mul %gc, %g3 : {f}", f"%gh = const 0.5 : {f}", f"%g5 = mul %gh, %z5 : {f}",
        f"%g6 = tanh %g4 : {f}", f"%g1c = const 1.0 : {f}", f"%g7 = add %g1c, %g6 : {f}",
        f"%g8 = mul %g5, %g7 : {f}",
        *_dense_core(6, "%g8", "%w2", "%c2", TR, TD, False),
        f"%r2 = add %n1y, %z6 : {_ROWS}",
        *_layernorm_core("n2", "%r2", "%g2", "%b2", TR, TD),
        f"%out = reshape %n2y : f32[{TB},{TS},{TD}]"]
    return "module @transformer\n" + _func(_T_HEADER, lines, "%out")


def _transformer_fused() -> str:
    z = "add($0, $1)"
    gelu = f"mul(mul(0.5, {z}), add(1.0, tanh(mul({_GELU_C}, add({z}, mul(0.044715, " \
           f"mul(mul({z}, {z}), {z})))))))"
    red, kd = f"f32[{TB},{TH},{TS}]", f"f32[{TB},{TH},{TS},1]"
    sc = f"mul($0, {1 / math.sqrt(TDH)})"
    lines = _projections("[0,2,1,3]", _BH) + [
        f"%sc = matmul_t %q, %k, ta=0, tb=1 : {_SCORES}",
        f"%pm = map_reduce %sc, body={sc}, reduce=max, axes=[3] : {red}",
        f"%pm1 = reshape %pm : {kd}",
        f"%ps = map_reduce %sc, %pm1, body=exp(sub({sc}, $1)), reduce=sum, axes=[3] : {red}",
        f"%pr = map %ps, body=recip($0) : {red}", f"%pr1 = reshape %pr : {kd}",
        f"%py = map %sc, %pm1, %pr1, body=mul(exp(sub({sc}, $1)), $2) : {_SCORES}",
        f"%o = matmul %py, %v : {_BH}", f"%ot = transpose %o, perm=[0,2,1,3] : {_HEADS}",
        f"%o2 = reshape %ot : {_ROWS}",
        f"%r1 = matmul_epi %o2, %wo, %x2, ta=0, tb=0, body=add($0, $1) : {_ROWS}",
        *_layernorm_fused("n1", "%r1", "%g1", "%b1", TR, TD),
        f"%f = matmul_epi %n1y, %w1, %c1, ta=0, tb=0, body={gelu} : f32[{TR},{TF}]",
        f"%r2 = matmul_epi %f, %w2, %c2, %n1y, ta=0, tb=0, body=add(add($0, $1), $2) : {_ROWS}",
        *_layernorm_fused("n2", "%r2", "%g2", "%b2", TR, TD),
        f"%out = reshape %n2y : f32[{TB},{TS},{TD}]"]
    return "module @transformer\n" + _func(_T_HEADER, lines, "%out")


TRANSFORMER_CORE = _transformer_core()
TRANSFORMER_FUSED = _transformer_fused()


# ---------------------------------------------------------------- torch (eager) versions


def _torch_ew(torch: Any) -> Callable[..., Any]:
    return lambda x, w, b: torch.tanh(x * w + b) * torch.sigmoid(x)


def _torch_softmax(torch: Any) -> Callable[..., Any]:
    return lambda x: torch.softmax(x, dim=1)


def _torch_layernorm(torch: Any) -> Callable[..., Any]:
    return lambda x, g, b: torch.nn.functional.layer_norm(x, (x.shape[-1],), g, b, 1e-5)


def _torch_mlp(torch: Any) -> Callable[..., Any]:
    def f(x, w1, b1, w2, b2, w3, b3):
        h = torch.relu(torch.addmm(b1, x, w1))
        return torch.addmm(b3, torch.relu(torch.addmm(b2, h, w2)), w3)
    return f


def _torch_train(torch: Any) -> Callable[..., Any]:
    mlp = _torch_mlp(torch)

    def f(x, y, *params):
        params = [p.detach().requires_grad_() for p in params]
        z = mlp(x, *params)
        loss = -(y * torch.log_softmax(z, dim=1)).sum() / z.shape[0]
        grads = torch.autograd.grad(loss, params)
        return (loss.detach(), *grads)
    return f


def _torch_transformer(torch: Any) -> Callable[..., Any]:
    F = torch.nn.functional

    def f(x, wq, wk, wv, wo, g1, b1, w1, c1, w2, c2, g2, b2):
        with torch.no_grad():
            x2 = x.reshape(TR, TD)
            q, k, v = ((x2 @ w).reshape(TB, TS, TH, TDH).transpose(1, 2) for w in (wq, wk, wv))
            p = torch.softmax(q @ k.transpose(-1, -2) * (1 / math.sqrt(TDH)), dim=-1)
            o = (p @ v).transpose(1, 2).reshape(TR, TD)
            h = F.layer_norm(x2 + o @ wo, (TD,), g1, b1, 1e-5)
            g = F.gelu(torch.addmm(c1, h, w1), approximate="tanh")
            return F.layer_norm(h + torch.addmm(c2, g, w2), (TD,), g2, b2, 1e-5).reshape(TB, TS, TD)
    return f


def _jax(fn: Callable[..., Any]) -> Callable[[Any], Callable[..., Any]]:
    """The numpy reference with jax.numpy as its namespace (jit applied by the harness)."""
    return lambda jnp: (lambda *a: fn(*a, xp=jnp))


def _module(text: str) -> Callable[[], eqsat.Module]:
    return lambda: parse(text)


WORKLOADS = [
    Workload("elementwise", "f", lambda r: [_f32(r, EW_N, EW_D), _f32(r, EW_D), _f32(r, EW_D)],
             ew_numpy, {"fused": _module(EW_FUSED), "core": _module(EW_CORE)},
             _jax(ew_numpy), _torch_ew),
    Workload("softmax", "f", lambda r: [_f32(r, R, C)], softmax_numpy,
             {"fused": _module(SOFTMAX_FUSED), "core": _module(SOFTMAX_CORE)},
             _jax(softmax_numpy), _torch_softmax),
    Workload("layernorm", "f", lambda r: [_f32(r, R, C), _f32(r, C), _f32(r, C)],
             layernorm_numpy, {"fused": _module(LAYERNORM_FUSED), "core": _module(LAYERNORM_CORE)},
             _jax(layernorm_numpy), _torch_layernorm),
    Workload("mlp_fwd", "f", mlp_inputs, mlp_numpy,
             {"fused": _module(MLP_FUSED), "core": _module(MLP_CORE)}, _jax(mlp_numpy), _torch_mlp),
    Workload("train_step", "f", train_inputs, train_numpy, {"core": _module(TRAIN_CORE)},
             _jax(train_numpy), _torch_train),
    Workload("transformer", "f", transformer_inputs, transformer_numpy,
             {"fused": _module(TRANSFORMER_FUSED), "core": _module(TRANSFORMER_CORE)},
             _jax(transformer_numpy), _torch_transformer),
]
