"""Fusion's Python pass: the fusion rules whose right side substitutes one body into another.

egglog stores a kernel's body as its canonical text (a String attribute) and cannot rewrite
inside it, so these rules run in Python after each egglog round, on the serialized e-graph:

- `fuse_producer`: a consumer kernel (a `map`, or an elementwise op read as the map of its own
  body) inlines an operand's producer (a `map` or an elementwise op): the producer's body
  replaces `$k` in the consumer's body, the producer's operands join the consumer's;
- `fuse_broadcast`: an operand that is a `broadcast` is read through (a fused kernel
  broadcasts its operands itself, numpy's rule), so the broadcast is never materialized;
- `fuse_constant`: an operand that is a constant becomes a literal of the body;
- `fuse_reduce`: a reduction (`sum max min`) of a kernel becomes one `map_reduce`, and a
  `map_reduce` inlines producers as a map does (only where its index space stays the same);
- `fuse_epilogue`: a kernel reading a `matmul` / `matmul_t` becomes a `matmul_epi`.

Each new kernel is put in canonical form (equal operands merged, operands numbered in the order
the body first reads them, unused ones dropped), so equal fusions are one e-node; it is typed by
the op table's own `infer` and must give exactly its e-class's type, and it joins that e-class
by `union`: the pass only adds equal forms, extraction decides whether fusing pays. Blow-up is
bounded: bodies of at most MAX_BODY_OPS ops and MAX_OPERANDS operands, the MAX_FORMS largest
kernels of an e-class taken as consumers and producers, and a node budget per run.
"""

from __future__ import annotations

import functools
import json
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..ir.fused import domain
from ..ir.module import Stmt
from ..ir.ops import OPS, OpTypeError, broadcastable, ops_in
from ..ir.scalar_expr import Arg, merge, substitute
from ..ir.types import TensorType
from . import egglog_text
from .bridge import EGraph, ENode, _list, const_term
from .fusion_graph import (MAX_FORMS, MAX_OPERANDS, FusionGraph, Kernel, body_size,
                           canonical, same_domain)
from .lang import RuleSet

MAX_BODY_OPS = 16  # 24 cost 2x the saturation time on attention, for a costlier result
MAX_NEW = 5000  # new terms per run, at most
CHUNK = 64  # new terms per egglog program

RULES = ("fuse_canonical", "fuse_producer", "fuse_broadcast", "fuse_constant", "fuse_reduce",
         "fuse_epilogue")
# the fused ops each of the pass's rules makes (for the optimization report's provenance)
CREATES: dict[str, tuple[str, ...]] = {
    "fuse_canonical": ("map",),
    "fuse_producer": ("map", "map_reduce"),
    "fuse_broadcast": ("map", "map_reduce"),
    "fuse_constant": ("map", "map_reduce"),
    "fuse_reduce": ("map_reduce",),
    "fuse_epilogue": ("matmul_epi",),
}


@dataclass(frozen=True)
class Candidate:
    """A new term for e-class `eclass`: `op` over operand classes, with IR attributes."""

    eclass: str
    op: str
    operands: tuple[str, ...]
    attrs: tuple[tuple[str, object], ...]
    rule: str


def _small(k: Kernel) -> bool:
    return (0 < len(k.operands) <= MAX_OPERANDS and not isinstance(k.body, Arg)
            and body_size(k.body) <= MAX_BODY_OPS)


@functools.lru_cache(maxsize=1 << 16)
def _infers_cached(op: str, ins: tuple[TensorType, ...], attrs: tuple, want: TensorType) -> bool:
    try:
        return OPS[op].infer(list(ins), dict(attrs), want if OPS[op].written_type else None
                             ) == want
    except (OpTypeError, ValueError, KeyError, IndexError):
        return False


def _infers(op: str, ins: list[TensorType], attrs: dict, want: TensorType) -> bool:
    """Whether the op table types `op` over `ins` with `attrs` exactly as `want`."""
    return _infers_cached(op, tuple(ins), tuple(attrs.items()), want)


