"""The formatter's text (`eqsat fmt`): a file's canonical text with its comments kept.

Comments are the formatter's concern, not the Module's. The parser's source positions say
where each item of the text starts (the module line, a function's header, each statement, a
return, a gradient declaration; a closing brace is the token after its return), so every
comment belongs to one item; the printer's lines (`module_lines`) say where that item is
printed. The rules, which the formatter's own output meets again (fmt is idempotent):

- A comment after an item's last token, on that token's line, ends the item's printed line,
  two spaces after the code (PEP 8's spacing).
- Any other comment goes on a line of its own right before the item whose token follows it,
  indented as that item (before a closing brace: as the body it ends). That covers
  full-line comments, comments after the last statement and a comment inside an item written
  over several lines, whose place there has no printed counterpart (before the item, the
  comments keep their order).
- Comments after the last item stay at the end of the file.
- Blank lines follow the printer: one before each function and gradient declaration (and so
  before the comments on it), one before the comments at the end, none anywhere else.

A comment's text is kept as written from its `#`, less the spaces and tabs that end it.
"""

from __future__ import annotations

from .module import Function, Module
from .parser import Token, _Parser, source_text, tokenize
from .printer import module_lines

EOL_COMMENT_GAP = "  "
_TRAILING_SPACE = " \t\f\v"  # the format's whitespace within a line


def format_source(text: str | bytes, source: str | None = None,
                  module: Module | None = None) -> str:
    """The canonical text of `.eqir` source with its comments kept; without comments it is
    `str(parse_module(text))`. Text that does not parse raises the parser's ParseError.
    `module` is the text already parsed, where the caller has it (it is not parsed again)."""
    text = source_text(text, source)
    if module is None:
        module = _Parser(text, source).module()
    tokens = tokenize(text, source, comments=True)
    code = [t for t in tokens if t.kind not in ("comment", "eof")]
    item_of = _items_of_tokens(module, code)
    n_items = item_of[-1] + 1 if item_of else 0
    leading: list[list[str]] = [[] for _ in range(n_items)]
    trailing: list[str | None] = [None] * n_items
    pending: list[str] = []
    prev: Token | None = None
    prev_ends_item = False
    i = 0  # index in `code` of the next code token
    for tok in tokens:
        if tok.kind == "eof":
            break
        if tok.kind != "comment":
            if pending:
                leading[item_of[i]] += pending
                pending = []
            prev, prev_ends_item = tok, i + 1 == len(code) or item_of[i + 1] != item_of[i]
            i += 1
            continue
        comment = tok.text.rstrip(_TRAILING_SPACE)
        if prev is not None and prev.line == tok.line and prev_ends_item:
            trailing[item_of[i - 1]] = comment
        else:
            pending.append(comment)
    return _layout(module, code, leading, trailing, pending)


def _items_of_tokens(module: Module, code: list[Token]) -> list[int]:
    """For each code token, the index of the item it belongs to, counting from 0 in the order
    of the text (the module line, when written, is item 0)."""
    index = {(t.line, t.col): k for k, t in enumerate(code)}
    starts = {0} if code else set()  # the module line, or the first function
    for item in module.items:
        starts.add(index[(item.loc.line, item.loc.col)])
        if isinstance(item, Function):
            starts.update(index[(s.loc.line, s.loc.col)] for s in item.body)
            ret = item.return_loc
            starts.add(index[(ret.line, ret.col)])
            starts.add(index[ret.operand_cols[-1]] + 1)  # the closing brace
    item_of: list[int] = []
    current = -1
    for k in range(len(code)):
        current += k in starts
        item_of.append(current)
    return item_of


def _layout(module: Module, code: list[Token], leading: list[list[str]],
            trailing: list[str | None], at_end: list[str]) -> str:
    lines = module_lines(module)
    has_module_line = bool(code) and code[0].kind == "ident" and code[0].text == "module"
    items = [k for k, line in enumerate(lines) if line][0 if has_module_line else 1:]
    if len(items) != len(leading):
        raise AssertionError(f"formatter: {len(leading)} items in the text, {len(items)} "
                             f"printed")
    out: list[str] = []
    item = dict(zip(items, range(len(items))))
    for k, line in enumerate(lines):
        j = item.get(k)
        if j is None:
            out.append(line)
            continue
        indent = _indent(lines[k - 1] if line == "}" else line)
        out += [indent + c for c in leading[j]]
        out.append(line if trailing[j] is None else line + EOL_COMMENT_GAP + trailing[j])
    if at_end:
        out += ["", *at_end]
    return "\n".join(out) + "\n"


def _indent(line: str) -> str:
    return line[:len(line) - len(line.lstrip(" "))]
