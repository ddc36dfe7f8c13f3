"""The saturation runner: short rounds, analysis to a fixpoint between them, limits that hold.

egglog has no node limit and a running `run` cannot be interrupted, so each round is a single
rewrite iteration (after the analysis rules have run to a fixpoint), and the limits are checked
between rounds. Before a round starts the runner also predicts its size and the duration of
its uninterruptible part (the egglog run, a pass's snapshot of the e-graph) from the last round;
a round that would overshoot the node limit by more than its own size, or land past the time
limit, is not started (stop reason "node limit" / "time limit" with `predicted=True`). Python
passes get the deadline and stop adding terms when it comes.
"""

from __future__ import annotations

import math
import numbers
import sys
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from ..errors import Error
from ..ir.module import Module
from . import schema
from .bridge import EGraph, load
from .compile import checks_types, compile_ruleset
from .lang import RuleSet

class Pass(Protocol):
    """A rewrite pass in Python, run after each egglog round, for rewrites whose right side
    egglog cannot compute (fusion's body substitution). It adds equal terms by union only."""

    rule_names: tuple[str, ...]  # the names it reports its matches under

    def enabled(self, rules: RuleSet) -> bool:
        """Whether `rules` asks for this pass (e.g. it holds the pass's family)."""
        ...

    def run(self, eg: EGraph, budget: int, deadline: float = math.inf) -> dict[str, int]:
        """Add at most about `budget` e-nodes, stopping at `deadline` (a `time.perf_counter`
        value); returns the new terms per rule name."""
        ...

    def overhead(self) -> float:
        """Seconds of its last run that it could not interrupt (snapshotting the e-graph)."""
        ...


# Passes offered to every run; a pass takes part when its `enabled(rules)` says so.
PASSES: list[Pass] = []


def register_pass(p: Pass) -> None:
    """Offer a Python pass to every later saturation run."""
    if p not in PASSES:
        PASSES.append(p)


SATURATED = "saturated"
ITERATION_LIMIT = "iteration limit"
NODE_LIMIT = "node limit"
TIME_LIMIT = "time limit"


