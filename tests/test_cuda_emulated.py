"""The CUDA backend's kernels run against `interpret` without a GPU, on the CPU emulator of
`gpu_emulator` (their NVPTX LLVM IR JIT-compiled for the host, one OS thread per GPU thread,
real barriers and warp shuffles).

Each kernel family has hand-written programs whose shapes make the backend choose the code
path named in the test (asserted from the launch plan, so a test cannot silently drift to an
easier path). Hypothesis draws shapes for the families whose code path depends on them
(reductions, transposes, products) and random modules, optimized or not, for what nobody
thought of: those are in test_cuda_emulated_drawn.py. Shapes stay small: a block that
synchronizes runs 256 OS threads.
"""

from __future__ import annotations

import numpy as np
import pytest

import eqsat
from eqsat.backend import nvptx_kernels, nvptx_layout, nvptx_matmul, nvptx_target

from cuda_helpers import NEEDS_EMULATOR, assert_same, check, module, whats
from gpu_emulator import EmulatedCuda

pytestmark = NEEDS_EMULATOR


# ---------------------------------------------------------------- elementwise


def test_elementwise_with_broadcasts():
    m = module("""
func @f(%x: f32[33,130], %b: f32[130], %c: f32[33,1], %s: f32[]) -> f32[33,130] {
  %0 = broadcast %b : f32[33,130]
  %1 = broadcast %c : f32[33,130]
  %2 = broadcast %s : f32[33,130]
  %3 = mul %x, %0 : f32[33,130]
  %4 = add %3, %1 : f32[33,130]
  %5 = tanh %4 : f32[33,130]
  %6 = sub %5, %2 : f32[33,130]
  %7 = sigmoid %6 : f32[33,130]
  return %7
}
func @g(%x: f32[7,9,5], %w: f32[9,1], %b: f32[5]) -> f32[7,9,5] {
  %y = map %x, %w, %b, body=tanh(add(mul($0, $1), $2)) : f32[7,9,5]
  return %y
}""")
    check(m)


UNARY_FLOAT = "neg abs exp log sqrt rsqrt tanh sigmoid relu recip sin cos".split()
BINARY_FLOAT = "add sub mul div pow maximum minimum".split()


@pytest.mark.parametrize("dtype", ["f32", "f64", "i32", "i64"])
def test_elementwise_every_numeric_dtype(dtype):
    is_int = dtype.startswith("i")
    unary = ["neg", "abs"] if is_int else UNARY_FLOAT
    binary = [op for op in BINARY_FLOAT if not (is_int and op in ("div", "pow"))]
    t = f"{dtype}[5,37]"
    lines = [f"  %{op} = {op} %x : {t}" for op in unary] + \
        [f"  %{op} = {op} %x, %y : {t}" for op in binary]
    results = ", ".join("%" + op for op in unary + binary)
    m = module(f"func @f(%x: {t}, %y: {t}) -> ({', '.join([t] * len(unary + binary))}) {{\n"
               + "\n".join(lines) + f"\n  return {results}\n}}")
    check(m, rtol=1e-5, atol=1e-6)


def test_compares_select_and_bools():
    m = module("""
func @f(%x: f32[6,40], %y: f32[6,40], %p: bool[6,40])
    -> (f32[6,40], bool[6,40], bool[6,40], bool[6,40]) {
  %c = lt %x, %y : bool[6,40]
  %s = select %c, %x, %y : f32[6,40]
  %e = eq %c, %p : bool[6,40]
  %n = ne %c, %p : bool[6,40]
  %g = ge %x, %y : bool[6,40]
  return %s, %e, %n, %g
}""")
    check(m)


DTYPES = ["f32", "f64", "i32", "i64", "bool"]


@pytest.mark.parametrize("src", DTYPES)
def test_casts_between_all_dtypes(src):
    outs = [d for d in DTYPES if d != src]
    m = module(f"func @f(%x: {src}[3,50]) -> ({', '.join(f'{d}[3,50]' for d in outs)}) {{\n"
               + "\n".join(f"  %{d} = cast %x : {d}[3,50]" for d in outs)
               + f"\n  return {', '.join('%' + d for d in outs)}\n}}")
    check(m)


