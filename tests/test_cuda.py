"""The CUDA backend's PTX: for every model and random program it assembles with ptxas (sm_90),
carries the code shapes we designed for (CHECK-style), keeps launches within the hardware's
limits, refuses what it cannot target, and can be emitted in a forked child."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

import eqsat
from eqsat.backend import cuda
from eqsat.backend import nvptx_target as T
from eqsat.backend.nvptx_kernels import GpuKernelBuilder
from eqsat.testing import modules

from cuda_helpers import EXAMPLES, SHAPES, example
from cuda_helpers import module as one
from call_trees import call_tree
from large_programs import long_chain


def assemble(ptx: str, tmp_path: Path, name: str = "m") -> None:
    """ptxas -arch=sm_90 accepts the PTX (skips cleanly without ptxas)."""
    ptxas = shutil.which("ptxas")
    if ptxas is None:
        pytest.skip("ptxas is not on PATH")
    path = tmp_path / f"{name}.ptx"
    path.write_text(ptx)
    r = subprocess.run([ptxas, "-arch=sm_90", "-o", "/dev/null", str(path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"ptxas rejected {name}:\n{r.stderr[:3000]}"


def kernel_text(ptx: str, name_part: str) -> str:
    """The PTX of the first kernel whose entry name contains `name_part`."""
    start = ptx.rindex(".entry", 0, ptx.index(f"_{name_part}("))
    end = ptx.find(".entry", start + 1)
    return ptx[start: end if end > 0 else len(ptx)]


# ---------------------------------------------------------------- ptxas on every model


@pytest.mark.parametrize("name", ["mlp", "transformer"])
def test_examples_assemble(name, tmp_path):
    ptx = cuda.emit_ptx(example(name))
    assert ".target sm_90" in ptx
    assemble(ptx, tmp_path, name)


@settings(max_examples=80, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(m=modules(max_functions=2, max_stmts=6))
def _lower_random(kb, m):
    for f in m.functions:
        cuda.plan_function(m, f, kb)


def test_random_programs_assemble(tmp_path):
    # Every drawn program's kernels go into one NVPTX module: one O3 run and one ptxas call.
    llmod = T.new_module("fuzz")
    kb = GpuKernelBuilder(llmod)
    _lower_random(kb)
    assert kb.count > 80
    assemble(T.to_ptx(llmod), tmp_path, "fuzz")


def test_degenerate_transposes_assemble(tmp_path):
    # rank 0 and size-1 axes: nothing moves, so no tiles (found by the random-program test)
    m = one("""func @f(%x: f32[], %y: f32[1,5], %z: f32[0,3]) -> (f32[], f32[5,1], f32[3,0]) {
  %a = transpose %x, perm=[] : f32[]
  %b = transpose %y, perm=[1,0] : f32[5,1]
  %c = transpose %z, perm=[1,0] : f32[3,0]
  return %a, %b, %c
}""")
    assemble(cuda.emit_ptx(m), tmp_path)


@pytest.fixture(scope="module")
def shapes_module():
    return one(SHAPES)


@pytest.fixture(scope="module")
def shapes_ptx(shapes_module):
    return cuda.emit_ptx(shapes_module)


def test_designed_kernels_assemble(shapes_ptx, tmp_path):
    assemble(shapes_ptx, tmp_path, "shapes")


# ---------------------------------------------------------------- CHECK-style assertions


# LLVM 22 spells 16-byte float accesses `ld.global.nc.v4.b32` (read-only path), older ones
# `ld.global.v4.f32`.
V4_LOAD = re.compile(r"ld\.global(\.nc)?\.v4\.(f32|b32)")
V4_STORE = re.compile(r"st\.global\.v4\.(f32|b32)")


def test_aligned_elementwise_is_vectorized(shapes_ptx):
    k = kernel_text(shapes_ptx, "map")
    assert V4_LOAD.search(k) and V4_STORE.search(k)
    assert "tanh" not in k and "call" not in k  # our own tanh, inlined
    assert V4_LOAD.search(kernel_text(shapes_ptx, "exp"))
    # the bool mask: 4 bytes at once beside the f32 vectors
    assert re.search(r"ld\.global(\.nc)?\.(v4\.u8|u32|b32)", kernel_text(shapes_ptx, "select"))


def test_unaligned_elementwise_stays_scalar():
    ptx = cuda.emit_ptx(one("func @f(%x: f32[3,7]) -> f32[3,7] {\n"
                            "  %y = neg %x : f32[3,7]\n  return %y\n}"))
    assert ".v4." not in ptx and re.search(r"ld\.global(\.nc)?\.(f32|b32)", ptx)


def test_reductions_use_warp_shuffles(shapes_ptx):
    rows = kernel_text(shapes_ptx, "map_reduce")
    assert "shfl.sync.down.b32" in rows and "bar.sync" not in rows  # a warp per row
    whole = kernel_text(shapes_ptx, "max")
    assert "shfl.sync.down.b32" in whole and ".shared" in whole and "bar.sync" in whole
    assert "shfl.sync" not in kernel_text(shapes_ptx, "sum")  # columns: a thread per output


def test_matmul_is_tiled_through_shared_memory(shapes_ptx):
    for part in ("matmul", "matmul_t", "matmul_epi"):
        k = kernel_text(shapes_ptx, part)
        assert ".shared" in k and "bar.sync" in k and "fma.rn.f32" in k, part
        assert re.search(r"ld\.shared\.(f32|b32)", k)
    # the relu epilogue: a max, or (numpy's tie rule for -0/+0) a float compare and select
    epi = kernel_text(shapes_ptx, "matmul_epi")
    assert re.search(r"\bmax(\.NaN)?\.f32|\bsetp\.[a-z]+\.f32", epi)


def test_transposes_go_through_shared_tiles(shapes_ptx):
    assert ".shared" in kernel_text(shapes_ptx, "transpose_tiled")
    assert shapes_ptx.count("_transpose_tiled(") >= 3  # f32 2-D, batched f32, i32


def test_launch_plan_is_described(shapes_ptx):
    head = shapes_ptx.split(".version")[0]
    assert "// @f:" in head and "grid=" in head and "block=(256, 1, 1)" in head
    assert "block=(32, 8, 1)" in head  # the tiled transposes


def test_calls_are_inlined_and_reshapes_are_views():
    prog = cuda.build(example("mlp"))
    loss = prog.plans["loss"]
    assert not any(ln.kernel.name.endswith("_call") for ln in loss.launches)
    assert len(loss.launches) == 9  # predict's 4 + loss's own 5
    r = one("func @f(%x: f32[4,8]) -> f32[32] {\n  %y = reshape %x : f32[32]\n"
            "  %z = neg %y : f32[32]\n  return %z\n}")
    plan = cuda.build(r).plans["f"]
    assert [ln.kernel.name for ln in plan.launches] == ["k1_neg"]


def test_inlined_call_values_keep_their_own_buffers():
    # A caller's %g1.y was the name inlining gave call @g's %y: one buffer for both values.
    m = one("""func @g(%x: f32[8]) -> f32[8] {
  %y = neg %x : f32[8]
  return %y
}
func @f(%x: f32[8]) -> f32[8] {
  %g1.y = exp %x : f32[8]
  %a = call @g(%x) : f32[8]
  %b = add %a, %g1.y : f32[8]
  return %b
}""")
    plan = cuda.build(m).plans["f"]
    written = [ln.values[0] for ln in plan.launches]
    assert len(set(written)) == 3
    add = plan.launches[-1]
    assert add.values[1] != add.values[2]
    assert plan.where[add.values[1]] != plan.where[add.values[2]]


def test_long_concat_is_split_across_kernels(tmp_path):
    # 1000 operands in one kernel were 8008 bytes of parameters; PTX 8.0 allows 4352.
    n = 1000
    ps = ", ".join(f"%x{i}: f32[2]" for i in range(n))
    ops = ", ".join(f"%x{i}" for i in range(n))
    m = one(f"func @f({ps}) -> f32[{2 * n}] {{\n  %y = concat {ops}, axis=0 : f32[{2 * n}]\n"
            f"  return %y\n}}")
    prog = cuda.build(m)
    launches = prog.plans["f"].launches
    assert len(launches) > 1
    assert [v for ln in launches for v in ln.values[1:]] == [f"x{i}" for i in range(n)]
    assert all(ln.values[0] == "y" for ln in launches)
    assemble(prog.ptx, tmp_path)


def test_a_map_of_more_operands_than_kernel_parameters_is_expanded(tmp_path):
    # 600 pointers are 4808 bytes of parameters, past PTX 8.0's 4352: ptxas refused the kernel
    n = 600
    ps = ", ".join(f"%x{i}: f32[8]" for i in range(n))
    terms = [f"${i}" for i in range(n)]
    while len(terms) > 1:
        terms = [f"add({a}, {b})" for a, b in zip(terms[::2], terms[1::2])] + terms[len(terms)
                                                                                & ~1:]
    ops = ", ".join(f"%x{i}" for i in range(n))
    m = one(f"func @f({ps}) -> f32[8] {{\n  %y = map {ops}, body={terms[0]} : f32[8]\n"
            f"  return %y\n}}")
    prog = cuda.build(m)
    assert all(len(ln.values) <= 3 for ln in prog.plans["f"].launches)
    assemble(prog.ptx, tmp_path)


def test_matmul_grid_past_65535_batches_or_row_tiles(tmp_path):
    m = one("""func @f(%a: f32[70000,2,3], %b: f32[70000,3,2], %c: f32[4200000,1], %d: f32[1,3])
        -> (f32[70000,2,2], f32[4200000,3]) {
  %y = matmul %a, %b : f32[70000,2,2]
  %z = matmul %c, %d : f32[4200000,3]
  return %y, %z
}""")
    prog = cuda.build(m)
    grids = [ln.kernel.grid for ln in prog.plans["f"].launches]
    assert all(g[1] <= 65535 and g[2] <= 65535 for g in grids)
    assemble(prog.ptx, tmp_path)


def test_axes_past_2_to_32_keep_64_bit_bounds():
    # A bound of 2^32 + 4 was truncated to 32 bits: the kernels covered 4 columns.
    n = 2**32 + 4
    m = one(f"""func @f(%a: f32[1,1], %b: f32[1,{n}], %x: bool[2,{n}])
        -> (f32[1,{n}], bool[{n},2]) {{
  %y = matmul %a, %b : f32[1,{n}]
  %t = transpose %x, perm=[1,0] : bool[{n},2]
  return %y, %t
}}""")
    ptx = cuda.emit_ptx(m)
    bounds = {int(v) for v in re.findall(r"setp\.[a-z]+\.u(?:32|64)\s+%p\d+, %r\w+, (\d+);", ptx)}
    assert n in bounds or n - 1 in bounds or 2 * n in bounds or 2 * n - 1 in bounds
    assert not bounds & {3, 4}
    assert "setp.lt.u32" not in kernel_text(ptx, "matmul")


# ---------------------------------------------------------------- errors


def test_gradient_declarations_are_refused():
    with pytest.raises(eqsat.Error, match="differentiate"):
        cuda.emit_ptx(eqsat.parse((EXAMPLES / "mlp.eqir").read_text()))


@pytest.mark.parametrize("arch", ["sm_60", "gfx90a"])
def test_bad_arch_is_an_error(arch):
    with pytest.raises(eqsat.Error, match="arch"):
        cuda.emit_ptx(example("mlp"), arch=arch)


@pytest.mark.parametrize("arch", ["sm_100", "sm_120", "sm_121"])
def test_newer_archs_get_their_ptx_version(arch):
    # PTX 8.0 for sm_100 made LLVM abort the whole process ("PTX version 8.0 does not
    # support target 'sm_100'"); LLVM runs in this process, so the check runs in another.
    code = ("from pathlib import Path; import eqsat; from eqsat.backend import cuda; "
            "m = eqsat.differentiate(eqsat.parse((Path(eqsat.__file__).parent / 'examples' / "
            f"'mlp.eqir').read_text())); "
            f"print(cuda.emit_ptx(m, arch={arch!r}).split('.address_size')[0])")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert f".target {arch}" in r.stdout


def test_unknown_newer_arch_is_an_error():
    with pytest.raises(eqsat.Error, match="arch"):
        cuda.emit_ptx(example("mlp"), arch="sm_95")


@pytest.mark.skipif(sys.platform != "linux", reason="fork")
def test_a_child_forked_while_ptx_is_emitted_can_emit_ptx():
    """Fork waits for the NVPTX emitter's lock: a child forked while another thread held it
    inherited it held by no thread of its own and hung on its first emit."""
    import os
    import signal
    import threading

    from eqsat.backend import nvptx_target

    m = one("func @f(%x: f32[8]) -> f32[8] {\n  %y = exp %x : f32[8]\n  return %y\n}")
    held = threading.Event()

    def hold():
        with nvptx_target._lock:  # as an emit in progress does
            held.set()
            threading.Event().wait(0.3)

    t = threading.Thread(target=hold)
    t.start()
    held.wait()
    pid = os.fork()
    if pid == 0:
        ok = False
        try:
            signal.alarm(60)
            ok = ".entry" in eqsat.emit(m, target="ptx")
        finally:
            os._exit(0 if ok else 1)
    t.join()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_call_tree_too_large_to_inline_is_refused_at_once():
    """Functions that each call the one before twice: the GPU code inlines every call (8 deep
    took 51 s to emit when each statement had a kernel of its own, 10 deep 95 s)."""
    import time

    t0 = time.perf_counter()
    with pytest.raises(eqsat.Error, match=r"@f16 with its calls inlined: 196,606 statements"):
        eqsat.emit(eqsat.parse(call_tree(17)), target="ptx")
    assert time.perf_counter() - t0 < 10
    assert ".entry" in eqsat.emit(eqsat.parse(call_tree(3)), target="ptx")


def test_a_statement_repeated_on_the_same_types_is_one_kernel():
    """Each statement had a kernel of its own: a 100-op chain and its gradient took 5.2 s of
    code generation and 2.6 MB of PTX, 500 ops 27 s; now 0.2 s for either."""
    m = eqsat.differentiate(eqsat.parse(long_chain(100)))
    flat = cuda.inline_calls(m, m["g"])
    distinct = {(s.op, repr(s.attrs), s.types) for s in flat.body if s.op != "reshape"}
    assert len(flat.body) > 250 and len(distinct) < 40
    assert eqsat.emit(m, target="ptx").count(".entry") <= len(distinct) + 1
