"""The `eqsat` command: check and format `.eqir` files.

Errors print as `FILE:LINE:COL: message` (the form editors and compilers use) and the command
exits with status 1.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from .errors import Error, LocatedError
from .ir import Module, parse


def _load(path: str) -> Module:
    try:
        data = Path(path).read_bytes() if path != "-" else sys.stdin.buffer.read()
    except OSError as e:
        raise Error(f"{path}: cannot read: {e.strerror or e}") from None
    return parse(data)


def _report(path: str, e: Error) -> None:
    if isinstance(e, LocatedError) and e.line:
        print(f"{path}:{e.line}:{e.col}: {e.message}", file=sys.stderr)
    elif isinstance(e, LocatedError):
        print(f"{path}: {e.message}", file=sys.stderr)
    else:
        print(str(e), file=sys.stderr)


def cmd_check(args: argparse.Namespace) -> int:
    status = 0
    for path in args.files:
        try:
            m = _load(path)
        except Error as e:
            _report(path, e)
            status = 1
            continue
        if not args.quiet:
            n_f, n_g = len(m.functions), len(m.grad_decls)
            stmts = sum(len(f.body) for f in m.functions)
            print(f"{path}: ok (module @{m.name}: {n_f} function(s), {stmts} statement(s), "
                  f"{n_g} gradient declaration(s))")
    return status


def cmd_fmt(args: argparse.Namespace) -> int:
    status = 0
    for path in args.files:
        try:
            m = _load(path)
        except Error as e:
            _report(path, e)
            status = 1
            continue
        text = str(m)
        if args.check:
            if Path(path).read_text() != text:
                print(f"{path}: not in canonical form", file=sys.stderr)
                status = 1
        elif args.in_place and path != "-":
            Path(path).write_text(text)
        else:
            sys.stdout.write(text)
    return status


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="eqsat", description="An optimizing compiler for tensor "
                                "programs written in the .eqir linear-algebra IR.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    c = sub.add_parser("check", help="parse and verify .eqir files")
    c.add_argument("files", nargs="+", metavar="FILE", help="a .eqir file, or - for stdin")
    c.add_argument("-q", "--quiet", action="store_true", help="print only errors")
    c.set_defaults(run=cmd_check)
    f = sub.add_parser("fmt", help="print .eqir files in canonical form")
    f.add_argument("files", nargs="+", metavar="FILE", help="a .eqir file, or - for stdin")
    mode = f.add_mutually_exclusive_group()
    mode.add_argument("-i", "--in-place", action="store_true", help="rewrite the files")
    mode.add_argument("--check", action="store_true",
                      help="exit 1 if a file is not in canonical form")
    f.set_defaults(run=cmd_fmt)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `eqsat` console script."""
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except Error as e:
        print(f"eqsat: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