def test_nan_and_infinity_inputs():
    m = module("""
func @f(%x: f32[4,40]) -> (f32[4,40], f32[4,40], f32[4,40], f32[4], f32[4], f32[4], f32[4,40]) {
  %e = exp %x : f32[4,40]
  %l = log %x : f32[4,40]
  %r = relu %x : f32[4,40]
  %s = sum %x, axes=[1] : f32[4]
  %mx = max %x, axes=[1] : f32[4]
  %mn = min %x, axes=[1] : f32[4]
  %z = const 0.0 : f32[4,40]
  %m = maximum %x, %z : f32[4,40]
  return %e, %l, %r, %s, %mx, %mn, %m
}""")
    emu = EmulatedCuda(m)
    x = np.linspace(-3, 3, 160, dtype=np.float32).reshape(4, 40)
    x[0, 3], x[1, 7], x[2, 11], x[2, 12] = np.nan, np.inf, -np.inf, np.inf
    x[3, :] = [np.inf, -np.inf] * 20
    assert_same(emu, m, "f", [x])


def test_grid_stride_loops_with_few_blocks(monkeypatch):
    monkeypatch.setattr(nvptx_kernels, "MAX_BLOCKS", 2)
    m = module("""
func @f(%x: f32[40,70], %b: f32[70]) -> (f32[40,70], f32[70], f32[40]) {
  %0 = broadcast %b : f32[40,70]
  %1 = mul %x, %0 : f32[40,70]
  %2 = sum %1, axes=[0] : f32[70]
  %3 = sum %1, axes=[1] : f32[40]
  return %1, %2, %3
}""")
    emu = check(m)
    assert all(k.grid[0] <= 2 or "warp" in k.what for k in emu.launches("f"))


# ---------------------------------------------------------------- reductions


@pytest.mark.parametrize("shape, axes, how", [
    ((70, 5), [0], "thread"),  # the innermost axis is kept
    ((40, 6), [1], "thread"),  # rows too short to share
    ((4, 40, 3), [1], "thread"),
    ((4, 40, 3), [0, 2], "warp"),  # the reduced axes are strided
    ((8, 300), [1], "warp"),
    ((2, 3, 100), [1, 2], "warp"),
    ((2, 3000), [1], "block"),
])
@pytest.mark.parametrize("op", ["sum", "max", "min"])
def test_reduction_strategies(shape, axes, how, op):
    kept = [d for i, d in enumerate(shape) if i not in axes]
    t = f"f32[{','.join(map(str, kept))}]"
    m = module(f"func @f(%x: f32[{','.join(map(str, shape))}]) -> {t} {{\n"
               f"  %0 = {op} %x, axes={axes} : {t}\n  return %0\n}}")
    emu = check(m, rtol=1e-5, atol=1e-4)
    assert f"{how}/output" in whats(emu)[0]


@pytest.mark.parametrize("dtype", ["f64", "i32", "i64", "bool"])
@pytest.mark.parametrize("how, shape", [("warp", (8, 100)), ("block", (1, 1500))])
def test_shuffled_reductions_of_every_dtype(dtype, how, shape):
    # 64-bit values cross the shuffle as two halves, bools widened to 32 bits.
    rows, n = shape
    ops = ["max", "min"] + (["sum"] if dtype != "bool" else [])
    results = ", ".join([f"{dtype}[{rows}]"] * len(ops))
    m = module(f"func @f(%x: {dtype}[{rows},{n}]) -> ({results}) {{\n"
               + "\n".join(f"  %{op} = {op} %x, axes=[1] : {dtype}[{rows}]" for op in ops)
               + f"\n  return {', '.join('%' + op for op in ops)}\n}}")
    emu = check(m, rtol=1e-9, atol=1e-9)
    assert all(f"{how}/output" in w for w in whats(emu))


def test_fused_map_reduce_over_broadcasts():
    m = module("""
func @f(%x: f32[6,300], %y: f32[300], %z: f32[6,1]) -> (f32[6], f32[300]) {
  %s = map_reduce %x, %y, %z, body=mul(sub($0, $1), $2), reduce=sum, axes=[1] : f32[6]
  %t = map_reduce %x, %y, body=exp(sub($0, $1)), reduce=max, axes=[0] : f32[300]
  return %s, %t
}""")
    emu = check(m, rtol=1e-5, atol=1e-4)
    assert ["warp" in w for w in whats(emu)] == [True, False]


# ---------------------------------------------------------------- data movement


