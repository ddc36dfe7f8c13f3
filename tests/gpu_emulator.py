"""Run the CUDA backend's kernels on the CPU, so that their logic is tested without a GPU.

The NVPTX LLVM IR that `eqsat.backend.cuda` builds is retargeted to the host (the triple, data
layout, address spaces and `ptx_kernel` calling convention dropped) and JIT-compiled with
llvmlite. Every `llvm.nvvm.*` intrinsic the backend emits becomes a call into Python:
special registers read the calling thread's coordinates, `barrier0` is a block-wide rendezvous
and `shfl.sync.down` a warp-wide exchange. A block runs with one OS thread per GPU thread when
its kernel synchronizes, and one thread after another on the calling thread when it does not
(any order is a valid schedule for a kernel without barriers or shuffles); blocks run one
after another. The same launch plans as `CudaExecutable` place the values in one arena per
call, which starts filled with 0xFF bytes (NaN, -1) and is fenced by guard bytes, so an
element no kernel writes and a write outside the arena are both caught.

`EmulatedCuda(module)` is called like an executable: `emu("f", *arrays)` or `emu.f(*arrays)`.
"""

from __future__ import annotations

import ctypes
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import llvmlite.binding as llvm
import numpy as np
from llvmlite import ir

from eqsat.ad import differentiate
from eqsat.backend import cuda
from eqsat.backend import nvptx_target as T
from eqsat.backend.nvptx_kernels import GpuKernel, GpuKernelBuilder
from eqsat.errors import UnknownFunction
from eqsat.ir.interpreter import check_inputs
from eqsat.ir.module import Module
from eqsat.ir.types import DType
from eqsat.ir.verifier import plain_module

POISON = 0xFF
GUARD = 256  # bytes of poison on each side of the arena
ALIGN = 64
WAIT_SECONDS = 60.0  # a rendezvous that waits this long is a hang the checks did not foresee


class EmulatorError(RuntimeError):
    """A kernel misbehaved under emulation (or used something the emulator does not know)."""


class Deadlock(EmulatorError):
    """Threads of a block can never all meet: some left the kernel, or a barrier or shuffle
    is reached by only some of the threads that must reach it."""


class UnknownIntrinsic(EmulatorError):
    """The kernels call an external function the emulator has no implementation for."""


# ---------------------------------------------------------------- rendezvous


class _Broken(Exception):
    """Raised inside a thread whose rendezvous can no longer complete."""


class _Rendezvous:
    """`size` threads meet, each bringing a value, and all leave with everyone's values.

    It is broken for good once a member thread leaves the kernel while others wait, or
    arrives after a member has left: neither can ever complete on a GPU either. Each waiter
    sleeps on a gate of its own that the last arrival opens (a shared condition variable
    woke every thread to fight over one lock, and ran ten times slower)."""

    def __init__(self, size: int, what: str):
        self.size, self.what = size, what
        self.lock = threading.Lock()
        self.gates = [threading.Lock() for _ in range(size)]
        for gate in self.gates:
            gate.acquire()
        self.waiting: list[threading.Lock] = []
        self.values: list[Any] = [None] * size
        self.done: list[Any] = []
        self.generation = self.left = 0
        self.broken: str | None = None

    def _break(self, why: str) -> None:
        if not self.broken:
            self.broken = why
        for gate in self.waiting:
            gate.release()
        self.waiting = []

    def meet(self, slot: int, value: Any = None) -> list[Any]:
        with self.lock:
            if self.left:
                self._break(f"a thread reached {self.what} after {self.left} had left the "
                            f"kernel")
            if self.broken:
                raise _Broken(self.broken)
            generation = self.generation
            self.values[slot] = value
            gate = self.gates[slot]
            self.waiting.append(gate)
            if len(self.waiting) == self.size:
                self.done, self.values = self.values, [None] * self.size
                self.generation += 1
                for other in self.waiting:
                    if other is not gate:
                        other.release()
                self.waiting = []
                return self.done
        if not gate.acquire(timeout=WAIT_SECONDS):
            with self.lock:
                if self.generation == generation:
                    self.waiting.remove(gate)
                    self._break(f"{self.what} waited {WAIT_SECONDS:.0f} s")
                    raise _Broken(self.broken)
            gate.acquire()  # opened just after the timeout: close it for the next meeting
        if self.generation == generation:
            raise _Broken(self.broken)
        return self.done

    def leave(self) -> None:
        """A member thread returned from the kernel."""
        with self.lock:
            self.left += 1
            if self.waiting:
                self._break(f"a thread left the kernel while {len(self.waiting)} of "
                            f"{self.size} waited at {self.what}")


