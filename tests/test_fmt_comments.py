"""`eqsat fmt` keeps comments: where each kind goes, and random comments on random programs
survive exactly once, in order, with the program unchanged and the output a fixed point."""

from __future__ import annotations

from importlib import resources

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import eqsat
from eqsat.cli import main
from eqsat.ir.formatter import format_source
from eqsat.ir.parser import tokenize
from eqsat.testing import modules

EXAMPLES = ("mlp.eqir", "transformer.eqir")

MESSY = """\
# header
# more

module @m   # the module
# about f

# still about f
func @f(%x: f32[4],   # inside the header
        %y: f32[4]) -> f32[4] {  # after the header
  # before %a
	%a = neg %x : f32[4]    # after %a
      %b = add %a,
  # inside %b
        %y : f32[4]  # after %b
  # before the return
  return %b  # after the return

  # after the last statement
}  # after the brace

# about g
func @g = vjp @f wrt %x # after g
# end 1

# end 2
"""

FORMATTED = """\
# header
# more
module @m  # the module

# about f
# still about f
# inside the header
func @f(%x: f32[4], %y: f32[4]) -> f32[4] {  # after the header
  # before %a
  %a = neg %x : f32[4]  # after %a
  # inside %b
  %b = add %a, %y : f32[4]  # after %b
  # before the return
  return %b  # after the return
  # after the last statement
}  # after the brace

# about g
func @g = vjp @f wrt %x  # after g

# end 1
# end 2
"""


def comments(text: str) -> list[str]:
    return [t.text for t in tokenize(text, comments=True) if t.kind == "comment"]


def test_each_place_a_comment_can_be():
    assert format_source(MESSY) == FORMATTED
    assert format_source(FORMATTED) == FORMATTED
    assert eqsat.parse(FORMATTED) == eqsat.parse(MESSY)


def test_without_comments_the_text_is_the_printers():
    m = eqsat.parse(MESSY)
    assert format_source(str(m)) == str(m)
    assert format_source("func @f(%x: f32[]) -> f32[] { return %x }") == str(
        eqsat.parse("func @f(%x: f32[]) -> f32[] { return %x }"))


@pytest.mark.parametrize("text, formatted", [
    # no module line: the printer's `module @main` comes first, the comment stays on @f
    ("# on f\nfunc @f(%x: f32[]) -> f32[] { return %x }",
     "module @main\n\n# on f\nfunc @f(%x: f32[]) -> f32[] {\n  return %x\n}\n"),
    # only comments: they end the file
    ("# a\n\n  # b  \t\n", "module @main\n\n# a\n# b\n"),
    ("module @m # m\n# end", "module @m  # m\n\n# end\n"),
    # one line of several items: an end-of-line comment is the last item's
    ("module @m func @f(%x: f32[]) -> f32[] { %y = neg %x : f32[] return %y }  # last\n",
     ("module @m\n\nfunc @f(%x: f32[]) -> f32[] {\n  %y = neg %x : f32[]\n  return %y\n"
      "}  # last\n")),
    # a comment between the return and its names is inside the return
    ("module @m\nfunc @f(%x: f32[]) -> f32[] {\n  return # r\n %x\n}\n",
     "module @m\n\nfunc @f(%x: f32[]) -> f32[] {\n  # r\n  return %x\n}\n"),
    # the text after `#` is kept byte for byte, but for the whitespace that ends it
    ("module @m #\t#x  é\u2028\x0c y \t\x0c\v\n", "module @m  #\t#x  é\u2028\x0c y\n"),
    ("\ufeffmodule @m\r\n# a\r\n\r\n# b\r", "module @m\n\n# a\n# b\n"),
])
def test_placements(text, formatted):
    assert format_source(text) == formatted
    assert format_source(formatted) == formatted
    assert eqsat.parse(formatted) == eqsat.parse(text)


@pytest.mark.parametrize("name", EXAMPLES)
def test_bundled_examples_are_canonical_with_their_comments(name, tmp_path, capsys):
    text = resources.files("eqsat.examples").joinpath(name).read_text()
    p = tmp_path / name
    p.write_text(text)
    assert main(["fmt", "-i", str(p)]) == 0
    assert p.read_text() == text
    assert main(["fmt", "--check", str(p)]) == 0
    assert comments(text)
    assert capsys.readouterr().err == ""


def test_fmt_in_place_keeps_comments(tmp_path, capsys):
    p = tmp_path / "messy.eqir"
    p.write_text(MESSY)
    assert main(["fmt", "--check", str(p)]) == 1
    assert main(["fmt", str(p)]) == 0
    assert capsys.readouterr().out == FORMATTED
    assert main(["fmt", "-i", str(p)]) == 0
    assert p.read_text() == FORMATTED
    assert main(["fmt", "--check", str(p)]) == 0


SETTINGS = settings(max_examples=150, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow])

COMMENT_TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n"),
                       max_size=8)
SPACE = st.text(" \t", max_size=3)


@st.composite
def commented(draw) -> tuple[str, str, list[str]]:
    """The canonical text of a random module with comments at random lines (full-line ones
    with random indentation and blank lines between them, end-of-line ones with random
    spacing), what fmt must make of it, and the comments' texts in order."""
    lines = str(draw(modules(max_functions=2, max_stmts=4))).split("\n")[:-1]
    source: list[str] = []
    expected: list[str] = []
    texts: list[str] = []
    pending: list[str] = []

    def comment() -> str:
        text = f"#{len(texts)}{draw(COMMENT_TEXT)}"
        texts.append(text.rstrip(" \t\f\v"))
        return text

    for k, line in enumerate(lines + [None]):
        for _ in range(draw(st.integers(0, 2))):
            source += [""] * draw(st.integers(0, 1))
            pending.append(comment())
            source.append(draw(SPACE) + pending[-1])
        if line is None:
            break
        if not line:
            source.append(line)
            expected.append(line)
            continue
        indent = "  " if line.startswith("  ") or line == "}" else ""
        expected += [indent + c.rstrip(" \t\f\v") for c in pending]
        pending = []
        if draw(st.booleans()):
            eol = comment()
            source.append(line + draw(SPACE) + eol)
            expected.append(line + "  " + eol.rstrip(" \t\f\v"))
        else:
            source.append(line)
            expected.append(line)
    if pending:
        expected += ["", *(c.rstrip(" \t\f\v") for c in pending)]
    return "\n".join(source) + "\n", "\n".join(expected) + "\n", texts


@SETTINGS
@given(commented())
def test_random_comments_at_random_lines(case):
    source, expected, texts = case
    out = format_source(source)
    assert out == expected
    assert comments(out) == texts
    assert eqsat.parse(out) == eqsat.parse(source)
    assert format_source(out) == out


@SETTINGS
@given(st.data())
def test_random_comments_between_random_tokens(data):
    """Items broken over lines at random spaces, with comments in the breaks: every comment
    survives once, in order; the program is the same; fmt of the output is the output."""
    m = data.draw(modules(max_functions=2, max_stmts=4))
    pieces = str(m).split(" ")
    texts: list[str] = []
    source = pieces[0]
    for piece in pieces[1:]:
        gap = data.draw(st.sampled_from([" ", "\n", "comment", "line comment"]))
        if gap.endswith("comment"):
            text = f"#{len(texts)}{data.draw(COMMENT_TEXT)}"
            texts.append(text.rstrip(" \t\f\v"))
            gap = (" " if gap == "comment" else "\n  ") + text + "\n"
        source += gap + piece
    out = format_source(source)
    assert comments(out) == texts
    assert eqsat.parse(out) == m
    assert format_source(out) == out
    if not texts:
        assert out == str(m)
