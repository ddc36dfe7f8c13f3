"""`make demo`: the whole pipeline on the bundled MLP.

Parse the example, generate its training step by adjoint code generation, optimize it with
equality saturation, compile it with llvmlite, and train on a synthetic data set made here
(a teacher network labels random inputs), comparing the step's speed with numpy.
"""

from __future__ import annotations

import statistics
import sys
import time
from importlib import resources

import numpy as np

import eqsat

STEPS = 100
LEARNING_RATE = 0.1


def synthetic_data(rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """Inputs and targets of the demo: a fixed random teacher MLP labels random inputs."""
    x = rng.standard_normal((128, 784)).astype(np.float32)
    w_true = (rng.standard_normal((784, 10)) / 28).astype(np.float32)
    b_true = rng.uniform(0.0, 0.5, 10).astype(np.float32)
    y = np.maximum(x @ w_true + b_true, 0).astype(np.float32)
    return x, y


def numpy_step(x, w, b, y):
    """The same training step written by hand in numpy: loss and gradients."""
    h = x @ w + b
    p = np.maximum(h, 0)
    d = p - y
    loss = (d * d).sum() * np.float32(0.00078125)
    dh = np.where(h > 0, 2 * np.float32(0.00078125) * d, 0).astype(np.float32)
    return loss, x.T @ dh, dh.sum(axis=0)


def median_seconds(fn, *args, repeat: int = 30) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def compare_seconds(a, b, *args, rounds: int = 5) -> tuple[float, float]:
    """The best of `rounds` medians of `a(*args)` and of `b(*args)`, the rounds interleaved:
    another process busy for a moment (which stalls numpy's BLAS threads for whole
    scheduler slices) then spoils a round of each, not one side's only measurement."""
    ta, tb = [], []
    for _ in range(rounds):
        ta.append(median_seconds(a, *args))
        tb.append(median_seconds(b, *args))
    return min(ta), min(tb)


def main() -> int:
    say = print
    text = resources.files("eqsat.examples").joinpath("mlp.eqir").read_text()
    text += "\nfunc @train_step = value_and_grad @loss wrt %w, %b\n"
    module = eqsat.parse(text, source="mlp.eqir")
    say("== 1. the program (eqsat/examples/mlp.eqir), parsed and verified")
    say(text.strip())

    say("\n== 2. its adjoint, generated as ordinary IR (eqsat.differentiate)")
    expanded = eqsat.differentiate(module)
    say(str(expanded["train_step"]).strip())

    say("\n== 3. equality saturation and extraction (eqsat.optimize)")
    from eqsat.extract import optimize_with_report

    optimized, report = optimize_with_report(expanded, target="cpu")
    say(str(report).rstrip())

    say("\n== 4. code generation with llvmlite (eqsat.compile)")
    t = time.perf_counter()
    exe = eqsat.compile(optimized, optimize=False)
    say(f"compiled {len(optimized.functions)} functions in {time.perf_counter() - t:.2f} s")

    rng = np.random.default_rng(0)
    x, y = synthetic_data(rng)
    w = np.zeros((784, 10), np.float32)
    b = np.full(10, 0.1, np.float32)
    ref = eqsat.interpret(module, "train_step", x, w, b, y)
    got = exe.train_step(x, w, b, y)
    err = max(float(np.max(np.abs(r - g))) for r, g in zip(ref, got))
    say(f"compiled step vs reference interpreter: max abs difference {err:.2e}")

    say(f"\n== 5. training on synthetic data ({STEPS} steps of gradient descent)")
    for step in range(STEPS + 1):
        loss, gw, gb = exe.train_step(x, w, b, y)
        if step % 10 == 0:
            say(f"step {step:3d}  loss {float(loss):.5f}")
        w -= LEARNING_RATE * gw
        b -= LEARNING_RATE * gb

    say("\n== 6. speed of one training step (best of 5 interleaved medians)")
    t_numpy, t_eqsat = compare_seconds(numpy_step, exe.train_step, x, w, b, y)
    say(f"numpy by hand   {t_numpy * 1e6:9.1f} us")
    say(f"eqsat compiled  {t_eqsat * 1e6:9.1f} us   ({t_eqsat / t_numpy:.3g}x numpy's time, "
        f"{t_numpy / t_eqsat:.3g}x as fast)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
