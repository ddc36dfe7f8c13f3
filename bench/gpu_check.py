"""GPU check: run the gpu tests, then time the benchmark workloads on the GPU against cupy or
torch (whichever is installed), reporting achieved bandwidth against a measured device copy.

    python bench/gpu_check.py [--skip-tests] [--repeat N]

Without a GPU (or without cuda-bindings) it says so and exits 0. Meant to finish in well under
5 minutes on an H100/H200.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import eqsat  # noqa: E402
from eqsat.ad import differentiate  # noqa: E402
from eqsat.backend import cuda, cuda_runtime  # noqa: E402

N = 4 * 1024 * 1024
ROWS, COLS = 4096, 1024

WORKLOADS = {
    "elementwise chain 4M": f"""
func @f(%x: f32[{N}], %y: f32[{N}], %z: f32[{N}]) -> f32[{N}] {{
  %a = mul %x, %y : f32[{N}]
  %b = add %a, %z : f32[{N}]
  %c = tanh %b : f32[{N}]
  %d = mul %c, %x : f32[{N}]
  return %d
}}""",
    f"softmax {ROWS}x{COLS}": f"""
func @f(%x: f32[{ROWS},{COLS}]) -> f32[{ROWS},{COLS}] {{
  %m = max %x, axes=[1] : f32[{ROWS}]
  %m2 = reshape %m : f32[{ROWS},1]
  %mb = broadcast %m2 : f32[{ROWS},{COLS}]
  %s = sub %x, %mb : f32[{ROWS},{COLS}]
  %e = exp %s : f32[{ROWS},{COLS}]
  %t = sum %e, axes=[1] : f32[{ROWS}]
  %t2 = reshape %t : f32[{ROWS},1]
  %tb = broadcast %t2 : f32[{ROWS},{COLS}]
  %y = div %e, %tb : f32[{ROWS},{COLS}]
  return %y
}}""",
    f"layernorm {ROWS}x{COLS}": f"""
func @f(%x: f32[{ROWS},{COLS}], %g: f32[{COLS}], %b: f32[{COLS}]) -> f32[{ROWS},{COLS}] {{
  %s = sum %x, axes=[1] : f32[{ROWS}]
  %s2 = reshape %s : f32[{ROWS},1]
  %n = const {1.0 / COLS!r} : f32[{ROWS},1]
  %mu = mul %s2, %n : f32[{ROWS},1]
  %mub = broadcast %mu : f32[{ROWS},{COLS}]
  %d = sub %x, %mub : f32[{ROWS},{COLS}]
  %q = mul %d, %d : f32[{ROWS},{COLS}]
  %v = sum %q, axes=[1] : f32[{ROWS}]
  %v2 = reshape %v : f32[{ROWS},1]
  %var = mul %v2, %n : f32[{ROWS},1]
  %eps = const 1e-05 : f32[{ROWS},1]
  %ve = add %var, %eps : f32[{ROWS},1]
  %r = rsqrt %ve : f32[{ROWS},1]
  %rb = broadcast %r : f32[{ROWS},{COLS}]
  %xn = mul %d, %rb : f32[{ROWS},{COLS}]
  %gb = broadcast %g : f32[{ROWS},{COLS}]
  %bb = broadcast %b : f32[{ROWS},{COLS}]
  %y0 = mul %xn, %gb : f32[{ROWS},{COLS}]
  %y = add %y0, %bb : f32[{ROWS},{COLS}]
  return %y
}}""",
}


def modules() -> dict[str, tuple[eqsat.Module, str]]:
    """name -> (module, function to time)."""
    out = {name: (eqsat.parse("module @bench\n" + text), "f") for name, text in WORKLOADS.items()}
    ex = Path(eqsat.__file__).parent / "examples"
    out["MLP forward (128x784x10)"] = (differentiate(eqsat.parse((ex / "mlp.eqir").read_text())),
                                       "predict")
    out["transformer block (128x512)"] = (eqsat.parse((ex / "transformer.eqir").read_text()),
                                          "encoder_block")
    return out


def optimized(m: eqsat.Module) -> eqsat.Module:
    """The module after eqsat's optimizer for the cuda target, where it is available."""
    try:
        from eqsat.extract import optimize
        from eqsat.rules.runner import Limits
        return optimize(m, target="cuda", limits=Limits(seconds=10.0))
    except Exception as e:  # noqa: BLE001  (report and time the unoptimized program)
        print(f"  (optimize unavailable: {type(e).__name__}: {str(e)[:80]}; timing as written)")
        return m


