"""The `eqsat` command: check, format, optimize and run `.eqir` files.

Errors print as `FILE:LINE:COL: message` (the form editors and compilers use) and the command
exits with status 1.
"""

from __future__ import annotations

import argparse
import codecs
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .errors import Error, LocatedError
from .ir import Module, parse
from .ir.formatter import format_source
from .ir.parser import source_text

if TYPE_CHECKING:
    from .rules import Limits, RuleSet


def _read(path: str) -> bytes:
    try:
        return Path(path).read_bytes() if path != "-" else sys.stdin.buffer.read()
    except OSError as e:
        raise Error(f"{path}: cannot read: {e.strerror or e}") from None


def _load(path: str) -> Module:
    return parse(_read(path))


def _write(path: str, write) -> None:
    """Run `write(path)`; an OSError (no such folder, no permission) becomes an Error."""
    try:
        write(path)
    except OSError as e:
        raise Error(f"{path}: cannot write: {e.strerror or e}") from None


def _report(path: str, e: Error) -> None:
    if isinstance(e, LocatedError) and e.line:
        print(f"{path}:{e.line}:{e.col}: {e.message}", file=sys.stderr)
    elif isinstance(e, LocatedError):
        print(f"{path}: {e.message}", file=sys.stderr)
    else:
        print(str(e), file=sys.stderr)


def _loaded(paths: list[str], failed: list[str]) -> Iterator[tuple[str, Module, bytes]]:
    """Each file that parses and verifies, with its bytes; the others are reported and noted
    in `failed`."""
    for path in paths:
        try:
            data = _read(path)
            module = parse(data)
        except Error as e:
            _report(path, e)
            failed.append(path)
            continue
        yield path, module, data


def cmd_check(args: argparse.Namespace) -> int:
    failed: list[str] = []
    for path, m, _ in _loaded(args.files, failed):
        if not args.quiet:
            n_f, n_g = len(m.functions), len(m.grad_decls)
            stmts = sum(len(f.body) for f in m.functions)
            print(f"{path}: ok (module @{m.name}: {n_f} function(s), {stmts} statement(s), "
                  f"{n_g} gradient declaration(s))")
    return 1 if failed else 0


def cmd_fmt(args: argparse.Namespace) -> int:
    failed: list[str] = []
    for path, m, data in _loaded(args.files, failed):
        text = format_source(data, path, m)
        if args.check:
            # the text as read (stdin included; a byte order mark is not text), newlines read
            # as Python's text files read them
            source = source_text(data, path).replace("\r\n", "\n").replace("\r", "\n")
            if source != text:
                print(f"{path}: not in canonical form", file=sys.stderr)
                failed.append(path)
        elif args.in_place and path != "-":
            # the file keeps its byte order mark, if it has one (Windows editors write it)
            encoding = "utf-8-sig" if data.startswith(codecs.BOM_UTF8) else "utf-8"
            _write(path, lambda p: Path(p).write_text(text, encoding=encoding))
        else:
            sys.stdout.write(text)
    return 1 if failed else 0


def _read_inputs(path: str, params: tuple) -> list[np.ndarray]:
    """Arguments from an .npz file: by parameter name, else positionally (arr_0, arr_1, ...)."""
    try:
        data = np.load(path, allow_pickle=False)
        npz = isinstance(data, np.lib.npyio.NpzFile)
        if npz:
            with data:
                arrays = {k: data[k] for k in data.files}
    except Exception as e:  # noqa: BLE001
        # a damaged archive surfaces as whatever zipfile, zlib or numpy's header reader
        # raises (zlib.error, NotImplementedError, RuntimeError, tokenize.TokenError, ...)
        why = ("it is neither an .npz nor an .npy file" if "pickled" in str(e)
               else str(e) or type(e).__name__)
        raise Error(f"{path}: cannot read the inputs: {why}") from None
    if not npz:
        raise Error(f"{path}: expected an .npz file of named arrays (np.savez(path, x=...)), "
                    f"found a single array (an .npy file)")
    raw = [k for k, v in arrays.items() if not isinstance(v, np.ndarray)]
    if raw:
        raise Error(f"{path}: cannot read the inputs: {', '.join(raw)} in the archive is not "
                    f"an array saved by numpy (np.savez(path, x=...))")
    names = [p.name for p in params]
    positional = [f"arr_{i}" for i in range(len(names))]
    for keys in (names, positional):
        if all(n in arrays for n in keys):
            unused = [k for k in arrays if k not in keys]
            if unused:
                print(f"eqsat: note: {path}: array(s) {', '.join(unused)} match no parameter "
                      f"and are not used", file=sys.stderr)
            return [arrays[n] for n in keys]
    missing = [n for n in names if n not in arrays]
    raise Error(f"{path}: no array for parameter(s) {', '.join('%' + n for n in missing)}; "
                f"the file has {', '.join(arrays) or 'none'} (save them by parameter name, "
                f"e.g. np.savez(path, {names[0] if names else 'x'}=...))")


