"""Work `optimize` must not repeat or waste, checked by counting it (never by timing it): bodies
the process wrote into the e-graph are read back without parsing; a kernel body is weighed once
for the fusion pass and the cost model together; a renumbering rebuilds only what moves."""

from __future__ import annotations

import pytest

import eqsat
from eqsat.extract import cost_model, optimize_with_report
from eqsat.ir import fused, parser
from eqsat.ir.scalar_expr import App, Arg, BodyTexts, Lit, format_body, parse_body
from eqsat.ir.types import DType
from eqsat.rules import schema

FUSIBLE = """
module @m
func @f(%x: f32[8,4], %w: f32[4]) -> f32[8,4] {
  %0 = broadcast %w : f32[8,4]
  %1 = mul %x, %0 : f32[8,4]
  %2 = tanh %1 : f32[8,4]
  %3 = add %2, %x : f32[8,4]
  %4 = exp %3 : f32[8,4]
  return %4
}
"""


def _count_parses(monkeypatch) -> list[str]:
    seen: list[str] = []
    real = parser._Parser

    def counting(text, *args, **kwargs):
        seen.append(text)
        return real(text, *args, **kwargs)

    monkeypatch.setattr(parser, "_Parser", counting)
    return seen


def test_a_body_written_to_the_egraph_is_read_back_without_parsing(monkeypatch):
    encode, decode = schema.ATTR_CODECS[fused.BODY]
    body = App("tanh", (App("add", (Arg(0), Lit(0.123456789))),))
    text = encode(body)
    assert text == format_body(body)
    parses = _count_parses(monkeypatch)
    assert decode(text) == body
    assert parses == []


def test_body_texts_parse_a_text_once_and_forget_the_oldest():
    texts = BodyTexts(size=2)
    a, b, c = (App("neg", (Arg(i),)) for i in range(3))
    assert texts.body("neg($0)") == a
    assert texts.body("neg($0)") is texts.body("neg($0)")  # parsed once, remembered
    texts.text(b)
    texts.text(c)  # a, the oldest, is forgotten
    assert list(texts._body) == ["neg($1)", "neg($2)"] and set(texts._text) == {b, c}


def test_optimize_parses_no_body_text(monkeypatch):
    """Every body in the e-graph was written by this process (fusion), so serializing it after
    each round and at the end parses none of them."""
    module = eqsat.parse(FUSIBLE)
    parses = _count_parses(monkeypatch)
    opt, report = optimize_with_report(module)
    assert report.fused  # the kernels were fused, so bodies went through the e-graph
    assert parses == []


def test_the_cost_model_weighs_no_body_the_fusion_pass_weighed(monkeypatch):
    """The fusion pass weighs every kernel form it makes (`FusionGraph.dominated`) and the cost
    model prices the same kernels again for every function that can use them: one weighing."""
    calls = []
    real = fused.body_cost
    monkeypatch.setattr(fused, "body_cost", lambda *a: calls.append(a) or real(*a))
    body = parse_body("tanh(add(mul($0, $1), 0.3125))")
    ins = (DType.f32[7, 3], DType.f32[3])
    weight = fused.body_flops(body, list(ins), (7, 3))  # as the fusion pass weighs it
    weighed = len(calls)
    assert weighed and weight > 0
    model = cost_model("cpu")
    first = model.stmt_cost("map", {"body": body}, ins, (DType.f32[7, 3],))
    assert model.stmt_cost("map", {"body": body}, ins, (DType.f32[7, 3],)) == first
    assert len(calls) == weighed


def test_a_renumbering_rebuilds_only_the_subterms_whose_inputs_move():
    """canonical() renumbers a fused kernel's inputs with a mapping of every input, most of
    them to themselves: a subterm that reads only those is kept, not built again."""
    from eqsat.ir.scalar_expr import substitute

    kept = parse_body("tanh(mul($0, $1))")
    body = App("add", (kept, Arg(2)))
    out = substitute(body, {0: Arg(0), 1: Arg(1), 2: Arg(3)})
    assert out == App("add", (kept, Arg(3)))
    assert out.args[0] is kept
    assert substitute(body, {0: Arg(0), 1: Arg(1)}) is body


def test_a_body_node_still_checks_its_operands_and_knows_what_it_reads():
    with pytest.raises(TypeError, match="must be Arg, Lit or App"):
        App("neg", ("$0",))
    e = App("add", (App("mul", (Arg(3), Lit(2.0))), Arg(1)))
    assert e.reads == {1, 3} and hash(e) == hash(App("add", e.args))
