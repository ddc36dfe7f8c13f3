"""What `optimize` did: e-graph size, why saturation stopped, which rules fired, the cost of each
function before and after, how extraction went, and where fused kernels and removed transposes
came from.

Provenance is by rule *kind*, not by derivation: egglog does not record which rewrite created
an e-node, so a fused kernel is attributed to the rules that fired and can create its op (the op
is on their right side), and a removed transpose to the rules that fired and have fewer
transposes on their right side than on their left. `FusedKernel.rules` and
`TransposeChange.rules` are therefore candidates, every one of which did fire.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ..ir.module import Function, Module
from ..ir.ops import OPS
from ..rules.fusion_pass import CREATES
from ..rules.lang import Node, Pattern, RuleSet
from ..rules.runner import ranked

# Ops that only optimization makes and that run as one kernel of several core ops.
FUSED_OPS = frozenset(name for name, d in OPS.items() if "fused" in d.traits)
# A matmul that reads transposed operands in place (a transpose folded into the product).
LAYOUT_OPS = frozenset(name for name, d in OPS.items() if d.family == "layout")


@dataclass(frozen=True)
class FunctionResult:
    """Cost (seconds under the target's model) of one function before and after, and how its
    program was chosen. `kept_input` is True when extraction did not beat the input."""

    name: str
    cost_before: float
    cost_after: float
    kept_input: bool
    method: str
    seconds: float
    optimal: bool
    enodes: int
    note: str = ""

    @property
    def speedup(self) -> float:
        """cost_before / cost_after (1.0 for free functions)."""
        return self.cost_before / self.cost_after if self.cost_after > 0 else 1.0


@dataclass(frozen=True)
class FusedKernel:
    """A fused kernel of the result: where it is, its op and body, the rules that can make it."""

    function: str
    value: str
    op: str
    body: str
    rules: tuple[str, ...]


@dataclass(frozen=True)
class TransposeChange:
    """Transposes of one function before and after, and the rules that can remove them."""

    function: str
    before: int
    after: int
    folded: int  # layout ops (matmul_t, ...) in the result, each holding a folded transpose
    rules: tuple[str, ...]

    @property
    def eliminated(self) -> int:
        """How many transpose statements fewer the result has."""
        return max(0, self.before - self.after)


@dataclass
class OptimizeReport:
    """Everything `optimize_with_report` measured; `str(report)` prints it as tables."""

    target: str
    method: str
    stop_reason: str = "not run"
    rounds: int = 0
    enodes_initial: int = 0
    enodes_final: int = 0
    eclasses: int = 0
    fired: Counter = field(default_factory=Counter)
    functions: list[FunctionResult] = field(default_factory=list)
    fused: list[FusedKernel] = field(default_factory=list)
    transposes: list[TransposeChange] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)  # stage -> seconds
    notes: list[str] = field(default_factory=list)

    @property
    def cost_before(self) -> float:
        """Seconds of all functions of the input (gradients expanded)."""
        return sum(f.cost_before for f in self.functions)

    @property
    def cost_after(self) -> float:
        """Seconds of all functions of the result."""
        return sum(f.cost_after for f in self.functions)

    @property
    def total_seconds(self) -> float:
        """Wall-clock seconds of the whole optimization."""
        return sum(self.seconds.values())

    def __str__(self) -> str:
        fired = ranked(self.fired)
        lines = [
            f"optimize: target {self.target}, extraction {self.method}, "
            f"{self.total_seconds:.3f}s ("
            + ", ".join(f"{k} {v:.3f}s" for k, v in self.seconds.items()) + ")",
            f"e-graph: {self.enodes_initial} -> {self.enodes_final} e-nodes, {self.eclasses} "
            f"e-classes; saturation stopped: {self.stop_reason} after {self.rounds} round(s)",
            "rules fired: " + (", ".join(f"{k}={v}" for k, v in fired) or "none"),
            "",
        ]
        rows = [("function", "before", "after", "speedup", "extraction", "e-nodes", "kept")]
        for f in self.functions:
            how = f"{f.method}{' (optimal)' if f.optimal else ''} {f.seconds * 1e3:.1f}ms"
            rows.append((f"@{f.name}", _sec(f.cost_before), _sec(f.cost_after),
                         f"{f.speedup:.2f}x", how, str(f.enodes),
                         "input" if f.kept_input else "optimized"))
        rows.append(("total", _sec(self.cost_before), _sec(self.cost_after),
                     f"{self.cost_before / self.cost_after:.2f}x" if self.cost_after else "-",
                     "", "", ""))
        lines += _table(rows)
        if self.fused:
            lines += ["", "fused kernels (rules: those fired that can create the op):"]
            lines += _table([("function", "value", "op", "body", "rules")] + [
                (f"@{k.function}", f"%{k.value}", k.op, k.body, ", ".join(k.rules) or "-")
                for k in self.fused])
        changed = [t for t in self.transposes if t.before != t.after or t.folded]
        if changed:
            lines += ["", "transposes (rules: those fired that remove or fold one):"]
            lines += _table([("function", "before", "after", "folded", "rules")] + [
                (f"@{t.function}", str(t.before), str(t.after), str(t.folded),
                 ", ".join(t.rules) or "-") for t in changed])
        for f in self.functions:
            if f.note:
                lines.append(f"note: @{f.name}: {f.note}")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def _sec(s: float) -> str:
    if s >= 1:
        return f"{s:.3f}s"
    if s >= 1e-3:
        return f"{s * 1e3:.3f}ms"
    return f"{s * 1e6:.2f}us"


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for k, r in enumerate(rows):
        out.append("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
        if k == 0:
            out.append("  ".join("-" * w for w in widths))
    return out


# ---------------------------------------------------------------- provenance by rule kind


def _ops(p: Pattern) -> Counter:
    out: Counter = Counter()
    stack: list[Any] = [p]
    while stack:
        q = stack.pop()
        if isinstance(q, Node):
            out[q.op] += 1
            stack.extend(q.args)
    return out


def creators(rules: RuleSet, fired: Counter, op: str) -> tuple[str, ...]:
    """Rules that fired and have `op` on their right side more often than on their left, and
    the fusion pass's rules that fired and make `op`."""
    made = tuple(r.name for r in rules if fired.get(r.name, 0) > 0
                 and _ops(r.rhs)[op] > _ops(r.lhs)[op])
    return made + tuple(name for name, ops in CREATES.items()
                        if fired.get(name, 0) > 0 and op in ops)


def transpose_removers(rules: RuleSet, fired: Counter) -> tuple[str, ...]:
    """Rules that fired and leave fewer transposes than they match."""
    return tuple(r.name for r in rules if fired.get(r.name, 0) > 0
                 and _ops(r.rhs)["transpose"] < _ops(r.lhs)["transpose"])


def _count(f: Function, ops: frozenset[str]) -> int:
    return sum(1 for s in f.body if s.op in ops)


def provenance(before: Module, after: Module, rules: RuleSet, fired: Counter
               ) -> tuple[list[FusedKernel], list[TransposeChange]]:
    """The fused kernels of `after` and the transposes of each function, with candidate rules."""
    from ..ir.fused import format_body_attr

    fused: list[FusedKernel] = []
    changes: list[TransposeChange] = []
    removers = transpose_removers(rules, fired)
    for f in after.functions:
        for s in f.body:
            if s.op in FUSED_OPS:
                body = s.attr.get("body")
                fused.append(FusedKernel(f.name, s.results[0], s.op,
                                         format_body_attr(body) if body is not None else "",
                                         creators(rules, fired, s.op)))
        g = before[f.name]
        folded = _count(f, LAYOUT_OPS)
        layout_rules = tuple(r for op in sorted(LAYOUT_OPS) for r in creators(rules, fired, op))
        changes.append(TransposeChange(f.name, _count(g, frozenset({"transpose"})),
                                       _count(f, frozenset({"transpose"})), folded,
                                       tuple(dict.fromkeys(removers + layout_rules))))
    return fused, changes