def cmd_run(args: argparse.Namespace) -> int:
    """`eqsat run`: compile (or interpret) one function and run it on arrays from an .npz."""
    import time

    from . import compile as compile_module
    from . import differentiate, interpret

    try:
        m = _load(args.file)
    except Error as e:
        _report(args.file, e)
        return 1
    expanded = differentiate(m)
    args.function = args.function.removeprefix("@")  # `eqsat run m.eqir @f` as the text writes it
    fn = expanded[args.function]
    inputs = _read_inputs(args.inputs, fn.params) if args.inputs else []
    t = time.perf_counter()
    if args.interpret:
        results = interpret(expanded, args.function, *inputs)
    else:
        exe = compile_module(expanded, optimize=not args.no_opt)
        t = time.perf_counter()
        results = exe(args.function, *inputs)
    seconds = time.perf_counter() - t
    results = results if isinstance(results, tuple) else (results,)
    for name, r in zip(fn.returns, results):
        print(f"%{name}: {r.dtype}{list(r.shape)}")
        print(np.array2string(r, threshold=20, edgeitems=3))
    print(f"ran @{args.function} in {seconds * 1e3:.3f} ms "
          f"({'interpreter' if args.interpret else 'compiled'})", file=sys.stderr)
    if args.output:
        def save(path: str) -> None:
            # through a file object: given a name, np.savez would append ".npz" to it
            with open(path, "wb") as f:
                np.savez(f, **{f"result{i}": r for i, r in enumerate(results)})

        _write(args.output, save)
    return 0


LIMIT_FIELDS = {"iterations": int, "nodes": int, "seconds": float}


def parse_limits(text: str) -> Limits:
    """`iterations=8,nodes=20000,seconds=5` (any subset) -> Limits; the rest keep defaults.
    Each is a number >= 0, `inf` for no bound, as for `eqsat.Limits`; iterations and nodes are
    whole numbers."""
    from .rules import Limits

    values: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, eq, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or key not in LIMIT_FIELDS:
            raise Error(f"--limits: expected NAME=VALUE with NAME one of "
                        f"{', '.join(LIMIT_FIELDS)}, got {part!r}")
        try:
            v = float(value)
        except ValueError:
            raise Error(f"--limits: {key} needs a number, got {value!r}") from None
        if not v >= 0:  # negative or nan
            raise Error(f"--limits: {key} must be a number >= 0 (inf for no bound), got {value}")
        if LIMIT_FIELDS[key] is int and v != float("inf"):
            if not v.is_integer():
                raise Error(f"--limits: {key} must be a whole number (or inf), got {value}")
            v = int(v)
        values[key] = v
    return Limits(**values)


def _load_rules(paths: list[str]) -> RuleSet | None:
    """The rule files (or "default", or "ieee": the built-in set without the rules that change
    results at inf, NaN or overflow) added together; None after reporting a parse error."""
    from .rules import default
    from .rules import parse as parse_rules

    rules = None
    for path in paths:
        if path in ("default", "ieee"):
            more = default(ieee=path == "ieee")
        else:
            try:
                text = Path(path).read_text()
            except (OSError, UnicodeDecodeError) as e:
                raise Error(f"{path}: cannot read: {getattr(e, 'strerror', None) or e}") from None
            try:
                more = parse_rules(text, Path(path).stem)
            except Error as e:
                _report(path, e)
                return None
        try:
            rules = more if rules is None else rules + more
        except Error as e:  # a rule name defined in two files
            _report(path, e)
            return None
    return rules


