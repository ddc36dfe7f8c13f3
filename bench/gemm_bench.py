"""Time eqsat's compiled f32 `matmul` (the generated GEMM, eqsat/backend/gemm.py) against
numpy's `a @ b` (its bundled OpenBLAS), interleaved in one process, medians of blocks:
`python bench/gemm_bench.py [--seconds S] [--blas]` (--blas: eqsat through the host BLAS)."""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np

# (batch, m, k, n): the MLP / transformer products, and batched attention scores.
SHAPES = [((), 256, 784, 1024), ((), 256, 1024, 1024), ((), 1024, 512, 512),
          ((), 1024, 512, 2048), ((), 1024, 2048, 512), ((64,), 128, 64, 128)]
PAUSE = 0.25  # seconds between blocks (see the loop)


def module_text(batch: tuple[int, ...], m: int, k: int, n: int) -> str:
    """An IR module with one f32 product."""
    def t(*s: int) -> str:
        return f"f32[{','.join(map(str, (*batch, *s)))}]"
    return (f"module @m\nfunc @f(%a: {t(m, k)}, %b: {t(k, n)}) -> {t(m, n)} {{\n"
            f"  %c = matmul %a, %b : {t(m, n)}\n  return %c\n}}")


def block_time(fn, reps: int, warm: int) -> float:
    """Mean seconds of one call over `reps` back-to-back calls, after `warm` untimed ones.
    Warming matters here: for ~20-30 ms after the process idled, eqsat's pool runs a product
    at about one core's speed (its workers sleep on semaphores; OpenBLAS's spin), so cold
    blocks of short products measure the wake-up, not the GEMM (see --warm 0)."""
    for _ in range(warm):
        fn()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - start) / reps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=2.0, help="timing budget per shape")
    ap.add_argument("--blas", action="store_true", help="eqsat through the host BLAS instead")
    ap.add_argument("--pause", type=float, default=PAUSE, help="seconds between blocks")
    ap.add_argument("--warm", type=float, default=0.05,
                    help="seconds of untimed calls before each block (both contestants)")
    args = ap.parse_args()
    os.environ["EQSAT_GEMM"] = "0" if args.blas else "all"
    os.environ["EQSAT_CACHE_DIR"] = tempfile.mkdtemp(prefix="gemm_bench_")
    import eqsat
    from eqsat.ir import parse

    print(f"load average: {os.getloadavg()}; eqsat via {'BLAS' if args.blas else 'gemm.py'}; "
          f"{args.warm:g} s warm-up, {args.pause:g} s pause per block")
    print(f"{'shape (batch m k n)':<24} {'numpy GF/s':>10} {'eqsat GF/s':>10} {'ratio':>6}   "
          f"{'best: np':>8} {'eqsat':>8}")
    rng = np.random.default_rng(0)
    for batch, m, k, n in SHAPES:
        exe = eqsat.compile(parse(module_text(batch, m, k, n)), optimize=False)
        a = rng.standard_normal((*batch, m, k)).astype(np.float32)
        b = rng.standard_normal((*batch, k, n)).astype(np.float32)
        want = a.astype(np.float64) @ b
        err = np.abs(exe("f", a, b) - want).max() / (np.abs(want).max() + 1e-30)
        assert err < 1e-4, f"wrong product: relative error {err}"
        ours, theirs = (lambda: exe("f", a, b)), (lambda: a @ b)
        one = block_time(ours, 3, 1)
        reps = max(1, int(0.03 / one))  # blocks of ~30 ms, alternating
        warm = int(args.warm / one + 0.5)
        t_ours, t_np = [], []
        deadline = time.perf_counter() + args.seconds
        while time.perf_counter() < deadline or len(t_ours) < 5:
            t_np.append(block_time(theirs, reps, warm))
            # OpenBLAS's idle workers spin for ~0.1 s of CPU after a product (measured): let
            # them go to sleep, so they do not take a core from eqsat's next block.
            time.sleep(args.pause)
            t_ours.append(block_time(ours, reps, warm))
            time.sleep(args.pause)
        flop = 2 * int(np.prod(batch or (1,))) * m * n * k
        gn, ge = flop / np.median(t_np) / 1e9, flop / np.median(t_ours) / 1e9
        bn, be = flop / min(t_np) / 1e9, flop / min(t_ours) / 1e9
        label = "x".join(map(str, (*batch, m, k, n)))
        print(f"{label:<24} {gn:10.1f} {ge:10.1f} {ge / gn:6.2f}   {bn:8.1f} {be:8.1f}",
              flush=True)
    print(f"load average: {os.getloadavg()}")


if __name__ == "__main__":
    main()