@dataclass
class _Block:
    """One running block: its barrier, its warps' exchanges, and what went wrong in it."""

    size: int
    sync: bool
    barrier: _Rendezvous = field(init=False)
    warps: list[_Rendezvous] = field(init=False)
    errors: list[str] = field(default_factory=list)
    deadlocked: bool = False

    def __post_init__(self) -> None:
        self.barrier = _Rendezvous(self.size, "the block barrier (barrier0)")
        self.warps = [_Rendezvous(min(T.WARP, self.size - w * T.WARP), f"warp {w}'s shuffle")
                      for w in range(-(-self.size // T.WARP))]

    def fail(self, why: str, deadlock: bool = False) -> None:
        self.deadlocked |= deadlock
        if why not in self.errors:
            self.errors.append(why)


@dataclass
class _Thread:
    """The coordinates the special registers report to one emulated GPU thread."""

    tid: tuple[int, int, int]
    ntid: tuple[int, int, int]
    ctaid: tuple[int, int, int]
    nctaid: tuple[int, int, int]
    block: _Block

    @property
    def linear(self) -> int:
        (x, y, z), (bx, by, _) = self.tid, self.ntid
        return x + bx * (y + by * z)


_here = threading.local()


class _Workers:
    """Daemon threads kept for the whole process, as many as the largest block so far:
    starting 256 threads took longer than running most blocks on them."""

    def __init__(self) -> None:
        self.gates: list[threading.Lock] = []
        self.jobs: list[Callable[[], None]] = []
        self.lock = threading.Lock()  # one block at a time
        self.count = threading.Lock()
        self.finished = threading.Lock()
        self.remaining = 0

    def _work(self, k: int) -> None:
        while True:
            self.gates[k].acquire()
            try:
                self.jobs[k]()
            finally:
                with self.count:
                    self.remaining -= 1
                    if self.remaining == 0:
                        self.finished.release()

    def run(self, jobs: Sequence[Callable[[], None]]) -> None:
        """Run the jobs at once, one thread each, and return when all have returned."""
        if not jobs:
            return
        with self.lock:
            while len(self.gates) < len(jobs):
                gate = threading.Lock()
                gate.acquire()
                self.gates.append(gate)
                self.jobs.append(lambda: None)
                threading.Thread(target=self._work, args=(len(self.gates) - 1,),
                                 name=f"gpu-emulator-{len(self.gates) - 1}", daemon=True).start()
            self.remaining = len(jobs)
            self.finished.acquire()
            for k, job in enumerate(jobs):
                self.jobs[k] = job
                self.gates[k].release()
            self.finished.acquire()  # until the last job releases it
            self.finished.release()


_workers = _Workers()


# ---------------------------------------------------------------- the intrinsics


def _sreg(register: str, axis: int) -> Callable[[], int]:
    def read() -> int:
        return getattr(_here.thread, register)[axis]
    return read


def _barrier() -> None:
    thread: _Thread = _here.thread
    if not thread.block.sync:
        thread.block.fail("a kernel run without threads reached a barrier")
        return
    try:
        thread.block.barrier.meet(thread.linear)
    except _Broken as e:
        thread.block.fail(str(e), deadlock=True)


def _shfl_down(mask: int, value: Any, delta: int, clamp: int) -> Any:
    thread: _Thread = _here.thread
    block = thread.block
    warp, lane = divmod(thread.linear, T.WARP)
    exchange = block.warps[warp] if block.sync else None
    if exchange is None:
        block.fail("a kernel run without threads reached a warp shuffle")
        return value
    if mask & 0xFFFFFFFF != (1 << exchange.size) - 1 or clamp != T.WARP - 1:
        block.fail(f"shfl.sync.down with mask {mask & 0xFFFFFFFF:#x} and clamp {clamp:#x} in a "
                   f"warp of {exchange.size} threads: the emulator knows full warps, clamp 0x1f")
        return value
    try:
        values = exchange.meet(lane, value)
    except _Broken as e:
        block.fail(str(e), deadlock=True)
        return value
    return values[lane + delta] if lane + delta < exchange.size else value


_I32, _F32 = ctypes.c_int32, ctypes.c_float
_SHFL_TYPES = {"i32": _I32, "f32": _F32}


@dataclass(frozen=True)
class Intrinsic:
    """An `llvm.nvvm.*` function: the host symbol it becomes and its Python implementation."""

    nvvm: str
    restype: Any
    argtypes: tuple[Any, ...]
    impl: Callable[..., Any]

    @property
    def symbol(self) -> str:
        return "eqsat_emu_" + self.nvvm.removeprefix("llvm.nvvm.").replace(".", "_")


def _intrinsics() -> dict[str, Intrinsic]:
    table = [Intrinsic(f"llvm.nvvm.read.ptx.sreg.{reg}.{axis}", _I32, (), _sreg(reg, k))
             for reg in ("tid", "ntid", "ctaid", "nctaid") for k, axis in enumerate("xyz")]
    table.append(Intrinsic("llvm.nvvm.barrier0", None, (), _barrier))
    table += [Intrinsic(f"llvm.nvvm.shfl.sync.down.{name}", ty, (_I32, ty, _I32, _I32),
                        _shfl_down) for name, ty in _SHFL_TYPES.items()]
    return {i.nvvm: i for i in table}


INTRINSICS = _intrinsics()
SYNC_SYMBOLS = frozenset(i.symbol for i in INTRINSICS.values()
                         if "barrier" in i.nvvm or "shfl" in i.nvvm)
_callbacks: list[Any] = []  # the ctypes thunks must outlive every JIT-compiled caller


def _guarded(intrinsic: Intrinsic) -> Callable[..., Any]:
    """The implementation with its exceptions recorded on the block: ctypes would print and
    drop them, and the kernel would go on with a zero."""
    def call(*args: Any) -> Any:
        try:
            return intrinsic.impl(*args)
        except Exception as e:  # noqa: BLE001  (any emulator bug must fail the launch)
            _here.thread.block.fail(f"{intrinsic.nvvm} raised {e!r}")
            return None if intrinsic.restype is None else 0
    return call


def _register_intrinsics() -> None:
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    for intrinsic in INTRINSICS.values():
        thunk = ctypes.CFUNCTYPE(intrinsic.restype, *intrinsic.argtypes)(_guarded(intrinsic))
        _callbacks.append(thunk)
        llvm.add_symbol(intrinsic.symbol, ctypes.cast(thunk, ctypes.c_void_p).value)


_register_intrinsics()


# ---------------------------------------------------------------- retargeting and JIT

_NAME = r'@(?:"([^"]+)"|([\w.$]+))'


def host_ir(nvptx_ir: str) -> str:
    """NVPTX LLVM IR as host IR: intrinsics renamed to the emulator's symbols; raises
    UnknownIntrinsic naming every external function that is neither those nor `llvm.*`."""
    text = re.sub(r'^target (triple|datalayout) = ".*"$', "", nvptx_ir, flags=re.M)
    text = text.replace("ptx_kernel ", "")
    text = re.sub(r" addrspace\(\d+\)", "", text)
    declared = {a or b for a, b in re.findall(r"^declare [^@]*" + _NAME, text, flags=re.M)}
    unknown = sorted(d for d in declared
                     if d not in INTRINSICS and (d.startswith("llvm.nvvm.")
                                                 or not d.startswith("llvm.")))
    if unknown:
        raise UnknownIntrinsic(f"the kernels call {', '.join(unknown)}, which the emulator "
                               f"does not implement: add them to gpu_emulator.INTRINSICS")

    def rename(m: re.Match) -> str:
        name = m.group(1) or m.group(2)
        return f'@"{INTRINSICS[name].symbol}"' if name in INTRINSICS else m.group(0)

    return re.sub(_NAME, rename, text)


def _synchronizing(host_text: str) -> set[str]:
    """The functions of host IR that reach a barrier or a shuffle, directly or by calls."""
    bodies = dict(re.findall(r'^define [^@]*@"?([^"(]+)"?\((.*?)^}', host_text,
                             flags=re.M | re.S))
    calls = {f: {a or b for a, b in re.findall(r"call [^@]*" + _NAME, body)}
             for f, body in bodies.items()}
    sync = {f for f, called in calls.items() if called & SYNC_SYMBOLS}
    grown = True
    while grown:
        more = {f for f, called in calls.items() if called & sync} - sync
        sync |= more
        grown = bool(more)
    return sync


class HostKernels:
    """The kernels of one NVPTX llvmlite module, JIT-compiled for the host and launchable."""

    def __init__(self, module: ir.Module):
        text = host_ir(str(module))
        self.sync = _synchronizing(text)
        self._module = llvm.parse_assembly(text)
        self._module.verify()
        machine = llvm.Target.from_default_triple().create_target_machine()
        self._engine = llvm.create_mcjit_compiler(self._module, machine)
        self._engine.finalize_object()
        self._entries: dict[tuple[str, int], Any] = {}

    def _entry(self, name: str, arity: int) -> Any:
        key = (name, arity)
        if key not in self._entries:
            address = self._engine.get_function_address(name)
            if not address:
                raise EmulatorError(f"kernel {name} is not in the JIT-compiled module")
            proto = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * arity))
            self._entries[key] = proto(address)
        return self._entries[key]

    def launch(self, kernel: GpuKernel, pointers: Sequence[int]) -> None:
        """Run every block of `kernel` on the device addresses `pointers` (its parameters).
        Raises Deadlock or EmulatorError naming the kernel and the first failing block."""
        entry = self._entry(kernel.name, len(pointers))
        sync = kernel.name in self.sync
        gx, gy, gz = kernel.grid
        for cz in range(gz):
            for cy in range(gy):
                for cx in range(gx):
                    block = _Block(kernel.block[0] * kernel.block[1] * kernel.block[2], sync)
                    self._run_block(entry, pointers, kernel, (cx, cy, cz), block)
                    if block.errors:
                        kind = Deadlock if block.deadlocked else EmulatorError
                        raise kind(f"kernel {kernel.name} ({kernel.what}), block "
                                   f"{(cx, cy, cz)} of grid {kernel.grid}, block shape "
                                   f"{kernel.block}: {'; '.join(block.errors)}")

    @staticmethod
    def _run_block(entry: Any, pointers: Sequence[int], kernel: GpuKernel,
                   ctaid: tuple[int, int, int], block: _Block) -> None:
        bx, by, bz = kernel.block
        threads = [_Thread((x, y, z), kernel.block, ctaid, kernel.grid, block)
                   for z in range(bz) for y in range(by) for x in range(bx)]
        if not block.sync:
            for thread in threads:
                _here.thread = thread
                entry(*pointers)
            return

        def job(thread: _Thread) -> Callable[[], None]:
            def run() -> None:
                _here.thread = thread
                entry(*pointers)
                block.barrier.leave()
                block.warps[thread.linear // T.WARP].leave()
            return run

        _workers.run([job(t) for t in threads])


def jit_unavailable() -> str | None:
    """Why llvmlite cannot JIT-compile retargeted kernels on this machine, or None (tests
    skip with this reason rather than fail where the host JIT itself is missing)."""
    llmod = T.new_module("probe")
    _, b, (out,), _ = GpuKernelBuilder(llmod).function("probe", [DType.i32], [])
    b.store(T.tid(b), out)
    b.ret_void()
    try:
        HostKernels(llmod)
    except EmulatorError:
        raise
    except RuntimeError as e:  # llvmlite reports parse and JIT failures as RuntimeError
        return f"llvmlite cannot JIT the retargeted NVPTX IR here: {e}"
    return None


# ---------------------------------------------------------------- the executable


class EmulatedCuda:
    """A module compiled as `target="cuda"` would be (its launch plans, its kernels), run by
    the emulator: `emu("f", *arrays)` or `emu.f(*arrays)` returns numpy arrays, one result
    as an array and several as a tuple. Gradient declarations are expanded first."""

    def __init__(self, module: Module):
        module = plain_module(differentiate(module) if module.grad_decls else module,
                              "the GPU emulator")
        self.module = module
        llmod = T.new_module(module.name)
        builder = GpuKernelBuilder(llmod)
        self.plans = {f.name: cuda.plan_function(module, f, builder) for f in module.functions}
        self.kernels = HostKernels(llmod)

    @property
    def functions(self) -> tuple[str, ...]:
        """The names of the callable functions."""
        return tuple(self.plans)

    def launches(self, name: str) -> list[GpuKernel]:
        """The kernels one call of `name` launches, in order."""
        return [ln.kernel for ln in self.plans[name].launches]

    def __call__(self, name: str, *arrays: Any) -> np.ndarray | tuple[np.ndarray, ...]:
        """Run function `name` on numpy arrays."""
        plan = self.plans.get(name)
        if plan is None:
            raise UnknownFunction.among("the emulated executable", name, self.plans)
        args = check_inputs(plan.func, arrays)
        memory = np.full(GUARD + plan.arena_bytes + GUARD + ALIGN, POISON, np.uint8)
        start = GUARD + (-(memory.ctypes.data + GUARD) % ALIGN)
        arena = memory[start: start + plan.arena_bytes]
        for at, a in zip(plan.param_at, args):
            a = np.ascontiguousarray(a)
            arena[at: at + a.nbytes] = a.reshape(-1).view(np.uint8)

        def offset(v: str) -> int:
            kind, k = plan.where[v]
            return plan.param_at[k] if kind == "in" else k

        for ln in plan.launches:
            self.kernels.launch(ln.kernel, [arena.ctypes.data + offset(v) for v in ln.values])
            outside = np.concatenate([memory[:start], memory[start + plan.arena_bytes:]])
            if (outside != POISON).any():
                raise EmulatorError(f"kernel {ln.kernel.name} ({ln.kernel.what}) wrote outside "
                                    f"the arena of @{name}")
        results = []
        for v, t in zip(plan.func.returns, plan.func.result_types):
            raw = arena[offset(v): offset(v) + t.nbytes]
            if t.dtype.np == np.bool_ and (raw > 1).any():
                raise EmulatorError(f"result %{v} of @{name} ({t}) has bytes that are neither "
                                    f"0 nor 1: no kernel wrote them")
            results.append(raw.view(t.dtype.np).reshape(t.shape).copy())
        return results[0] if len(results) == 1 else tuple(results)

    run = __call__

    def __getattr__(self, name: str) -> Callable[..., np.ndarray | tuple[np.ndarray, ...]]:
        if name.startswith("_") or name not in self.__dict__.get("plans", {}):
            raise AttributeError(name)
        return lambda *arrays: self(name, *arrays)
