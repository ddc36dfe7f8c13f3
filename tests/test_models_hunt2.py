"""Models as an ML engineer writes them with the staged DSL, through the whole user path:
trace, value_and_grad, optimize (bounded), compile with and without optimization, run; values
against numpy written independently, f64 gradients against central differences.

One module per model holds an f32 copy (checked against numpy at f32 tolerance) and an f64
copy with its value_and_grad (checked against central differences), so one optimize covers
both dtypes in one e-graph."""

from __future__ import annotations  # every annotation a string: the factories' dt and sizes

import math
import warnings

import numpy as np
import pytest

import eqsat
from ad_helpers import central_differences

LIMITS = eqsat.Limits(seconds=0.4)
F32 = dict(rtol=2e-4, atol=2e-5)


def _sig(v: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-v))


def _softmax(s: np.ndarray) -> np.ndarray:
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def causal_attention(dt, B=2, T=5, D=4, H=2):
    """Multi-head self-attention with a causal mask built by np.triu, then a projection."""
    hd = D // H

    @eqsat.function
    def attention(x: dt[B, T, D], wq: dt[D, D], wk: dt[D, D], wv: dt[D, D], wo: dt[D, D],
                  r: dt[B, T, D]):
        def heads(w):
            return (x @ w).reshape(B, T, H, hd).transpose(0, 2, 1, 3)
        s = heads(wq) @ heads(wk).transpose(0, 1, 3, 2) * (1.0 / math.sqrt(hd))
        s = np.where(np.triu(np.ones_like(s, dtype=bool), 1), -np.inf, s)
        o = (eqsat.softmax(s, axis=-1) @ heads(wv)).transpose(0, 2, 1, 3).reshape(B, T, D)
        return ((o @ wo) * r).sum()

    def ref(x, wq, wk, wv, wo, r):
        def heads(w):
            return (x @ w).reshape(B, T, H, hd).transpose(0, 2, 1, 3)
        s = heads(wq) @ heads(wk).transpose(0, 1, 3, 2) * (1.0 / math.sqrt(hd))
        s = np.where(np.triu(np.ones((T, T), bool), 1), -np.inf, s)
        o = (_softmax(s) @ heads(wv)).transpose(0, 2, 1, 3).reshape(B, T, D)
        return ((o @ wo) * r).sum()

    shapes = [(B, T, D)] + [(D, D)] * 4 + [(B, T, D)]
    return attention, ref, shapes, [0.5] * 5 + [1.0], {}


def lstm(dt, B=3, S=4, I=2, Hh=3):
    """An LSTM cell as its own traced function, called over S steps; a cross-entropy on the
    last state with integer labels compared against a class row (an int mask)."""

    @eqsat.function
    def cell(x: dt[B, I], h: dt[B, Hh], c: dt[B, Hh], wx: dt[I, 4 * Hh], wh: dt[Hh, 4 * Hh],
             b: dt[4 * Hh]):
        g = x @ wx + h @ wh + b
        c = eqsat.sigmoid(g[:, Hh:2 * Hh]) * c + eqsat.sigmoid(g[:, :Hh]) * np.tanh(g[:, 3 * Hh:])
        return eqsat.sigmoid(g[:, 2 * Hh:3 * Hh]) * np.tanh(c), c

    @eqsat.function
    def lstm_loss(xs: dt[S, B, I], h0: dt[B, Hh], wx: dt[I, 4 * Hh], wh: dt[Hh, 4 * Hh],
                  b: dt[4 * Hh], wy: dt[Hh, 3], y: eqsat.i32[B], classes: eqsat.i32[3]):
        h, c = h0, np.zeros_like(h0)
        for t in range(S):
            h, c = cell(xs[t], h, c, wx, wh, b)
        logits = h @ wy
        onehot = (y[:, None] == classes[None, :]).astype(logits.dtype)
        return -np.mean(np.sum(onehot * (logits - eqsat.logsumexp(logits, axis=1, keepdims=True)),
                               axis=1))

    def ref(xs, h0, wx, wh, b, wy, y, classes):
        h, c = h0, np.zeros_like(h0)
        for t in range(S):
            g = xs[t] @ wx + h @ wh + b
            c = _sig(g[:, Hh:2 * Hh]) * c + _sig(g[:, :Hh]) * np.tanh(g[:, 3 * Hh:])
            h = _sig(g[:, 2 * Hh:3 * Hh]) * np.tanh(c)
        logits = h @ wy
        logp = logits - logits.max(1, keepdims=True)
        logp = logp - np.log(np.exp(logp).sum(1, keepdims=True))
        return -np.mean(np.sum((y[:, None] == classes[None, :]) * logp, axis=1))

    ints = {6: lambda rng, _: rng.integers(0, 3, B).astype(np.int32),
            7: lambda rng, _: np.arange(3, dtype=np.int32)}
    shapes = [(S, B, I), (B, Hh), (I, 4 * Hh), (Hh, 4 * Hh), (4 * Hh,), (Hh, 3), None, None]
    return lstm_loss, ref, shapes, [1.0, 0.3, 0.7, 0.5, 0.1, 0.7, 0, 0], ints