def cmd_opt(args: argparse.Namespace) -> int:
    """`eqsat opt`: optimize one file; the result to -o or stdout, the report to stderr."""
    import warnings

    from .extract import optimize_with_report
    from .extract.dot import compare_dot

    limits = parse_limits(args.limits) if args.limits else None
    try:
        m = _load(args.file)
    except Error as e:
        _report(args.file, e)
        return 1
    rules = None
    if args.rules:
        rules = _load_rules(args.rules)
        if rules is None:
            return 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the report carries the same notes
        out, report = optimize_with_report(m, rules, args.target, limits, args.method)
    text = str(out)
    if args.output and args.output != "-":
        try:
            Path(args.output).write_text(text)
        except OSError as e:
            raise Error(f"{args.output}: cannot write: {e.strerror or e}") from None
    else:
        sys.stdout.write(text)
    if args.dot:
        from .ad import differentiate

        try:
            Path(args.dot).write_text(compare_dot(differentiate(m), out))
        except OSError as e:
            raise Error(f"{args.dot}: cannot write: {e.strerror or e}") from None
    if args.report:
        print(report, file=sys.stderr)
    else:
        for note in report.notes:  # a stage that could not run: say so even without --report
            print(f"eqsat: note: {note}", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="eqsat", description="An optimizing compiler for tensor "
                                "programs written in the .eqir linear-algebra IR.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    c = sub.add_parser("check", help="parse and verify .eqir files")
    c.add_argument("files", nargs="+", metavar="FILE", help="a .eqir file, or - for stdin")
    c.add_argument("-q", "--quiet", action="store_true", help="print only errors")
    c.set_defaults(run=cmd_check)
    f = sub.add_parser("fmt", help="print .eqir files in canonical form, comments kept")
    f.add_argument("files", nargs="+", metavar="FILE", help="a .eqir file, or - for stdin")
    mode = f.add_mutually_exclusive_group()
    mode.add_argument("-i", "--in-place", action="store_true",
                      help="rewrite the files (a UTF-8 byte order mark is kept)")
    mode.add_argument("--check", action="store_true",
                      help="exit 1 if a file is not in canonical form")
    f.set_defaults(run=cmd_fmt)
    o = sub.add_parser("opt", help="optimize a .eqir file (gradients expanded) by equality "
                       "saturation and cost-based extraction")
    o.add_argument("file", metavar="IN", help="a .eqir file, or - for stdin")
    o.add_argument("-o", "--output", metavar="OUT", help="write the result here (default stdout)")
    o.add_argument("--target", choices=("cpu", "cuda"), default="cpu",
                   help="the cost model to optimize for (default cpu)")
    o.add_argument("--rules", metavar="FILE", action="append",
                   help="rule text to saturate with instead of the built-in rules; repeatable, "
                   "'default' names the built-in set, 'ieee' the built-in set without the rules "
                   "that change results at inf, NaN or overflow")
    o.add_argument("--limits", metavar="SPEC",
                   help="saturation bounds, e.g. iterations=8,nodes=20000,seconds=5")
    o.add_argument("--method", choices=("auto", "ilp", "greedy", "tree"), default="auto",
                   help="extraction method (default auto: ILP for small e-graphs, else greedy)")
    o.add_argument("--report", action="store_true", help="print the optimization report to stderr")
    o.add_argument("--dot", metavar="FILE", help="write Graphviz of the program before and after")
    o.set_defaults(run=cmd_opt)
    r = sub.add_parser("run", help="run one function of a .eqir file on arrays from an .npz")
    r.add_argument("file", metavar="FILE", help="a .eqir file, or - for stdin")
    r.add_argument("function", metavar="FUNC", help="the function to run (without @)")
    r.add_argument("--inputs", metavar="IN.npz",
                   help="its arguments, saved by parameter name (np.savez(path, x=..., w=...))")
    r.add_argument("-o", "--output", metavar="OUT.npz", help="save the results here")
    r.add_argument("--no-opt", action="store_true", help="compile without optimizing")
    r.add_argument("--interpret", action="store_true",
                   help="run the reference interpreter instead of compiled code")
    r.set_defaults(run=cmd_run)
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
    except BrokenPipeError:
        # the reader went away (`eqsat fmt big.eqir | head`): stop quietly, as cat does;
        # stdout goes to devnull so that the flush at exit cannot raise again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
