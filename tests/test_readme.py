"""The README's examples run as written, so a stale one fails the suite.

Every fenced block of README.md is one test, named by the line of its opening fence. Python
blocks run (one that uses names it does not bind runs after the Python blocks above it, in one
namespace, as a reader pasting them into one interpreter would), and what a comment says one
prints is checked (PRINTS); a `>>>` block must raise exactly the error it shows; IR text
parses and verifies, lone IR statements do so in a function over STATEMENT_PARAMS, and the
adjoint shown for the bundled MLP is the one `differentiate` generates; rule text loads; a
`$ eqsat ...` transcript runs and prints what it shows (times and speedups aside); a synopsis
of the command line names only options and values the command takes. Inline code spans that
are whole rules (`rule r: ... => ...` or `... => ...`) load too. Commands that cannot run here
are listed in SKIPPED with the reason, so their block shows as skipped rather than vanishes.
"""
from __future__ import annotations

import builtins
import contextlib
import io
import re
import shlex
import symtable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

import eqsat
from eqsat import cli
from eqsat.ir.printer import format_function

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MLP = ROOT / "eqsat" / "examples" / "mlp.eqir"

# Commands that cannot run inside the suite, with why (a block of only these is skipped).
SKIPPED = {
    "make demo": "builds a virtual environment; tests/test_demo.py runs the demo itself",
    "make test": "builds a virtual environment and runs the whole suite, this file included",
}

# Names a README block uses and leaves to the reader to supply.
READER_SUPPLIES = {"my_pipeline": lambda m: eqsat.parse(str(m))}

# Operand types for the README's lone IR statements (a statement shows no parameter types).
STATEMENT_PARAMS = {
    "%y": "%x: f32[1024], %w: f32[1024], %b: f32[1024]",
    "%s": "%x: f32[128,16], %y: f32[128,16]",
    "%c": "%a: f32[16,64], %b: f32[16,32]",
    "%h": "%x: f32[128,784], %w: f32[784,10], %bias: f32[10]",
}

# What a Python block prints, where the README shows it in a comment: (a snippet that picks
# the block, a pattern its output must match).
PRINTS = [
    ("# rule sq_sqrt is unsound",
     r"rule sq_sqrt is unsound: .*\n\s*counterexample: \?x = \S+ \[?-\d"),
]

# A test a Python block defines (a hypothesis @given) is run with few examples.
BLOCK_TEST_EXAMPLES = 5


@dataclass(frozen=True)
class Block:
    line: int  # of the opening fence, 1-based
    lang: str
    text: str

    @property
    def kind(self) -> str:
        first = next((ln.strip() for ln in self.text.splitlines() if ln.strip()), "")
        if self.lang == "python":
            return "doctest" if first.startswith(">>>") else "python"
        if self.lang in ("sh", "shell"):
            return "shell"
        if self.lang in ("", "eqir"):
            if first.startswith("$ "):
                return "transcript"
            if first.startswith("rule "):
                return "rules"
            return "statements" if first.startswith("%") else "ir"
        return f"unknown language {self.lang!r}"


def readme_blocks() -> list[Block]:
    """The fenced blocks of README.md, in order."""
    blocks, lines = [], README.read_text().splitlines()
    start = lang = None
    for k, ln in enumerate(lines):
        if not ln.startswith("```"):
            continue
        if start is None:
            start, lang = k, ln[3:].strip()
        else:
            blocks.append(Block(start + 1, lang, "\n".join(lines[start + 1:k]) + "\n"))
            start = None
    assert start is None, f"README.md:{start + 1}: a fence is never closed"
    return blocks


BLOCKS = readme_blocks()
PYTHON = [b for b in BLOCKS if b.kind == "python"]


def _param(b: Block) -> Any:
    """`b` as a test case; skipped, with the reasons, where all its commands are in SKIPPED."""
    commands = [c for c in (ln.split("#")[0].strip() for ln in b.text.splitlines()) if c]
    skipped = b.kind == "shell" and all(c in SKIPPED for c in commands)
    marks = [pytest.mark.skip(reason="; ".join(SKIPPED[c] for c in commands))] if skipped else []
    return pytest.param(b, id=f"README.md:{b.line}-{b.kind.split()[0]}", marks=marks)