def vae(dt, B=3, X=5, Hd=4, Z=2):
    """A VAE with the reparameterized sample passed in: Bernoulli reconstruction written with
    log1p (stable BCE with logits) plus the Gaussian KL term."""

    @eqsat.function
    def vae_loss(x: dt[B, X], eps: dt[B, Z], we: dt[X, Hd], wmu: dt[Hd, Z], wlv: dt[Hd, Z],
                 wd: dt[Z, X]):
        h = eqsat.relu(x @ we)
        mu, logvar = h @ wmu, h @ wlv
        logits = np.tanh(mu + np.exp(0.5 * logvar) * eps) @ wd
        rec = np.sum(np.maximum(logits, 0) - logits * x + np.log1p(np.exp(-np.abs(logits))))
        return (rec - 0.5 * np.sum(1 + logvar - mu ** 2 - np.exp(logvar))) / B

    def ref(x, eps, we, wmu, wlv, wd):
        h = np.maximum(x @ we, 0)
        mu, logvar = h @ wmu, h @ wlv
        logits = np.tanh(mu + np.exp(0.5 * logvar) * eps) @ wd
        rec = np.sum(np.maximum(logits, 0) - logits * x + np.log1p(np.exp(-np.abs(logits))))
        return (rec - 0.5 * np.sum(1 + logvar - mu ** 2 - np.exp(logvar))) / B

    ints = {0: lambda rng, dtype: (rng.random((B, X)) > 0.5).astype(dtype)}
    shapes = [None, (B, Z), (X, Hd), (Hd, Z), (Hd, Z), (Z, X)]
    return vae_loss, ref, shapes, [0, 1.0, 0.5, 0.5, 0.3, 0.6], ints


MODELS = {"causal_attention": causal_attention, "lstm": lstm, "vae": vae}


def _inputs(shapes, scales, given, dtype, seed=0):
    """Random normal inputs of `dtype` (scaled), except those `given` makes (labels, data)."""
    rng = np.random.default_rng(seed)
    return [given[i](rng, dtype) if i in given
            else (scales[i] * rng.standard_normal(s)).astype(dtype)
            for i, s in enumerate(shapes)]


@pytest.mark.parametrize("model", sorted(MODELS))
def test_model_end_to_end_against_numpy_and_central_differences(model):
    f32, ref, shapes, scales, given = MODELS[model](eqsat.f32)
    f64, _, _, _, _ = MODELS[model](eqsat.f64)
    vg = eqsat.value_and_grad(f64)
    m = eqsat.Module(f32, f64, vg)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a validation failure would warn and keep the input
        opt = eqsat.optimize(m, limits=LIMITS)
    assert eqsat.cost(opt) <= eqsat.cost(m)
    plain, fast = eqsat.compile(m, optimize=False), eqsat.compile(opt, optimize=False)

    a32 = _inputs(shapes, scales, given, np.float32)
    want32 = ref(*a32)
    for got in (eqsat.interpret(m, f32, *a32), plain(f32.name, *a32), fast(f32.name, *a32)):
        np.testing.assert_allclose(got, want32, **F32)

    a64 = _inputs(shapes, scales, given, np.float64, seed=1)
    floats = [i for i, p in enumerate(m[f64.name].params) if p.type.dtype.is_float]
    numeric = [central_differences(ref, a64, i) for i in floats]
    for run in (lambda *a: eqsat.interpret(m, vg, *a), getattr(plain, vg.name),
                getattr(fast, vg.name)):
        value, *grads = run(*a64)
        np.testing.assert_allclose(value, ref(*a64), rtol=1e-12)
        for g, n in zip(grads, numeric, strict=True):
            np.testing.assert_allclose(g, n, rtol=1e-5, atol=1e-7 * max(1.0, np.abs(n).max()))
