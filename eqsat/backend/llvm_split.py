"""Cut a program's LLVM IR text into parts that compile separately, for parallel compilation.

LLVM's pipeline and code generation are most of a cold compile and work function by function,
so a module cut into parts of about equal cost (`_cost`: instructions, and a fixed cost per
function) compiles in about the time of its largest part when each part compiles in its own
process (see compile_workers.py). The unit of the cut is a
*cluster*: an entry function with its out-of-line parts, or a kernel `kN` the thread pool runs
with the functions named `kN.*` that only it calls (its thread task, epilogue, body). Helpers
every kernel may call (the math library, streaming copies, packing loops) and kernels called
directly (`_called_directly`) are internal and stateless: each part gets its own copy of those
it reaches. A function one part calls and another defines (only a thread task, in practice)
becomes external in its own part and is declared in the other; everything else keeps its
linkage, so a kernel still inlines into the entry of its part. Kernels whose bodies are equal
up to their names go to one part, where the pipeline's function merging keeps one of them.

The text is the one llvmlite's printer writes (cpu.lower): top-level definitions start at
column 0 with `define` and end at a line `}`; everything else (the header, declarations,
constant globals, metadata) is one line and goes to every part.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

_NAME = re.compile(r'@"([^"]+)"|@([-\w.$]+)')
_KERNEL = re.compile(r"(k\d+)(\..*)?$")
_ENTRY = re.compile(r"(eqsat\.fn\..+?)(\.part\d+)?$")


@dataclass
class _Function:
    name: str
    lines: list[str]
    calls: set[str] = field(default_factory=set)

    @property
    def internal(self) -> bool:
        return self.lines[0].startswith("define internal ")


def _names(text: str) -> set[str]:
    return {a or b for a, b in _NAME.findall(text)}


def _parse(text: str) -> tuple[list[str], dict[str, _Function]]:
    """The module's one-line items in order, and its function definitions by name."""
    lines = text.splitlines()
    other: list[str] = []
    functions: dict[str, _Function] = {}
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.startswith("define "):
            other.append(line)
            i += 1
            continue
        end = lines.index("}", i)
        name = _NAME.search(line.split("(", 1)[0])
        if name is None:
            raise ValueError(f"no function name in {line!r}")
        fn = _Function(name.group(1) or name.group(2), lines[i:end + 1])
        fn.calls = _names("\n".join(fn.lines)) - {fn.name}
        functions[fn.name] = fn
        i = end + 1
    return other, functions


def _cluster(name: str) -> str | None:
    """The cluster a function belongs to, or None for a shared helper."""
    m = _KERNEL.match(name) or _ENTRY.match(name)
    return m.group(1) if m else None


def _called_directly(functions: dict[str, _Function]) -> set[str]:
    """The kernels that are called other than through their thread task. LLVM specializes an
    internal kernel on the constant extent its callers pass (a loop over 4 elements becomes 4
    statements); made external for a caller in another part, one lost that and compiled to
    several times the code (a long chain of small ops: a part took 1.35x the whole module's
    time). Such kernels are copied into each part that calls them, as helpers are; those the
    pool runs (by their `.thread` task, extents read at run time) are placed like any
    cluster."""
    out = set()
    for caller, fn in functions.items():
        for callee in fn.calls:
            c = _cluster(callee) if callee in functions else None
            if c is not None and c.startswith("k") and c != _cluster(caller) \
                    and not callee.endswith(".thread"):
                out.add(c)
    return out


# What a function costs LLVM beyond its instructions, in instructions. Fitted to the compile
# times of the benchmark programs' clusters compiled alone (llvmlite 0.50, O2): about 7 ms a
# function and 5-25 us an instruction; a kernel's small out-of-line parts (thread task,
# epilogue, its body) each run the whole pipeline, and its inner loops, however short, are
# vectorized into many times their code. Balanced by lines instead, the transformer block's
# larger part took 1.25x the mean of two (1.2x of three); with this, 1.0-1.05x.
FUNCTION_COST = 100


