"""Property-based soundness check: instantiate each rule on random shapes and values, compare.

For each rule, hypothesis draws a seed; from it the checker draws types for the left side's
variables (small dims, and around the sizes and ranks its conditions name; shapes shared
between variables often, so that guards and matmul chains are satisfiable), attributes left
open, and values in [-4, 4] mixed with 0, -0, 1, -1 and tiny/negative numbers. Instances whose
left side does not verify or whose condition is false are redrawn. Both sides become IR
functions, run by the reference interpreter, and are compared (float tolerance scaled to the
magnitudes involved; NaN must match NaN). A right side that does not type as the left side
does (optimize skips such an instance), or a difference, raises `UnsoundRule` with the rule
name and the counterexample; a difference first, and a rule whose sides type together on no
instance drawn is said never to apply. A right side's computed int
lists (`shape=permute(?s, ?p)`, `lpad(shape(?x), ?s)`) are evaluated by the reference semantics
of `lang.SHAPE_FNS`; where one is undefined the rule would not fire, so the instance is
redrawn. The check is of real-number identities over a bounded range: floating-point overflow
far out (log(exp(x)) for x > 88) is outside it. The instances are drawn by `check_draw`; this
module compares the two sides, looks for a smaller counterexample and reports it."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import Error, LocatedError, UnsoundRule
from ..ir.interpreter import interpret_function
from ..ir.module import Function, Module
from ..ir.printer import format_stmt
from ..ir.verifier import verify
from .check_draw import IllTyped, Instance, Reject, Undrawable, instantiate, too_large
from .lang import Rule, RuleSet

_ATTEMPTS = 300


class CheckError(Error):
    """A rule whose left side and condition could not be instantiated at all."""



def _close(a: np.ndarray, b: np.ndarray, scale: float) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.kind != "f":
        return bool(np.array_equal(a, b))
    rtol = 1e-3 if a.dtype == np.float32 else 1e-9
    with np.errstate(all="ignore"):
        finite = np.isfinite(a)
        if not np.array_equal(finite, np.isfinite(b)):
            return False
        # inf, -inf and NaN must be the same on both sides, finite values close
        if not np.array_equal(a[~finite], b[~finite], equal_nan=True):
            return False
        return bool(np.allclose(a[finite].astype(np.float64), b[finite].astype(np.float64),
                                rtol=rtol, atol=rtol * scale))


# Further seeds tried once a rule fails, for a counterexample with fewer input elements and
# to tell a rule that is ill-typed on some instances from one that types on none.
SMALLER_DRAWS = 30
# Instances where the two sides do not type together that one seed draws before it gives up
# looking for one where they do.
_ILL_TYPED_DRAWS = 20


@dataclass
class _Seed:
    """What one seed found: an instance where the two sides type together (`typed`), one
    where they then differ (`unsound`), and the first where they do not type together."""

    typed: bool = False
    unsound: UnsoundRule | None = None
    ill: UnsoundRule | None = None


def _try_seed(rule: Rule, seed: int, ieee: bool) -> _Seed:
    """Instantiate `rule` from `seed` and compare its sides, drawing past instances where they
    do not type together (optimize skips those, but check reports them too) until one where
    they do; errors carry `.elements`, their inputs' total size, and `.ill_typed`."""
    rng = random.Random(seed)
    out = _Seed()
    ill = 0
    for _ in range(_ATTEMPTS):
        try:
            module, arrays, inst = instantiate(rule, rng, ieee)
        except Reject:
            continue
        except IllTyped as e:
            err = _ill_typed(rule, str(e), e.module["lhs"], e.arrays, e.inst)
        else:
            why = _type_problem(module)
            if why is None:
                out.typed, out.unsound = True, _compare(rule, module, arrays, inst)
                return out
            err = _ill_typed(rule, why, module["lhs"], arrays, inst)
        out.ill = out.ill or err
        ill += 1
        if ill >= _ILL_TYPED_DRAWS:
            break
    return out


def _type_problem(module: Module) -> str | None:
    """Why the right side of an instance does not type as its left side does, or None."""
    try:
        verify(module)
    except Error as e:
        return e.message if isinstance(e, LocatedError) else str(e)  # in no text of theirs
    (left,), (right,) = module["lhs"].result_types, module["rhs"].result_types
    if left != right:
        return f"it gives {right} where the left-hand side gives {left}"
    return None