@pytest.mark.parametrize("shape, perm, tiled", [
    ((40, 33), [1, 0], True),
    ((2, 33, 40), [0, 2, 1], True),
    ((5, 3, 36), [2, 1, 0], True),
    ((3, 2, 40, 7), [1, 3, 0, 2], True),
    ((4, 5, 6), [1, 0, 2], False),  # the innermost axis stays: a strided copy
    ((1, 40, 1, 33), [2, 0, 3, 1], True),
])
@pytest.mark.parametrize("dtype", ["f32", "i64"])
def test_transposes(shape, perm, tiled, dtype):
    out = [shape[p] for p in perm]
    m = module(f"func @f(%x: {dtype}[{','.join(map(str, shape))}]) -> "
               f"{dtype}[{','.join(map(str, out))}] {{\n"
               f"  %0 = transpose %x, perm={perm} : {dtype}[{','.join(map(str, out))}]\n"
               f"  return %0\n}}")
    emu = check(m)
    assert ("transpose_tiled" in emu.launches("f")[0].name) == tiled


def test_transpose_falls_back_to_a_strided_copy_past_the_grid(monkeypatch):
    monkeypatch.setattr(nvptx_layout, "MAX_GRID_YZ", 1)
    m = module("""
func @f(%x: f32[2,33,40]) -> f32[2,40,33] {
  %0 = transpose %x, perm=[0,2,1] : f32[2,40,33]
  return %0
}""")
    emu = check(m)
    assert "transpose_tiled" not in emu.launches("f")[0].name


def test_empty_tensors():
    m = module("""
func @f(%x: f32[0,3], %y: f32[2,3]) -> (f32[3], f32[0,3], f32[2,3]) {
  %s = sum %x, axes=[0] : f32[3]
  %n = neg %x : f32[0,3]
  %c = concat %x, %y, axis=0 : f32[2,3]
  return %s, %n, %c
}""")
    check(m)


def test_slices_and_concats():
    m = module("""
func @f(%x: f32[10,20], %y: i32[3,5,4], %z: f32[10,3])
    -> (f32[5,16], i32[2,2,4], f32[10,26], f32[15,3]) {
  %a = slice %x, start=[2,3], stop=[7,19] : f32[5,16]
  %b = slice %y, start=[1,2,0], stop=[3,4,4] : i32[2,2,4]
  %c = concat %x, %z, %z, axis=1 : f32[10,26]
  %d = slice %z, start=[0,0], stop=[5,3] : f32[5,3]
  %e = concat %z, %d, axis=0 : f32[15,3]
  return %a, %b, %c, %e
}""")
    check(m)


def test_concat_split_into_several_kernels(monkeypatch):
    monkeypatch.setattr(nvptx_layout, "CONCAT_MAX_INPUTS", 2)
    m = module("""
func @f(%a: f32[4,3], %b: f32[4,5], %c: f32[4,1], %d: f32[4,0], %e: f32[4,7]) -> f32[4,16] {
  %0 = concat %a, %b, %c, %d, %e, axis=1 : f32[4,16]
  return %0
}""")
    emu = check(m)
    assert len(emu.launches("f")) == 3


def test_fused_ops_past_the_kernel_parameters_run_expanded(monkeypatch):
    monkeypatch.setattr(nvptx_target, "MAX_KERNEL_INPUTS", 2)
    m = module("""
func @f(%a: f32[4,3], %b: f32[4,3], %c: f32[3], %w: f32[3,5], %v: f32[5])
    -> (f32[4,3], f32[4], f32[4,5]) {
  %0 = map %a, %b, %c, body=mul(tanh(add($0, $1)), $2) : f32[4,3]
  %1 = map_reduce %a, %b, %c, body=sub(mul($0, $1), $2), reduce=max, axes=[1] : f32[4]
  %2 = matmul_epi %a, %w, %v, %v, ta=0, tb=0, body=mul(add($0, $1), $2) : f32[4,5]
  return %0, %1, %2
}""")
    emu = check(m)
    assert len(emu.launches("f")) > 3


# ---------------------------------------------------------------- matrix products


@pytest.mark.parametrize("dtype", ["f32", "f64", "i32"])
def test_matmul(dtype):
    m = module(f"""
func @f(%a: {dtype}[33,20], %b: {dtype}[20,70]) -> {dtype}[33,70] {{
  %0 = matmul %a, %b : {dtype}[33,70]
  return %0
}}""")
    check(m)