class FusionPass:
    """The Python half of the fusion family (see the module docstring); `runner.Pass`."""

    rule_names = RULES

    def __init__(self, family: frozenset[str]):
        self.family = family  # the names of the fusion family's egglog rules
        self.batches = 0
        self._overhead = 0.0

    def enabled(self, rules: RuleSet) -> bool:
        """Runs with any rule set that holds a rule of the fusion family."""
        return bool(self.family & set(rules.names()))

    def run(self, eg: EGraph, budget: int, deadline: float = math.inf) -> dict[str, int]:
        """Add the fusions of the current e-graph not yet in it, stopping at `deadline` (a
        `time.perf_counter` value); returns new terms per rule."""
        counts = dict.fromkeys(RULES, 0)
        self._overhead = 0.0
        if budget <= 0 or time.perf_counter() >= deadline:
            return counts
        t0 = time.perf_counter()
        eg.analyze()  # terms of the last round get their types first
        g = FusionGraph(eg.serialize())
        self._overhead = time.perf_counter() - t0
        found: dict[tuple, Candidate] = {}
        limit, size = min(MAX_NEW, budget), 0
        # combinations tried before (per e-graph): e-class ids are stable until classes merge
        seen = eg.__dict__.setdefault("_fusion_seen", set())
        # candidates stop early enough that adding those found still ends by the deadline
        per_term = eg.__dict__.get("_fusion_term_seconds", 1e-3)
        for cand in self._candidates(g, seen):
            key = (cand.eclass, cand.op, cand.attrs, cand.operands)
            if key in g.existing or key in found:
                continue
            found[key] = cand
            size += 1 + len(cand.operands)
            if size >= limit or time.perf_counter() + 2 * per_term * len(found) >= deadline:
                break
        if not found:
            return counts
        # in chunks, each complete by itself, so that the pass may stop between two
        t1 = time.perf_counter()
        done = 0
        for program, cands in self._programs(eg, g, list(found.values())):
            if time.perf_counter() >= deadline:
                break
            eg.run(program)
            for cand in cands:
                counts[cand.rule] += 1
            done += len(cands)
        eg.__dict__["_fusion_term_seconds"] = (time.perf_counter() - t1) / max(1, done)
        return counts

    def overhead(self) -> float:
        """Seconds its last run spent before it could stop (typing and serializing the graph)."""
        return self._overhead

    # -------------------------------------------------------------- what to add

    def _candidates(self, g: FusionGraph, seen: set) -> Iterator[Candidate]:
        reducers = ops_in("reduce")
        for c in list(g.ser.classes):
            t = g.types.get(c)
            if t is None:
                continue
            for k in g.kernels(c):
                yield from self._maps(g, c, t, k, seen)
            mrs = []
            for n in g.nodes(c):
                if n.op in reducers:
                    yield from self._reduce(g, c, t, n, seen)
                elif n.op == "map_reduce":
                    mrs.append(n)
            mrs.sort(key=lambda n: -body_size(dict(n.attrs)["body"]))
            for n in mrs[:MAX_FORMS]:
                yield from self._into_map_reduce(g, c, t, n, seen)

    def _map(self, g: FusionGraph, c: str, t: TensorType, k: Kernel, rule: str
             ) -> Candidate | None:
        k, normal = g.normal(k)
        ins = g.typed(k.operands)
        if not _small(k) or ins is None or not all(broadcastable(x.shape, t.shape) for x in ins):
            return None
        if g.dominated(c, k):  # cheaper than typing the body: first
            return None
        if not _infers("map", ins, {"body": k.body}, t):
            return None
        return Candidate(c, "map", k.operands, (("body", k.body),), normal or rule)

    def _maps(self, g: FusionGraph, c: str, t: TensorType, k: Kernel, seen: set
              ) -> Iterator[Candidate]:
        if (c, k) in seen:
            return  # an unchanged consumer was combined with its producers then
        seen.add((c, k))
        same = self._map(g, c, t, k, "fuse_canonical")
        if same is not None:
            yield same
        # inline into the normal form, where each operand class is read at one index, so a
        # producer replaces every read of its value at once
        k, _ = g.normal(k)
        n = len(k.operands)
        for i, oc in enumerate(k.operands):
            for p in g.producers(oc):
                if (c, k, i, p) in seen:
                    continue
                seen.add((c, k, i, p))
                body = merge(k.body, i, p.body, n)
                cand = self._map(g, c, t, Kernel(k.operands[:i] + k.operands[i + 1:] +
                                                 p.operands, body), "fuse_producer")
                if cand is not None:
                    yield cand
        for i in range(n):
            yield from self._epilogue(g, c, t, k, i)

    def _epilogue(self, g: FusionGraph, c: str, t: TensorType, k: Kernel, i: int
                  ) -> Iterator[Candidate]:
        oc = k.operands[i]
        if g.types.get(oc) != t:
            return
        products = [n for n in g.nodes(oc) if n.op in ("matmul", "matmul_t")]
        if not products:
            return  # most operands are no product: the body is not renumbered for them
        # the product becomes $0, the kernel's other operands follow
        rest = k.operands[:i] + k.operands[i + 1:]
        mapping = {j: Arg(j + 1 if j < i else j) for j in range(len(k.operands))}
        mapping[i] = Arg(0)
        body = substitute(k.body, mapping)
        for n in products:
            ta, tb = (dict(n.attrs)["ta"], dict(n.attrs)["tb"]) if n.op == "matmul_t" else (0, 0)
            epi = canonical((oc,) + rest, body, fixed=1)
            operands = n.children + epi.operands[1:]
            ins = g.typed(operands)
            attrs = {"ta": ta, "tb": tb, "body": epi.body}
            if ins is None or len(operands) > MAX_OPERANDS + 2:
                continue
            if not _infers("matmul_epi", ins, attrs, t):
                continue
            yield Candidate(c, "matmul_epi", operands, tuple(attrs.items()), "fuse_epilogue")

    def _reduce(self, g: FusionGraph, c: str, t: TensorType, n: ENode, seen: set
                ) -> Iterator[Candidate]:
        (x,) = n.children
        xt = g.types.get(x)
        if xt is None:
            return
        attrs = {"body": None, "reduce": n.op, "axes": tuple(dict(n.attrs)["axes"])}
        for k in g.kernels(x):
            if (c, n.op, k) not in seen:
                seen.add((c, n.op, k))
                yield from self._map_reduce(g, c, t, k, attrs, xt.shape, "fuse_reduce")

    def _into_map_reduce(self, g: FusionGraph, c: str, t: TensorType, n: ENode, seen: set
                         ) -> Iterator[Candidate]:
        attrs = dict(n.attrs)
        ins = g.typed(n.children)
        if ins is None:
            return
        shape = domain(ins)
        k = Kernel(n.children, attrs["body"])
        for i, oc in enumerate(k.operands):
            for p in g.producers(oc):
                if (c, k, i, p) in seen:
                    continue
                seen.add((c, k, i, p))
                body = merge(k.body, i, p.body, len(k.operands))
                fused = Kernel(k.operands[:i] + k.operands[i + 1:] + p.operands, body)
                yield from self._map_reduce(g, c, t, fused, attrs, shape, "fuse_producer")

    def _map_reduce(self, g: FusionGraph, c: str, t: TensorType, k: Kernel, attrs: dict,
                    shape: tuple[int, ...], rule: str) -> Iterator[Candidate]:
        # a smaller index space would reduce fewer values: it must stay `shape`
        if not same_domain(g, list(k.operands), shape):
            return
        k, normal = g.normal(k, keep=tuple(shape))
        ins = g.typed(k.operands)
        if not _small(k) or ins is None or not same_domain(g, list(k.operands), shape):
            return
        attrs = dict(attrs, body=k.body)
        if _infers("map_reduce", ins, attrs, t):
            yield Candidate(c, "map_reduce", k.operands,
                            tuple((name, attrs[name]) for name, _ in OPS["map_reduce"].attrs),
                            normal or rule)

    # -------------------------------------------------------------- egglog program

    def _programs(self, eg: EGraph, g: FusionGraph, cands: list[Candidate]
                  ) -> Iterator[tuple[list[Any], list[Candidate]]]:
        """egglog programs adding `cands`, CHUNK at a time, each with the candidates it adds.

        Each program runs one rule once: its actions name every class they read by a local
        `let` of a term already in it, build each new term and union it with its class, as a
        rewrite's actions do, and the run rebuilds the e-graph once. Nothing is bound by a
        top-level `let`: egglog makes a table of every global name, and each push and pop of
        the e-graph copies them all (the ~900 names a transformer block's passes bound made
        returning its e-graph to the pool take 20 ms of CPU instead of 9). The rule is built
        as egglog's command objects (`egglog_text`), not parsed: a parsed program costs time
        quadratic in its length.

        No new term is built inside a top-level `union`: egglog 13.2 (commit 2e5657b) there
        sometimes gave it the id of an unrelated e-class (a map fused for rows of `x` landed in
        `w`'s class: an illegal merge when the types differ, a wrong program that reads `w`
        for a row of `x` when they agree)."""
        refs = _Refs(eg, g)
        cands = [c for c in cands if refs.known(c.eclass) and all(map(refs.known, c.operands))]
        for i in range(0, len(cands), CHUNK):
            chunk = cands[i:i + CHUNK]
            refs.clear()
            actions = []
            for cand in chunk:
                target = refs.ref(cand.eclass)
                env = {o: refs.ref(o) for o in cand.operands}
                stmt = Stmt(("_",), cand.op, cand.operands, cand.attrs, (g.types[cand.eclass],))
                actions.append(f"(union {target} {eg._stmt_term(stmt, 0, env)})")
            self.batches += 1
            ruleset = f"fuse_add_{self.batches}"
            yield egglog_text.run_once(ruleset, refs.lines + actions), chunk