def _compare(rule: Rule, module: Module, arrays: list[np.ndarray], inst: Instance
             ) -> UnsoundRule | None:
    """The error where the two sides of a typed instance give different values, or None."""
    (left,) = interpret_function(module, "lhs", *arrays)
    (right,) = interpret_function(module, "rhs", *arrays)
    with np.errstate(all="ignore"):
        mags = [np.max(np.abs(x)) for x in [left, right, *arrays]
                if x.size and x.dtype.kind in "fi"]
        finite = [float(m) for m in mags if np.isfinite(m)]
    largest = max([1.0] + finite)
    scale = largest ** 2 if largest < 1e150 else 1e300
    if not _close(left, right, scale):
        return _unsound(f"rule {rule.name} is unsound: {rule}\n  counterexample: "
                        f"{_describe(module['lhs'], arrays, inst)}\n  left side gives "
                        f"{_fmt(left)}\n  right side gives {_fmt(right)}", arrays, False)
    return None


_SKIPPED = ("\n  optimize skips such an instance; a condition (say `if dtype(?x) == f32`) "
            "can keep the rule to those where it types")


def _ill_typed(rule: Rule, why: str, lhs: Function, arrays: list[np.ndarray],
               inst: Instance | None) -> UnsoundRule:
    return _unsound(f"rule {rule.name}: the right-hand side is ill-typed: {why}\n"
                    f"  counterexample: {_describe(lhs, arrays, inst)}{_SKIPPED}", arrays, True)


def _unsound(message: str, arrays: list[np.ndarray], ill_typed: bool) -> UnsoundRule:
    err = UnsoundRule(message)
    err.elements, err.ill_typed = sum(a.size for a in arrays), ill_typed
    return err


def _never_types(rule: Rule, example: UnsoundRule) -> UnsoundRule:
    """The error for a rule whose two sides typed together on no instance drawn: optimize
    skips every such instance, so the rule would never apply; `example` shows one."""
    why = str(example).split(": the right-hand side is ill-typed: ", 1)[1].removesuffix(_SKIPPED)
    err = UnsoundRule(f"rule {rule.name} never applies: its two sides type together on none "
                      f"of the instances drawn, and optimize skips an instance where they do "
                      f"not; the right-hand side is ill-typed: {why}")
    err.elements, err.ill_typed = example.elements, True
    return err


def _smaller(rule: Rule, first: UnsoundRule, typed: bool, ieee: bool) -> UnsoundRule:
    """What to report once `first` failed (`typed`: its seed drew an instance where the sides
    type together): among it and SMALLER_DRAWS further seeds (drawn from the failing one, so a
    derandomized check stays deterministic), the smallest instance where the sides type
    together but differ (the rule is unsound), else the smallest where they do not type
    together, said to be the only kind drawn where no instance typed (the rule never
    applies): a 2-element counterexample reads better than a 27-element one."""
    unsound = [] if first.ill_typed else [first]
    ill = [first] if first.ill_typed else []
    rng = random.Random(getattr(first, "seed", 0))
    for _ in range(SMALLER_DRAWS):
        if unsound and min(e.elements for e in unsound) <= 1:
            break
        found = _try_seed(rule, rng.getrandbits(32), ieee)
        typed = typed or found.typed
        unsound += [found.unsound] if found.unsound else []
        ill += [found.ill] if found.ill else []
    if unsound:
        return min(unsound, key=lambda e: e.elements)
    best = min(ill, key=lambda e: e.elements)
    return best if typed else _never_types(rule, best)


