"""Counting which big-data paths the CPU backend takes while it lowers modules (by wrapping
its internal hooks for the duration of a `with` block): evidence that the large-shape fuzzing
reaches them."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def count_paths() -> Iterator[Counter]:
    """Count, while active, the big-data paths the CPU backend takes when it lowers modules:
    packed GEMM, host BLAS, loop products, narrow and small products, in-place views, chunked groups, shared reductions,
    streamed outputs, threaded kernels, reused arena blocks."""
    from eqsat.backend import entry, gemm, llvm_kernels, matmul_kernels, parallel
    hits: Counter = Counter()
    saved: list[tuple[object, str, object]] = []

    def wrap(owner: object, attr: str, after: Callable[..., None]) -> None:
        orig = getattr(owner, attr)
        saved.append((owner, attr, orig))

        def hooked(*a, **kw):
            out = orig(*a, **kw)
            after(out, *a, **kw)
            return out
        setattr(owner, attr, hooked)

    def tally(key: str) -> Callable[..., None]:
        return lambda *_a, **_k: hits.update([key])

    wrap(gemm, "gemm_matmul", tally("packed_gemm"))
    wrap(matmul_kernels, "_blas_matmul", tally("blas"))
    wrap(matmul_kernels, "_loop_matmul", tally("loop_matmul"))
    wrap(matmul_kernels, "narrow_matmul", tally("narrow_matmul"))
    wrap(entry, "matmul_viewed", tally("in_place_view"))
    wrap(entry, "group_kernel", tally("chunked_group"))
    wrap(entry, "find_shares", lambda out, *a: hits.update(["shared_reduction"] * (len(out) // 2)))
    wrap(llvm_kernels.KernelBuilder, "streams",
         lambda out, *a: hits.update(["streamed"] if out else []))

    def threaded(out, b, kernel, *a):
        if min(parallel.THREADS, kernel.extent) >= 2 and kernel.work >= parallel.PARALLEL_MIN_WORK:
            hits.update(["threaded"])
    wrap(entry, "emit_kernel_call", threaded)
    orig_take = entry.Arena.take

    def take(self, nbytes):
        top = self.top
        off = orig_take(self, nbytes)
        if nbytes > entry.KEEP_SMALL and off + nbytes <= top:
            hits.update(["arena_reuse"])
        return off
    saved.append((entry.Arena, "take", orig_take))
    entry.Arena.take = take
    try:
        yield hits
    finally:
        for owner, attr, orig in reversed(saved):
            setattr(owner, attr, orig)
