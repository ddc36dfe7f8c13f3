"""Run the benchmark suite: `python bench/run.py [--quick] [--only NAME ...] [--no-compile]`.

Every workload runs against numpy eager (and jax.jit, torch eager and torch.compile when
installed) in one process, interleaved; the table shows medians, the ratio time / numpy, and
compile times (on first use, cold and from the disk cache, each in a fresh process; for peers
the first call). eqsat variants: `fused` is a hand-fused IR
module, `core` the plain core-op module, `opt` the core module through eqsat's optimizer.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402
import workloads  # noqa: E402


# The targets (time / numpy eager, measured on the issue writer's machine).
TARGETS = {"elementwise": 0.11, "softmax": 0.095, "layernorm": 0.064, "mlp_fwd": 0.86,
           "train_step": 0.90, "transformer": 0.25}


def _summary_row(name: str, med: dict[str, float]) -> str:
    """One line: eqsat opt's ratio, the best peer's, the target, and whether eqsat is ahead."""
    base = med["numpy"]
    ours = med.get("eqsat opt", med.get("eqsat core"))
    peers = {k: v for k, v in med.items() if not k.startswith("eqsat") and k != "numpy"}
    line = f"  {name:<12} eqsat {ours / base:6.3f}" if ours else f"  {name:<12} eqsat      -"
    if peers:
        best = min(peers, key=peers.__getitem__)
        line += f"   best peer {best} {peers[best] / base:6.3f}"
        line += f" ({'eqsat faster' if ours and ours < peers[best] else 'peer faster'})"
    return line + f"   target {TARGETS.get(name, float('nan')):.3f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="shorter timing, no compile timing")
    ap.add_argument("--only", nargs="*", help="workload names to run")
    ap.add_argument("--no-compile", action="store_true", help="skip compile-time measurement")
    ap.add_argument("--seconds", type=float, default=None, help="timing budget per workload")
    ap.add_argument("--no-torch-compile", action="store_true",
                    help="skip torch.compile (its first call compiles for seconds)")
    args = ap.parse_args()
    seconds = args.seconds or (1.5 if args.quick else 6.0)
    rng = np.random.default_rng(0)
    peers = harness.peers()
    print(f"load average at start: {harness.load_average()}; peers: "
          f"{', '.join(peers) or 'none installed'}")
    header = f"{'workload':<12} {'contestant':<14} {'median ms':>10} {'/ numpy':>8} " \
             f"{'cpu ms':>8} {'/ numpy':>8} {'max rel err':>11} {'compile s (first / cold / cached)':>33}"
    print(header)
    print("-" * len(header))
    summary: list[str] = []
    for w in workloads.WORKLOADS:
        if args.only and w.name not in args.only:
            continue
        inputs = w.make_inputs(rng)
        want = w.numpy(*inputs)
        fns = {"numpy": lambda w=w: w.numpy(*inputs)}
        errors: dict[str, float] = {}
        compiles: dict[str, str] = {}
        variants = [(v, v, False) for v in w.modules]
        if "core" in w.modules:
            variants.append(("opt", "core", True))
        for label, variant, optimize in variants:
            exe = harness.compile_here(harness.prepare(w.modules[variant](), optimize))
            fns[f"eqsat {label}"] = lambda exe=exe, w=w: exe(w.func, *inputs)
            errors[f"eqsat {label}"] = harness.max_rel_error(exe(w.func, *inputs), want)
            if not (args.quick or args.no_compile):
                first, cold, cached = harness.compile_times(w.name, variant, optimize)
                compiles[f"eqsat {label}"] = f"{first:.2f} / {cold:.2f} / {cached:.2f}"
        if "jax" in peers and w.jax is not None:
            jax, jnp = peers["jax"]
            jf = jax.jit(w.jax(jnp))
            jin = [jnp.asarray(a) for a in inputs]
            fns["jax.jit"] = lambda jf=jf, jin=jin: jax.block_until_ready(jf(*jin))
            compiles["jax.jit"] = f"{harness.first_call_seconds(fns['jax.jit']):.2f} / - / -"
        if "torch" in peers and w.torch is not None:
            torch = peers["torch"]
            tf = w.torch(torch)
            tin = [torch.from_numpy(a) for a in inputs]
            fns["torch eager"] = lambda tf=tf, tin=tin: tf(*tin)
            if not args.no_torch_compile:
                tc = torch.compile(w.torch(torch))
                fns["torch.compile"] = lambda tc=tc, tin=tin: tc(*tin)
                compiles["torch.compile"] = \
                    f"{harness.first_call_seconds(fns['torch.compile']):.2f} / - / -"
        med, cpu = harness.interleaved_medians(fns, seconds)
        base, cbase = med["numpy"], cpu["numpy"]
        for name, t in med.items():
            err = f"{errors[name]:.1e}" if name in errors else ""
            c = cpu[name]
            print(f"{w.name:<12} {name:<14} {t * 1e3:>10.3f} {t / base:>8.3f} {c * 1e3:>8.2f} "
                  f"{c / cbase:>8.3f} {err:>11} {compiles.get(name, ''):>33}", flush=True)
        summary.append(_summary_row(w.name, med))
    print("\nsummary (wall-time ratios to numpy; target: the issue's 'must reach' ratio)")
    for row in summary:
        print(row)
    print(f"load average at end: {harness.load_average()}")


if __name__ == "__main__":
    main()