@dataclass(frozen=True)
class Limits:
    """Bounds on saturation: rewrite iterations, tensor e-nodes, and wall-clock seconds (each a
    number >= 0; math.inf for no bound)."""

    iterations: int = 30
    nodes: int = 50_000
    seconds: float = 5.0

    def __post_init__(self) -> None:
        for name in ("iterations", "nodes", "seconds"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or not v >= 0:
                raise Error(f"Limits.{name} must be a number >= 0 (math.inf for no bound), "
                            f"got {v!r}")


def checked_limits(limits: object) -> Limits:
    """`limits`, or the defaults where it is None; an eqsat.Error for anything else."""
    if limits is None:
        return Limits()
    if not isinstance(limits, Limits):
        raise Error(f"limits must be an eqsat.Limits, not {type(limits).__name__}")
    return limits


@dataclass
class Round:
    """One round: e-graph size after it, its duration, and the matches of each rule in it."""

    nodes: int
    seconds: float
    matches: dict[str, int]


def ranked(fired: Mapping[str, int]) -> list[tuple[str, int]]:
    """Rules that fired, most often first and ties by name: egglog hands back its counts in
    hash order, and a report should read the same from one run to the next."""
    return sorted(((k, v) for k, v in fired.items() if v > 0), key=lambda kv: (-kv[1], kv[0]))


@dataclass
class Report:
    """Why saturation stopped, the size after each round, and how often each rule fired."""

    stop_reason: str
    rounds: list[Round] = field(default_factory=list)
    fired: Counter = field(default_factory=Counter)
    initial_nodes: int = 0
    seconds: float = 0.0
    predicted: bool = False

    @property
    def sizes(self) -> list[int]:
        """The e-graph size (tensor e-nodes) after loading and after each round."""
        return [self.initial_nodes] + [r.nodes for r in self.rounds]

    @property
    def final_nodes(self) -> int:
        return self.sizes[-1]

    def __str__(self) -> str:
        top = ", ".join(f"{k}={v}" for k, v in ranked(self.fired)[:8])
        return (f"stopped: {self.stop_reason} after {len(self.rounds)} round(s), "
                f"{self.seconds:.2f}s; nodes {' -> '.join(map(str, self.sizes))}; fired: {top}")


# A round: the analysis to its fixpoint (types of what the last round made, folds), then one
# rewrite iteration. Only the rewrite's changes count as progress: where it changed nothing,
# it had already seen every fact the analysis added, so another round would change nothing
# either (counting the analysis too cost a last round that matched nothing: softmax's
# core ops saturated in 4 rounds where 3 say the same).
_REWRITE = f"(run-schedule (run {schema.REWRITE}))"
# Analysis runs of at least this many new e-nodes give its per-node cost (smaller ones are
# mostly the fixed cost of a run).
_RATE_SAMPLE = 1000


def _matches(outputs: list) -> tuple[dict[str, int], bool]:
    """The matches per rule in egglog's `outputs`, and whether the last of them changed the
    e-graph."""
    matches: dict[str, int] = {}
    updated = False
    for out in outputs:
        report = getattr(out, "report", None)
        if report is None:
            continue
        updated = report.updated
        for name, n in report.num_matches_per_rule.items():
            matches[name] = matches.get(name, 0) + n
    return matches, updated


def saturate_egraph(eg: EGraph, rules: RuleSet, limits: Limits | None = None,
                    progress: bool = False, start: float | None = None,
                    afford: float = math.inf, program: str | None = None) -> Report:
    """Add `rules` to a loaded e-graph and run them within `limits` (the time limit counted
    from `start`, a `time.perf_counter` value, by default now); returns the report.
    `program` is the rules' egglog program where the caller compiled it already.

    `afford` bounds the e-graph's size by time rather than memory: the e-nodes the caller can
    still serialize and extract within its own share of the time. A round that would grow the
    e-graph past it is not started (stop reason "time limit", predicted)."""
    limits = limits or Limits()
    start = time.perf_counter() if start is None else start
    eg.add_rules(compile_ruleset(rules) if program is None else program)
    passes = [p for p in PASSES if p.enabled(rules)]
    names = set(rules.names()).union(*(p.rule_names for p in passes))
    first, _ = _matches(eg.load_outputs + eg.analyze())
    eg.load_outputs = []
    report = Report(SATURATED, initial_nodes=eg.size())
    report.fired.update({k: v for k, v in first.items() if k in names})
    last_nodes, last_growth, last_fixed = report.initial_nodes, 1.0, 0.0
    analysed, per_node = last_nodes, 0.0  # e-nodes typed so far; seconds to type one more
    deadline = start + limits.seconds
    while True:
        elapsed = time.perf_counter() - start
        if len(report.rounds) >= limits.iterations:
            report.stop_reason = ITERATION_LIMIT
            break
        if last_nodes >= limits.nodes:
            report.stop_reason = NODE_LIMIT
            break
        if last_nodes * (last_growth if report.rounds else 1.0) > afford:
            report.stop_reason, report.predicted = TIME_LIMIT, True
            break
        if elapsed >= limits.seconds:
            report.stop_reason = TIME_LIMIT
            break
        # Do not start a round that would land far beyond a limit (it cannot be interrupted).
        if report.rounds and last_nodes * last_growth > 2 * limits.nodes:
            report.stop_reason, report.predicted = NODE_LIMIT, True
            break
        # Only the egglog run and the passes' snapshots cannot stop at the deadline, nor the
        # analysis that types what a round made (in the next round, or after the last): a
        # round that multiplies the e-graph leaves the most of it.
        made = last_nodes * (last_growth - 1.0)
        if report.rounds and (elapsed + last_fixed * last_growth + made * per_node
                              > limits.seconds):
            report.stop_reason, report.predicted = TIME_LIMIT, True
            break
        t0 = time.perf_counter()
        analysis = eg.analyze()
        if last_nodes - analysed >= _RATE_SAMPLE:
            per_node = (time.perf_counter() - t0) / (last_nodes - analysed)
        analysed = last_nodes
        matches, updated = _matches(analysis + eg.run(_REWRITE))
        last_fixed = time.perf_counter() - t0
        for p in passes:
            added = p.run(eg, max(0, limits.nodes - eg.size()), deadline)
            last_fixed += p.overhead()
            updated = updated or any(added.values())
            for k, v in added.items():
                matches[k] = matches.get(k, 0) + v
        nodes = eg.size()
        seconds = time.perf_counter() - t0
        fired = {k: v for k, v in matches.items() if k in names}
        report.rounds.append(Round(nodes, seconds, fired))
        report.fired.update(fired)
        last_growth = max(1.0, nodes / max(last_nodes, 1))
        last_nodes = nodes
        if progress:
            print(f"eqsat: round {len(report.rounds)}: {nodes} e-nodes, {seconds:.3f}s, "
                  f"{sum(fired.values())} matches", file=sys.stderr)
        if not updated:
            # a pass cut short by the deadline adds nothing: that is no fixpoint
            if time.perf_counter() >= deadline:
                report.stop_reason = TIME_LIMIT
            break
    eg.analyze()  # nodes made by the last round get their types before extraction
    report.seconds = time.perf_counter() - start
    if progress:
        print(f"eqsat: {report}", file=sys.stderr)
    return report


def saturate(module: Module, rules: RuleSet, limits: Limits | None = None,
             progress: bool = False, afford: float = math.inf) -> tuple[EGraph, Report]:
    """Load `module` (verified, gradients expanded) and saturate it with `rules` (`afford`: see
    `saturate_egraph`).

    Returns the e-graph handle (serialize it, or `build` a module from chosen nodes) and the
    run report; `bridge.LoadTimeout` where loading alone outlasts the time limit.
    """
    start = time.perf_counter()  # loading counts against the time limit too
    program = compile_ruleset(rules)
    eg = load(module, start + (limits or Limits()).seconds, program, checks_types(rules))
    return eg, saturate_egraph(eg, rules, limits, progress, start, afford, program)
