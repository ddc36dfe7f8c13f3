"""Lower layers never import higher ones: DESIGN's package table, checked on the source."""

import ast
from pathlib import Path

import eqsat

PACKAGE = Path(eqsat.__file__).parent
# Leaf modules with no eqsat imports of their own beyond each other: any layer may use them.
LEAVES = {"errors", "host", "cache", "extension"}
# DESIGN.md "Packages": what each folder may import of eqsat. testing's assert_equivalent
# expands gradient declarations with ad (as the facade's interpret does), so it may import ad.
ALLOWED = {
    "ir": set(),
    "ad": {"ir"},
    "rules": {"ir", "testing"},
    "extract": {"ir", "ad", "rules"},
    "backend": {"ir"},
    "testing": {"ir", "ad"},
    "errors": set(), "host": set(), "extension": set(), "cache": {"host"},
}


def _eqsat_imports(path: Path) -> set[str]:
    """The top-level eqsat modules or packages `path` imports (absolute or relative)."""
    rel = path.relative_to(PACKAGE)
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[1] for a in node.names if a.name.startswith("eqsat.")}
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                parts = (node.module or "").split(".")
                if parts[0] != "eqsat":
                    continue
                parts = parts[1:]
            else:
                base = list(rel.parts[:-1])
                parts = base[:len(base) - (node.level - 1)] + (node.module or "").split(".")
                parts = [p for p in parts if p]
            if parts:
                out.add(parts[0])
            else:  # `from .. import x` at the top: x itself is the module
                out |= {a.name for a in node.names}
    return out


def test_each_layer_imports_only_what_design_allows():
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        layer = rel.parts[0] if len(rel.parts) > 1 else rel.stem
        if layer not in ALLOWED:  # the facade, cli and demo compose every stage
            continue
        for target in _eqsat_imports(path) - {layer}:
            if target not in ALLOWED[layer] and not (target in LEAVES and layer not in LEAVES):
                wrong.append(f"{rel} imports eqsat.{target}")
    assert not wrong, "\n".join(wrong)


def test_the_check_sees_imports():
    assert _eqsat_imports(PACKAGE / "backend" / "settings.py") == {"errors", "host"}
    assert "ir" in _eqsat_imports(PACKAGE / "extract" / "pipeline.py")