def _cost(fn: _Function) -> int:
    """An estimate of the LLVM time of `fn`, in instructions: its instructions (the printer
    indents them; labels and braces are at column 0) and `FUNCTION_COST`."""
    return FUNCTION_COST + sum(line.startswith("  ") for line in fn.lines)


def _declaration(fn: _Function) -> str:
    head = fn.lines[0].rstrip().removesuffix("{").rstrip()
    return "declare " + head.removeprefix("define ").removeprefix("internal ")


def split(text: str, parts: int, min_cost: int = 0) -> list[str]:
    """`text` cut into at most `parts` modules of about equal cost (`_cost`) that together
    define what it defines (one part, the text itself, when its functions cost less than
    `min_cost` or it has fewer clusters than parts)."""
    other, functions = _parse(text)
    by_cluster: dict[str | None, list[str]] = {}
    for name in functions:
        by_cluster.setdefault(_cluster(name), []).append(name)
    direct = _called_directly(functions)
    clusters: dict[str, list[str]] = {}
    shared: dict[str, _Function] = {}  # internal, copied into each part that reaches them
    for c, names in by_cluster.items():
        if c is None:  # helpers: copied if internal, else placed as a cluster of their own
            for n in names:
                if functions[n].internal:
                    shared[n] = functions[n]
                else:
                    clusters[n] = [n]
        elif c in direct and all(functions[n].internal for n in names):
            shared.update((n, functions[n]) for n in names)
        else:
            clusters[c] = names

    def reach(names: list[str]) -> set[str]:
        """The shared functions `names` call, directly or through other shared ones."""
        seen: set[str] = set()
        todo = [c for n in names for c in functions[n].calls if c in shared]
        while todo:
            h = todo.pop()
            if h not in seen:
                seen.add(h)
                todo += [c for c in shared[h].calls if c in shared]
        return seen

    helpers = {c: reach(names) for c, names in clusters.items()}
    weight = {c: sum(_cost(functions[n]) for n in names) +
              sum(_cost(shared[h]) for h in helpers[c]) for c, names in clusters.items()}
    if parts < 2 or len(clusters) < 2 or sum(weight.values()) < min_cost:
        return [text]

    # equal kernels (up to their names) stay together, where function merging finds them
    equal: dict[str, list[str]] = {}
    for c, names in clusters.items():
        body = "\n".join("\n".join(functions[n].lines) for n in names)
        digest = hashlib.sha1(re.sub(rf'@"{re.escape(c)}\b', '@"k', body).encode()).hexdigest()
        equal.setdefault(digest, []).append(c)
    load = [0] * parts
    owner: dict[str, int] = {}
    for members in sorted(equal.values(), key=lambda g: (-weight[g[0]], g[0])):
        p = load.index(min(load))
        load[p] += weight[members[0]]
        for c in members:
            for n in clusters[c]:
                owner[n] = p
    used = sorted(set(owner.values()))
    if len(used) < 2:
        return [text]

    crossing = {callee for caller, p in owner.items() for callee in functions[caller].calls
                if callee in owner and owner[callee] != p}
    crossing |= {callee for h in shared.values() for callee in h.calls if callee in owner}
    out = []
    for p in used:
        mine = [n for n in functions if owner.get(n) == p]
        needed = reach(mine)
        declared = {c for n in mine for c in functions[n].calls if c in owner and owner[c] != p}
        declared |= {c for h in needed for c in shared[h].calls if c in owner and owner[c] != p}
        body: list[str] = []
        for name, fn in functions.items():
            if name in needed:
                body += fn.lines
            elif owner.get(name) == p:
                head = fn.lines[0]
                if name in crossing and fn.internal:
                    head = "define " + head.removeprefix("define internal ")
                body += [head, *fn.lines[1:]]
            elif name in declared:
                body.append(_declaration(fn))
        out.append("\n".join(other + body) + "\n")
    return out