def check_rule(rule: Rule, examples: int = 40, derandomize: bool = True,
               ieee: bool = False) -> None:
    """Check one rule on `examples` random instances; raises UnsoundRule on a difference.
    `ieee=True` also draws infinities, NaN, overflowing and subnormal floats (fast-math-like
    rules such as distributivity then fail)."""
    if not isinstance(rule, Rule):
        raise Error(f"check_rule takes a Rule, not {type(rule).__name__}")
    if isinstance(examples, bool) or not isinstance(examples, int) or examples < 1:
        raise Error(f"check: examples must be a whole number >= 1, got {examples!r}")
    big = too_large(rule)
    if big:
        raise CheckError(f"rule {rule.name}: {big}; check an instance of the rule on smaller "
                         f"shapes")
    # here, not at module level: hypothesis costs ~0.1 s to import, and `import eqsat.rules`
    # (every optimize) must not pay it
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import strategies as st

    found = [0]

    # generation only: shrinking or explaining a seed finds no simpler counterexample, only
    # another seed, and each try may cost hundreds of draws (seconds on a failing rule); a
    # smaller counterexample is looked for among further seeds instead (`_smaller`)
    @settings(max_examples=examples, deadline=None, database=None, derandomize=derandomize,
              suppress_health_check=list(HealthCheck), report_multiple_bugs=False,
              phases=[Phase.explicit, Phase.generate])
    @given(st.integers(0, 2**32 - 1))
    def run(seed: int) -> None:
        drawn = _try_seed(rule, seed, ieee)
        found[0] += drawn.typed or drawn.ill is not None
        err = drawn.unsound or drawn.ill
        if err is not None:
            err.seed, err.typed = seed, drawn.typed
            raise err

    try:
        try:
            run()
        except UnsoundRule as first:
            raise _smaller(rule, first, first.typed, ieee) from None
    except Undrawable as e:
        raise CheckError(f"rule {rule.name}: check cannot draw the open attribute {e} (it draws "
                         f"tensors, shapes, axes, perms and reductions, not kernel bodies); "
                         f"check instances of the rule with the attribute written out") from None
    if not found[0]:
        raise CheckError(f"rule {rule.name}: no instance satisfies its left side and condition "
                         f"(tried {examples} x {_ATTEMPTS} draws)")


def _fmt(a: np.ndarray) -> str:
    # continuation lines indented under the message's own, so a matrix reads as one block
    first, *rest = np.array2string(a, precision=6, threshold=20).split("\n")
    return "\n".join([f"{a.dtype}{list(a.shape)} {first}"]
                     + [f"      {line}" if line.strip() else "" for line in rest])


def _fmt_attr(v: Any) -> str:
    return "[" + ",".join(map(str, v)) + "]" if isinstance(v, tuple) else str(v)


def _bound(inst: Instance) -> list[str]:
    """`?p = [1,0]`, `?c = 0.5`: the attributes and constant values drawn for the left side's
    variables, which a counterexample needs besides its tensors."""
    out = [f"?{k} = {_fmt_attr(v)}" for k, v in inst.attrs.items()]
    return out + [f"?{k} = {v!r}" for k, v in inst.values.items()]


def _describe(f: Function, arrays: list[np.ndarray], inst: Instance | None = None) -> str:
    """The counterexample: every tensor variable's value, the attributes and constants drawn
    for the other variables, and, where the rule leaves an attribute open, the left side's
    instance as IR (which shows the attribute drawn)."""
    parts = [f"?{p.name} = {_fmt(a)}" for p, a in zip(f.params, arrays)]
    text = ", ".join(parts + (_bound(inst) if inst else [])) or "no inputs"
    if inst is not None and inst.open:
        text += "\n  left side as IR:" + "".join(f"\n    {format_stmt(s)}" for s in f.body)
    return text


def check(ruleset: RuleSet | Rule, examples: int = 40, derandomize: bool = True,
          ieee: bool = False) -> None:
    """Check every rule of a rule set; raises `eqsat.UnsoundRule` naming the first wrong one.
    With `ieee=True` floats are also drawn infinite, NaN, huge and subnormal: rules that hold
    for real numbers but not at those values (`mul(?x, const(0.0)) => const(0.0, like=?x)`,
    distributivity) fail."""
    rules = [ruleset] if isinstance(ruleset, Rule) else (
        list(ruleset) if isinstance(ruleset, (RuleSet, list, tuple)) else None)
    if rules is None or not all(isinstance(r, Rule) for r in rules):
        raise Error(f"check takes a RuleSet, a Rule or a list of Rules (eqsat.rules.parse(text) "
                    f"makes a RuleSet), not {type(ruleset).__name__}")
    for rule in rules:
        check_rule(rule, examples, derandomize, ieee)