@pytest.mark.parametrize("ta, tb", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_matmul_transposed_operands(ta, tb):
    a = "f32[17,65]" if ta else "f32[65,17]"
    b = "f32[9,17]" if tb else "f32[17,9]"
    m = module(f"""
func @f(%a: {a}, %b: {b}) -> f32[65,9] {{
  %0 = matmul_t %a, %b, ta={ta}, tb={tb} : f32[65,9]
  return %0
}}""")
    check(m)


def test_matmul_epilogues_with_bias():
    m = module("""
func @f(%x: f32[20,30], %w: f32[30,70], %b: f32[70], %r: f32[20,1]) -> (f32[20,70], f32[20,70]) {
  %h = matmul_epi %x, %w, %b, ta=0, tb=0, body=relu(add($0, $1)) : f32[20,70]
  %g = matmul_epi %x, %w, %b, %r, ta=0, tb=0, body=tanh(mul(add($0, $1), $2)) : f32[20,70]
  return %h, %g
}""")
    check(m)


def test_batched_matmul_loops_over_the_grid(monkeypatch):
    monkeypatch.setattr(nvptx_matmul, "MAX_GRID_YZ", 1)
    m = module("""
func @f(%a: f32[3,70,9], %b: f32[3,9,20], %c: f32[2,2,9,70], %d: f32[2,2,9,5])
    -> (f32[3,70,20], f32[2,2,70,5]) {
  %0 = matmul %a, %b : f32[3,70,20]
  %1 = matmul_t %c, %d, ta=1, tb=0 : f32[2,2,70,5]
  return %0, %1
}""")
    emu = check(m)
    assert all(k.grid[1:] == (1, 1) for k in emu.launches("f"))


# ---------------------------------------------------------------- calls, results, gradients


def test_calls_are_inlined_and_results_placed():
    # The caller's %g1.y and the inlined call's %y once shared a buffer (commit 7872894).
    m = module("""
func @g(%x: f32[4,6]) -> (f32[4,6], f32[6]) {
  %y = exp %x : f32[4,6]
  %s = sum %y, axes=[0] : f32[6]
  return %y, %s
}
func @f(%x: f32[4,6]) -> (f32[4,6], f32[6], f32[4,6], f32[24], f32[4,6]) {
  %g1.y = neg %x : f32[4,6]
  %a, %b = call @g(%g1.y) : f32[4,6], f32[6]
  %c, %d = call @g(%a) : f32[4,6], f32[6]
  %e = add %c, %g1.y : f32[4,6]
  %r = reshape %x : f32[24]
  return %e, %d, %a, %r, %x
}""")
    check(m, rtol=1e-5, atol=1e-4)


def test_gradients_of_a_small_mlp():
    m = module("""
func @loss(%x: f32[8,12], %w: f32[12,5], %b: f32[5], %y: f32[8,5]) -> f32[] {
  %0 = matmul %x, %w : f32[8,5]
  %1 = broadcast %b : f32[8,5]
  %2 = add %0, %1 : f32[8,5]
  %3 = tanh %2 : f32[8,5]
  %4 = sub %3, %y : f32[8,5]
  %5 = mul %4, %4 : f32[8,5]
  %6 = sum %5, axes=[0,1] : f32[]
  return %6
}
func @loss_grad = value_and_grad @loss wrt %w, %b
func @loss_dx = grad @loss wrt %x
func @h(%x: f32[6,40]) -> f32[6,40] {
  %0 = sigmoid %x : f32[6,40]
  %1 = max %0, axes=[1] : f32[6]
  %2 = broadcast %1 : f32[40,6]
  %3 = transpose %2, perm=[1,0] : f32[6,40]
  %4 = mul %0, %3 : f32[6,40]
  return %4
}
func @h_vjp = vjp @h wrt %x""")
    check(m, rtol=1e-4, atol=1e-5)


def test_optimized_mlp_training_step():
    m = module("""
func @loss(%x: f32[16,20], %w: f32[20,10], %b: f32[10]) -> f32[] {
  %0 = matmul %x, %w : f32[16,10]
  %1 = broadcast %b : f32[16,10]
  %2 = add %0, %1 : f32[16,10]
  %3 = relu %2 : f32[16,10]
  %4 = max %3, axes=[1] : f32[16]
  %5 = sum %4, axes=[0] : f32[]
  return %5
}
func @step = value_and_grad @loss wrt %w, %b""")
    opt = eqsat.optimize(eqsat.differentiate(m), target="cuda",
                         limits=eqsat.Limits(iterations=6, seconds=5))
    check(opt, rtol=1e-4, atol=1e-5)