class _Refs:
    """A rule's local egglog names for e-classes, each bound by `let` to a term of least
    height."""

    def __init__(self, eg: EGraph, g: FusionGraph):
        self.eg, self.g = eg, g
        self.names: dict[str, str] = {}
        self.lines: list[str] = []
        self.rep = self._representatives()

    def known(self, c: str) -> bool:
        """Whether class `c` has a term to name it by."""
        return c in self.rep

    def clear(self) -> None:
        """Start the names of another rule (a rule's names are its own)."""
        self.names, self.lines = {}, []

    def _representatives(self) -> dict[str, ENode]:
        ser, types = self.g.ser, self.g.types
        users: dict[str, list[ENode]] = {}
        pending: dict[int, int] = {}
        queue: list[ENode] = []
        for n in ser.nodes.values():
            if n.eclass not in types:
                continue
            kids = set(n.children)
            pending[id(n)] = len(kids)
            for k in kids:
                users.setdefault(k, []).append(n)
            if not kids:
                queue.append(n)
        rep: dict[str, ENode] = {}
        head = 0
        while head < len(queue):  # breadth first from the leaves: least height first
            n = queue[head]
            head += 1
            if n.eclass in rep:
                continue
            rep[n.eclass] = n
            for u in users.get(n.eclass, ()):
                pending[id(u)] -= 1
                if pending[id(u)] == 0:
                    queue.append(u)
        return rep

    def ref(self, c: str) -> str:
        """The name of known class `c`, its `let` (and its children's) added first."""
        if c in self.names:
            return self.names[c]
        # children first, without recursion (terms may be deep)
        stack = [(c, False)]
        while stack:
            cid, ready = stack.pop()
            if cid in self.names:
                continue
            node = self.rep[cid]
            if not ready:
                stack.append((cid, True))
                stack += [(k, False) for k in node.children if k not in self.names]
                continue
            name = f"fr{len(self.names)}"
            self.lines.append(f"(let {name} {self._term(cid, node)})")
            self.names[cid] = name
        return self.names[c]

    def _term(self, c: str, n: ENode) -> str:
        attrs = dict(n.attrs)
        if n.op == "param":
            return f"(Param {json.dumps(attrs['function'])} {json.dumps(attrs['name'])})"
        if n.op == "const":
            return const_term(attrs["value"], self.g.types[c], rounded=False)
        kids = [self.names[k] for k in n.children]
        if n.op == "call":
            return f"(Op_call {json.dumps(attrs['callee'])} {_list(kids)} {attrs['index']})"
        stmt = Stmt(("_",), n.op, n.children, n.attrs, (self.g.types[c],))
        return self.eg._stmt_term(stmt, 0, dict(zip(n.children, kids)))
