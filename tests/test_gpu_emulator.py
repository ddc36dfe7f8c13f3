"""The CPU emulator of CUDA kernels (`gpu_emulator`) behaves like the hardware where the
backend relies on it (barriers, warp shuffles) and fails loudly, naming the kernel and the
block, where a kernel is wrong in ways that results alone might not show."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from llvmlite import ir

import eqsat
from eqsat.backend import nvptx_target as T
from eqsat.backend.nvptx_kernels import GpuKernel, GpuKernelBuilder
from eqsat.backend.scalar import I32
from eqsat.ir import DType

from gpu_emulator import (Deadlock, EmulatedCuda, EmulatorError, HostKernels,
                          UnknownIntrinsic, jit_unavailable)

_UNAVAILABLE = jit_unavailable()
pytestmark = pytest.mark.skipif(_UNAVAILABLE is not None, reason=str(_UNAVAILABLE))


def kernel(body: Callable[[ir.IRBuilder, ir.Value], None], threads: int = 64
           ) -> tuple[HostKernels, GpuKernel, np.ndarray]:
    """A hand-built kernel `k1_bad(i32* out)` with the test's `body(b, out)`, launched as two
    blocks of `threads`, and a buffer for its output."""
    llmod = T.new_module("bad")
    fn, b, (out,), _ = GpuKernelBuilder(llmod).function("bad", [DType.i32], [])
    body(b, out)
    b.ret_void()
    return HostKernels(llmod), GpuKernel(fn.name, (2, 1, 1), (threads, 1, 1)), \
        np.zeros(threads, np.int32)


def test_shuffles_and_barriers_match_the_hardware():
    def body(b, out):
        lane = T.tid(b)
        T.barrier(b)
        got = T.shfl_down(b, b.mul(lane, ir.Constant(I32, 10)), 3)
        b.store(got, b.gep(out, [lane]))

    kernels, k, buffer = kernel(body)
    kernels.launch(k, [buffer.ctypes.data])
    lane = np.arange(64)
    # shfl.sync.down with clamp 0x1f: lanes past the warp's end keep their own value.
    np.testing.assert_array_equal(buffer, np.where(lane % 32 < 29, lane + 3, lane) * 10)


def test_a_barrier_some_threads_skip_is_a_deadlock():
    def body(b, out):
        with b.if_then(b.icmp_unsigned("<", T.tid(b), ir.Constant(I32, 16))):
            T.barrier(b)

    kernels, k, buffer = kernel(body)
    with pytest.raises(Deadlock, match=r"kernel k1_bad .*block \(0, 0, 0\).*barrier"):
        kernels.launch(k, [buffer.ctypes.data])


def test_a_shuffle_part_of_a_warp_skips_is_a_deadlock():
    def body(b, out):
        with b.if_then(b.icmp_unsigned("<", T.tid(b), ir.Constant(I32, 8))):
            b.store(T.shfl_down(b, T.tid(b), 1), out)

    kernels, k, buffer = kernel(body, threads=32)
    with pytest.raises(Deadlock, match=r"kernel k1_bad .*block \(0, 0, 0\).*warp 0"):
        kernels.launch(k, [buffer.ctypes.data])


def test_unknown_intrinsics_are_named():
    def body(b, out):
        fn = ir.Function(b.module, ir.FunctionType(I32, []), "llvm.nvvm.read.ptx.sreg.laneid")
        b.store(b.call(fn, []), out)

    with pytest.raises(UnknownIntrinsic, match=r"llvm\.nvvm\.read\.ptx\.sreg\.laneid"):
        kernel(body)


def test_external_functions_are_unknown_intrinsics_too():
    def body(b, out):
        fn = ir.Function(b.module, ir.FunctionType(I32, [I32]), "abs")
        b.store(b.call(fn, [T.tid(b)]), out)

    with pytest.raises(UnknownIntrinsic, match="abs"):
        kernel(body)


NEG64 = """module @t
func @f(%x: f32[64]) -> f32[64] {
  %y = neg %x : f32[64]
  return %y
}"""


def test_a_write_outside_the_arena_is_caught():
    emu = EmulatedCuda(eqsat.parse(NEG64))
    plan = emu.plans["f"]
    assert plan.where["y"][0] == "arena"
    plan.where["y"] = ("arena", plan.arena_bytes - 128)  # half of %y past the arena's end
    with pytest.raises(EmulatorError, match=r"k1_neg .*wrote outside the arena of @f"):
        emu.f(np.ones(64, np.float32))


def test_an_unwritten_element_is_poison():
    emu = EmulatedCuda(eqsat.parse(NEG64))
    emu.plans["f"].launches.clear()  # nothing computes %y
    assert np.isnan(emu.f(np.ones(64, np.float32))).all()
