"""Programs go to egglog one top-level command at a time, and mean what they meant whole."""

import time

import pytest

import eqsat
from eqsat.rules import egglog_parse, schema
from eqsat.rules.compile import compile_ruleset
from eqsat.rules.egglog_native import bindings


def _shown(commands: list) -> list[str]:
    return [str(c) for c in commands]


@pytest.mark.parametrize("checks", [True, False])
def test_the_schema_and_the_rule_set_parse_to_the_same_commands(checks):
    for program in (schema.prelude(checks), compile_ruleset(eqsat.rules.default())):
        native = bindings.EGraph()
        whole = native.parse_program(program)
        assert len(egglog_parse.commands(program)) == len(whole) > 100
        assert _shown(egglog_parse.parse(native, program)) == _shown(whole)


def test_strings_comments_and_blanks_do_not_cut_a_command():
    program = ('; a comment with a ( paren\n(let a "x ) ; y")\n\n'
               '(let b "q\\")(")  ; trailing ) comment\n(let c 1)\n; the end\n')
    assert egglog_parse.commands(program) == [
        '; a comment with a ( paren\n(let a "x ) ; y")', '\n\n(let b "q\\")(")',
        '  ; trailing ) comment\n(let c 1)']
    native = bindings.EGraph()
    assert _shown(egglog_parse.parse(native, program)) == _shown(
        native.parse_program(program))


@pytest.mark.parametrize("program", ["(let a 1))", "(let a (", "(let a 1) stray", ")("])
def test_a_malformed_program_goes_whole_so_egglog_reports_it(program):
    assert egglog_parse.commands(program) == [program]
    native = bindings.EGraph()
    with pytest.raises(Exception) as split:
        egglog_parse.parse(native, program)
    with pytest.raises(Exception) as whole:
        native.parse_program(program)
    assert str(split.value) == str(whole.value)


def test_parsing_by_commands_is_linear():
    """Parsed whole, each span copies the program's text: 400 commands took ~4x 200's."""
    native = bindings.EGraph()

    def seconds(n: int) -> float:
        program = "".join(f"(let v{i} (+ {i} 1))\n" for i in range(n))
        t0 = time.process_time()
        egglog_parse.parse(native, program)
        return time.process_time() - t0

    seconds(50)
    small, large = min(seconds(500) for _ in range(3)), min(seconds(2000) for _ in range(3))
    assert large < 8 * small, (small, large)