def run_python(b: Block, namespace: dict) -> str:
    """Run block `b` in `namespace`, then any test it defines; what it printed."""
    before = set(namespace)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile("\n" * b.line + b.text, str(README), "exec"), namespace)  # README's lines
        for name in sorted(set(namespace) - before):
            if name.startswith("test_") and callable(namespace[name]):
                settings(max_examples=BLOCK_TEST_EXAMPLES, deadline=None)(namespace[name])()
    return out.getvalue()


@pytest.mark.parametrize("block", [_param(b) for b in BLOCKS])
def test_readme_block(block: Block) -> None:
    check = CHECKS.get(block.kind)
    assert check is not None, (f"README.md:{block.line}: no test knows this block "
                               f"({block.kind}); teach tests/test_readme.py or list it in SKIPPED")
    check(block)


def unbound_names(source: str) -> set[str]:
    """The names `source` reads and never binds (nor Python does): what it takes from the
    blocks above it."""
    top = symtable.symtable(source, "<readme>", "exec")
    bound = {s.get_name() for s in top.get_symbols() if s.is_assigned() or s.is_imported()}
    used, tables = set(), [top]
    while tables:
        t = tables.pop()
        tables += t.get_children()
        used |= {s.get_name() for s in t.get_symbols()
                 if s.is_referenced() and (t is top or s.is_global())}
    return used - bound - set(dir(builtins))


def check_python(b: Block) -> None:
    """A block that uses names it does not bind continues the Python blocks above it: they run
    first, in its namespace."""
    namespace = {"__name__": "readme", **READER_SUPPLIES}
    continues = unbound_names(b.text) - set(READER_SUPPLIES)
    for earlier in PYTHON[:PYTHON.index(b)] if continues else []:
        try:
            run_python(earlier, namespace)
        except Exception as e:  # a test of its own reports it; say why this one cannot run
            pytest.fail(f"the Python block at README.md:{earlier.line}, which this one "
                        f"continues, fails: {type(e).__name__}: {e}")
    printed = run_python(b, namespace)
    for snippet, pattern in PRINTS:
        if snippet in b.text:
            assert re.search(pattern, printed), f"printed {printed!r}, not {pattern!r}"


def check_doctest(b: Block) -> None:
    """`>>> expression` followed by the `module.Error: message` line it raises."""
    lines = [ln for ln in b.text.splitlines() if ln.strip()]
    assert len(lines) == 2 and lines[0].startswith(">>> "), "one >>> line, then its error"
    with pytest.raises(Exception) as e:
        eval(lines[0][4:], {"eqsat": eqsat})
    cls = e.type
    assert f"{cls.__module__}.{cls.__qualname__}: {e.value}" == lines[1]


def check_ir(b: Block) -> None:
    m = eqsat.parse(b.text)
    assert eqsat.parse(str(m)) == m
    if [f.name for f in m.functions] == ["loss_grad"]:  # the bundled MLP's adjoint
        got = eqsat.differentiate(eqsat.parse(MLP.read_text()))["loss_grad"]
        assert format_function(got) == format_function(m["loss_grad"])


def check_statements(b: Block) -> None:
    for stmt in filter(None, (ln.strip() for ln in b.text.splitlines())):
        result, rhs = stmt.split(" = ", 1)
        params = STATEMENT_PARAMS.get(result)
        assert params, f"add the operand types of {result} to STATEMENT_PARAMS"
        rtype = rhs.rsplit(" : ", 1)[1]
        m = eqsat.parse(f"func @f({params}) -> {rtype} {{\n  {stmt}\n  return {result}\n}}")
        assert f"  {stmt}" in str(m).splitlines(), "the statement prints as written"


def check_rules(b: Block) -> None:
    rules = eqsat.rules.parse(b.text)
    assert str(eqsat.rules.parse(str(rules))) == str(rules)


