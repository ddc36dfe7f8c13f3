"""The e-graph: IR <-> egglog, the rule language, the saturation runner, the rule libraries and
the soundness check.

>>> from eqsat.rules import parse
>>> rs = parse("rule mul_one: mul(?x, const(1.0)) => ?x")
>>> rs.names()
['mul_one']
"""

from .algebraic import algebraic
from .bridge import EGraph, ENode, Serialized, extract_tree, load, roundtrip, usable_nodes
from .check import CheckError, check, check_rule
from .defaults import default
from .lang import Rule, RuleSet, op, parse, parse_pattern, shape_fn, var
from .layout import layout
from .runner import Limits, Report, saturate, saturate_egraph

__all__ = [
    "CheckError", "algebraic", "check", "check_rule", "default", "layout",
    "EGraph", "ENode", "Limits", "Report", "Rule", "RuleSet", "Serialized", "extract_tree",
    "load", "op", "parse", "parse_pattern", "roundtrip", "saturate", "saturate_egraph",
    "shape_fn", "usable_nodes", "var",
]
