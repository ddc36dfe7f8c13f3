"""`eqsat opt`: optimized text out, the report on stderr, Graphviz before/after, rule files,
limits, and errors as FILE:LINE:COL: message with exit status 1."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import eqsat.extract as ex
from eqsat.cli import main, parse_limits
from eqsat.errors import Error
from eqsat.ir import parse
from eqsat.rules import Limits
from eqsat.testing.equivalence import assert_equivalent

MLP = Path(ex.__file__).parent.parent / "examples" / "mlp.eqir"
IDENT = """module @m

func @f(%x: f32[8], %y: f32[8]) -> f32[8] {
  %one = const 1.0 : f32[8]
  %a = mul %x, %one : f32[8]
  %b = neg %a : f32[8]
  %c = neg %b : f32[8]
  %d = add %c, %y : f32[8]
  return %d
}
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_opt_writes_an_equivalent_cheaper_module(tmp_path, capsys):
    src = write(tmp_path, "in.eqir", IDENT)
    out = tmp_path / "out.eqir"
    assert main(["opt", str(src), "-o", str(out), "--target", "cuda"]) == 0
    assert capsys.readouterr().out == ""
    result = parse(out.read_text())
    assert [s.op for s in result["f"].body] == ["add"]
    assert_equivalent(parse(IDENT), result, trials=5)


def test_opt_to_stdout_with_report_on_stderr(capsys):
    assert main(["opt", str(MLP), "--report", "--target", "cuda"]) == 0
    cap = capsys.readouterr()
    result = parse(cap.out)
    assert [f.name for f in result.functions] == ["predict", "loss", "loss_grad"]
    assert "saturation stopped" in cap.err and "@loss_grad" in cap.err and "speedup" in cap.err
    assert_equivalent(parse(MLP.read_text()), result, trials=3)


def test_opt_dot_has_before_and_after_clusters(tmp_path, capsys):
    dot = tmp_path / "g.dot"
    assert main(["opt", str(write(tmp_path, "in.eqir", IDENT)), "--dot", str(dot)]) == 0
    capsys.readouterr()
    text = dot.read_text()
    assert text.startswith('digraph "m" {') and text.rstrip().endswith("}")
    assert '"cluster_before"' in text and '"cluster_after"' in text
    assert text.count("{") == text.count("}")
    declared = set(re.findall(r'^\s*("[^"]+") \[', text, re.M))
    edges = re.findall(r'^\s*("[^"]+") -> ("[^"]+")', text, re.M)
    assert edges and all(a in declared and b in declared for a, b in edges)
    before = [d for d in declared if d.startswith('"before/f/#') and d != '"before/f/#return"']
    after = [d for d in declared if d.startswith('"after/f/#') and d != '"after/f/#return"']
    assert len(before) == 5 and len(after) == 1


def test_opt_with_a_rule_file_and_the_default_set(tmp_path, capsys):
    src = write(tmp_path, "in.eqir", IDENT)
    rules = write(tmp_path, "mine.rules", "rule nn: neg(neg(?x)) => ?x\n")
    assert main(["opt", str(src), "--rules", str(rules), "--target", "cuda", "--report"]) == 0
    cap = capsys.readouterr()
    ops = [s.op for s in parse(cap.out)["f"].body]
    assert ops == ["const", "mul", "add"]  # only neg(neg(x)) known: x*1 stays
    assert "nn=" in cap.err
    assert main(["opt", str(src), "--rules", str(rules), "--rules", "default"]) == 0
    assert [s.op for s in parse(capsys.readouterr().out)["f"].body] == ["add"]
    # 'ieee': the built-in set without the rules that change results at inf and NaN
    assert main(["opt", str(src), "--rules", "ieee", "--report"]) == 0
    cap = capsys.readouterr()
    assert [s.op for s in parse(cap.out)["f"].body] == ["add"] and "factor_" not in cap.err


def test_opt_limits(capsys):
    assert main(["opt", str(MLP), "--limits", "iterations=1,nodes=100,seconds=2", "--report"]) == 0
    assert "after 1 round(s)" in capsys.readouterr().err
    assert parse_limits("nodes=5") == Limits(nodes=5)
    assert parse_limits("iterations=2, seconds=0.5") == Limits(iterations=2, seconds=0.5)
    # what eqsat.Limits accepts: zero, and inf for no bound
    assert parse_limits("iterations=0,nodes=inf,seconds=inf") == Limits(
        iterations=0, nodes=float("inf"), seconds=float("inf"))
    for bad in ("nodes", "speed=3", "nodes=many", "seconds=-1", "iterations=1.5",
                "seconds=nan"):
        with pytest.raises(Error, match="--limits"):
            parse_limits(bad)


@pytest.mark.parametrize("spec", ["nodes=abc", "frobs=1"])
def test_opt_bad_limits_exit_1(spec, capsys):
    assert main(["opt", str(MLP), "--limits", spec]) == 1
    assert "--limits" in capsys.readouterr().err


def test_opt_program_error_is_located(tmp_path, capsys):
    src = write(tmp_path, "bad.eqir", IDENT.replace("neg %a", "neg %q"))
    assert main(["opt", str(src)]) == 1
    assert capsys.readouterr().err.strip() == f"{src}:6:12: %q is not defined"


def test_opt_rule_error_is_located(tmp_path, capsys):
    src = write(tmp_path, "in.eqir", IDENT)
    rules = write(tmp_path, "bad.rules", "rule ok: neg(neg(?x)) => ?x\nrule bad: frob(?x) => ?x\n")
    assert main(["opt", str(src), "--rules", str(rules)]) == 1
    err = capsys.readouterr().err.strip()
    assert re.fullmatch(re.escape(str(rules)) + r":2:\d+: .*frob.*", err), err


def test_opt_unreadable_files(tmp_path, capsys):
    assert main(["opt", str(tmp_path / "missing.eqir")]) == 1
    assert "cannot read" in capsys.readouterr().err
    src = write(tmp_path, "in.eqir", IDENT)
    assert main(["opt", str(src), "--rules", str(tmp_path / "none.rules")]) == 1
    assert "cannot read" in capsys.readouterr().err
    assert main(["opt", str(src), "-o", str(tmp_path / "no" / "such" / "dir.eqir")]) == 1
    assert "cannot write" in capsys.readouterr().err


def test_dot_draws_fused_and_layout_ops_and_a_module_with_them_optimizes():
    from eqsat.extract import optimize
    from eqsat.extract.dot import to_dot

    m = parse("""module @m
func @f(%x: f32[4,8], %w: f32[4,8], %b: f32[8]) -> (f32[8,8], f32[4,8]) {
  %c = matmul_t %x, %w, ta=1, tb=0 : f32[8,8]
  %h = map %x, %b, body=tanh(add($0, $1)) : f32[4,8]
  %n = neg %h : f32[4,8]
  %nn = neg %n : f32[4,8]
  return %c, %nn
}
""")
    text = to_dot(m)
    assert 'matmul_t\\nta=1\\ntb=0' in text and "body=tanh(add($0, $1))" in text
    out = optimize(m, target="cuda")
    assert [s.op for s in out["f"].body] == ["matmul_t", "map"]
    assert_equivalent(m, out, trials=5)