def copy_bandwidth() -> float:
    """Bytes per second of a 512 MiB device-to-device copy (read + write counted)."""
    drv = cuda_runtime._driver()
    nbytes = 512 << 20
    a, b = cuda_runtime.DeviceBuffer(nbytes), cuda_runtime.DeviceBuffer(nbytes)
    times = []
    for _ in range(10):
        cuda_runtime.synchronize()
        t0 = time.perf_counter()
        drv.cuMemcpyDtoD(b.ptr, a.ptr, nbytes)
        cuda_runtime.synchronize()
        times.append(time.perf_counter() - t0)
    return 2 * nbytes / float(np.median(times))


def reference_timer():
    """(library name, fn(name, numpy args) -> seconds) for cupy or torch, or None."""
    try:
        import torch
        if torch.cuda.is_available():
            return "torch", lambda name, args: _time_torch(torch, name, args)
    except ImportError:
        pass
    try:
        import cupy
        return "cupy", lambda name, args: _time_cupy(cupy, name, args)
    except ImportError:
        return None


def _reference_fn(xp, name: str):
    """The workload written with an array library's ops (xp: torch or cupy namespace)."""
    def softmax(x):
        e = xp.exp(x - x.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    def layernorm(x, g, b):
        mu = x.mean(1, keepdims=True)
        d = x - mu
        return d / xp.sqrt((d * d).mean(1, keepdims=True) + 1e-5) * g + b

    if name.startswith("elementwise"):
        return lambda x, y, z: xp.tanh(x * y + z) * x
    if name.startswith("softmax"):
        return softmax
    if name.startswith("layernorm"):
        return layernorm
    if name.startswith("MLP"):
        return lambda x, w, b: xp.maximum(x @ w + b, 0 * b)
    return None


def _time_torch(torch, name, args):
    fn = _reference_fn(torch, name)
    if fn is None:
        return None
    dev = [torch.from_numpy(a).cuda() for a in args]
    if name.startswith("softmax") or name.startswith("layernorm"):
        dev_fn = {"softmax": lambda x: torch.softmax(x, 1),
                  "layernorm": lambda x, g, b: torch.nn.functional.layer_norm(
                      x, (x.shape[1],), g, b, 1e-5)}[name.split()[0]]
    else:
        dev_fn = fn
    return _median(lambda: dev_fn(*dev), torch.cuda.synchronize)


def _time_cupy(cupy, name, args):
    fn = _reference_fn(cupy, name)
    if fn is None:
        return None
    dev = [cupy.asarray(a) for a in args]
    return _median(lambda: fn(*dev), cupy.cuda.Device().synchronize)


def _median(run, sync, repeat: int = 20) -> float:
    run()
    times = []
    for _ in range(repeat):
        sync()
        t0 = time.perf_counter()
        run()
        sync()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-tests", action="store_true")
    ap.add_argument("--repeat", type=int, default=20)
    opts = ap.parse_args()
    reason = cuda_runtime.gpu_unavailable()
    if reason is not None:
        print(f"gpu_check: no GPU here ({reason}); nothing to run.")
        return 0
    status = 0
    if not opts.skip_tests:
        print("== gpu tests (pytest -m gpu)")
        r = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p",
                            "no:cacheprovider", str(ROOT / "tests" / "test_cuda.py")],
                           cwd=ROOT, timeout=200)
        status = r.returncode
    copy = copy_bandwidth()
    print(f"\n== device copy bandwidth: {copy / 1e9:.0f} GB/s")
    ref = reference_timer()
    ref_name = ref[0] if ref else "none"
    print(f"{'workload':32} {'eqsat ms':>9} {'GB/s':>7} {'% copy':>7} {ref_name + ' ms':>10}")
    rng = np.random.default_rng(0)
    for name, (m, fname) in modules().items():
        m = optimized(m)
        exe = cuda.compile_module(m)
        f = m[fname]
        args = [(0.1 * rng.standard_normal(p.type.shape)).astype(p.type.dtype.np)
                for p in f.params]
        got = exe(fname, *args)
        want = eqsat.interpret(m, fname, *args)
        ok = all(np.allclose(g, w, rtol=2e-3, atol=1e-4) for g, w in
                 zip(got if isinstance(got, tuple) else (got,),
                     want if isinstance(want, tuple) else (want,)))
        seconds = exe.time_launches(fname, *args, repeat=opts.repeat)
        nbytes = sum(p.type.nbytes for p in f.params) + sum(t.nbytes for t in f.result_types)
        ref_s = ref[1](name, args) if ref else None
        ref_txt = f"{ref_s * 1e3:10.3f}" if ref_s else f"{'-':>10}"
        print(f"{name:32} {seconds * 1e3:9.3f} {nbytes / seconds / 1e9:7.0f} "
              f"{100 * nbytes / seconds / copy:6.0f}% {ref_txt}{'' if ok else '  MISMATCH'}")
        status = status or (0 if ok else 1)
    return status


if __name__ == "__main__":
    sys.exit(main())
