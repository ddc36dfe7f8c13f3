"""egglog_text builds from action text the command objects egglog's parser would, without
the parser's spans (which make a parsed program quadratic in its length); the fusion pass adds
its terms that way. Building them is a native call: the interpreter's exit waits for it."""

import math
import re
import subprocess
import sys

import pytest

from eqsat.rules import egglog_text
from eqsat.rules.egglog_native import bindings

_SCHEMA = """(datatype E (N i64) (F f64) (S String) (B bool) (P E E))
(function tag (E) i64 :merge new)"""

_ACTIONS = [
    '(let a (P (N 3) (N -42)))',
    '(let b (P a (F 0.125)))',
    '(union b (P (F 1e-05) (F -2.5)))',
    '(P (F NaN) (F inf)) (P (F -inf) (F 5.0))',
    r'(S "q\"uote \\ back\nline\ttab $0 (paren)")',
    '(P (B true) (B false))',
    '(S "") (N 9223372036854775807) (N -9223372036854775808)',
    '(let big (S "x"))  (union big (N +7))',
]


def _run(commands: list) -> str:
    native = bindings.EGraph()
    native.run_program(*native.parse_program(_SCHEMA))
    native.run_program(*commands)
    return native.serialize([]).to_json()


def test_actions_build_what_egglog_parses():
    native = bindings.EGraph()
    text = f"(ruleset r)\n(rule () ({' '.join(_ACTIONS)}) :ruleset r :name \"r\")\n(run r 1)"
    parsed = _run(native.parse_program(text))
    built = _run(egglog_text.run_once("r", _ACTIONS))
    assert built == parsed
    assert "uote" in built and "9223372036854775807" in built  # both were made


def test_atoms_read_as_egglog_reads_them():
    (n, f, neg, nan, s, v, t) = egglog_text.actions('7 0.5 -inf NaN "a\\tb" name true')
    assert n.expr.value.value == 7 and f.expr.value.value == 0.5
    assert neg.expr.value.value == -math.inf and math.isnan(nan.expr.value.value)
    assert s.expr.value.value == "a\tb" and v.expr.name == "name"
    assert t.expr.value.value is True


def test_a_repeated_term_is_built_once(monkeypatch):
    # each object's constructor costs ~1 us per operand that is not a literal: a rule's
    # repeated operand lists and shapes are built once, and the rule is the same
    made = []
    call = bindings.Call

    def counting(span, name, args):
        made.append(name)
        return call(span, name, args)

    text = ["(let a (P (P (N 1) (N 2)) (N 3)))", "(let b (P (P (N 1) (N 2)) (N 4)))"]
    monkeypatch.setattr(bindings, "Call", counting)
    built = egglog_text.run_once("r", text)
    monkeypatch.undo()
    assert made.count("P") == 3 and made.count("N") == 4  # (P (N 1) (N 2)) once
    assert str(built) == str(egglog_text.run_once("r", text))
    assert _run(built) == _run(bindings.EGraph().parse_program(
        f"(ruleset r)\n(rule () ({' '.join(text)}) :ruleset r :name \"r\")\n(run r 1)"))


@pytest.mark.parametrize("text, message", [
    ('(S "a\\qb")', "unrecognized escape"),
    ("(P (N 1)", "unbalanced '('"),
    ("(N 1))", "unbalanced ')'"),
    ("((N 1) 2)", "starts with a name"),
])
def test_text_it_cannot_read_is_an_error(text, message):
    with pytest.raises(egglog_text.EgglogTextError, match=re.escape(message)):
        egglog_text.actions(text)


EXIT_WHILE_BUILDING = """
import threading, time
from eqsat.rules import egglog_text
actions = [f"(union a{i} (Op_add (Op_neg a{i}) (Op_exp (Param {i} \\"f32\\"))))"
           for i in range(64)]
started = threading.Event()

def build() -> None:
    while True:
        started.set()
        egglog_text.run_once("r", actions)

threading.Thread(target=build, daemon=True).start()
started.wait()
time.sleep(0.1)
"""


def test_exit_while_a_daemon_thread_builds_commands_is_clean():
    """The command objects' constructors release and re-take the GIL (pyo3 normalizes the
    exception of each failed try of an enum's variant with the GIL released). A daemon thread
    building them while the interpreter was finalizing panicked inside Rust ("the Python
    interpreter is not initialized") and mostly hung there until the process ended, sometimes
    segfaulted or aborted: 19 of 20 runs of this script, before construction was a native
    call that exit waits for."""
    for _ in range(3):
        done = subprocess.run([sys.executable, "-c", EXIT_WHILE_BUILDING], timeout=60,
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
        assert "panicked" not in done.stderr, done.stderr[-2000:]