def check_transcript(b: Block) -> None:
    """`$ eqsat ARGS [> /dev/null]` then the lines it prints, up to a `...`; times, rates and
    speedups differ from machine to machine and are compared as numbers only."""
    lines = b.text.splitlines()
    argv = shlex.split(lines[0][2:])
    assert argv[0] == "eqsat", "a transcript of the eqsat command"
    quiet = argv[-2:] == [">", "/dev/null"]
    argv = argv[1:-2] if quiet else argv[1:]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        assert cli.main(argv) == 0
    shown = [ln for ln in lines[1:] if ln.strip()]
    if shown and shown[-1] == "...":
        shown = shown[:-1]
    printed = [ln for ln in (err.getvalue() if quiet else out.getvalue() + err.getvalue())
               .splitlines() if ln.strip()]
    assert [_shape(ln) for ln in printed[:len(shown)]] == [_shape(ln) for ln in shown]


def _shape(line: str) -> str:
    """`line` with durations and ratios as `#`, and columns (and their rules) of any width."""
    line = re.sub(r"\b\d+(\.\d+)?(us|ms|s|x)\b", "#", line)
    return " ".join(re.sub(r"--+", "-", line).split())


def check_shell(b: Block) -> None:
    """Each `eqsat SUB ...` synopsis: every option it shows parses, with each value it lists."""
    for ln in b.text.splitlines():
        command = ln.split("#")[0].strip()
        if not command or command in SKIPPED:
            continue
        assert command.startswith("eqsat "), f"{command!r}: no test runs it; list it in SKIPPED"
        for argv in _synopsis_argvs(command.split(None, 2)[1], command.split(None, 2)[2]):
            try:
                cli.build_parser().parse_args(argv)
            except SystemExit:
                pytest.fail(f"eqsat {' '.join(argv)}: the command line refuses it")


def _synopsis_argvs(sub: str, synopsis: str) -> list[list[str]]:
    """One argv per option (and per value it lists) of `sub`'s synopsis, with the required
    arguments: `FILE... [-i|--check]` gives `fmt FILE -i` and `fmt FILE --check`."""
    required: list[str] = []
    optional: list[list[str]] = []
    groups = re.findall(r"\[([^\]]*)\]|(\S+)", synopsis)
    unbracketed = [u for g, u in groups if u]
    k = 0
    while k < len(unbracketed):
        token = unbracketed[k].removesuffix("...")
        if token.startswith("-") and k + 1 < len(unbracketed):
            required += [token, unbracketed[k + 1]]
            k += 1
        else:
            required.append(token)
        k += 1
    for group, _ in groups:
        tokens = [t for t in group.split() if t != "|"]
        if not tokens:
            continue
        if all(part.startswith("-") for t in tokens for part in t.split("|")):
            optional += [[flag] for t in tokens for flag in t.split("|")]
        else:
            flag, value = tokens
            optional += [[flag, v] for v in value.split("|")]
    return [[sub, *required, *extra] for extra in optional]


def test_every_output_check_finds_its_block() -> None:
    for snippet, _ in PRINTS:
        assert any(snippet in b.text for b in PYTHON), f"no README block has {snippet!r}"


def test_inline_rules_load() -> None:
    """Rules quoted inline (`rule name: lhs => rhs`, or a bare `lhs => rhs`) parse as written."""
    spans = re.findall(r"(?<!`)`([^`\n]*=>[^`\n]*)`(?!`)", README.read_text())
    assert spans, "the README quotes rules inline"
    for k, span in enumerate(spans):
        text = span if span.startswith("rule ") else f"rule readme_{k}: {span}"
        try:
            eqsat.rules.parse(text)
        except eqsat.Error as e:
            pytest.fail(f"README rule `{span}` does not load: {e}")


CHECKS = {"python": check_python, "doctest": check_doctest, "ir": check_ir,
          "statements": check_statements, "rules": check_rules,
          "transcript": check_transcript, "shell": check_shell}
