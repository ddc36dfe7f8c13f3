"""The eqsat command: check and fmt, errors as FILE:LINE:COL: message."""

from __future__ import annotations

import subprocess
import sys

import pytest

from eqsat.cli import main

GOOD = "module @m\n\nfunc @f(%x: f32[4]) -> f32[4] {\n  %y = neg %x : f32[4]\n  return %y\n}\n"


def test_check_ok(tmp_path, capsys):
    p = tmp_path / "good.eqir"
    p.write_text(GOOD)
    assert main(["check", str(p)]) == 0
    assert "ok (module @m: 1 function(s), 1 statement(s)" in capsys.readouterr().out


def test_check_error_format(tmp_path, capsys):
    p = tmp_path / "bad.eqir"
    p.write_text(GOOD.replace("neg %x : f32[4]", "neg %z : f32[4]"))
    assert main(["check", str(p)]) == 1
    assert capsys.readouterr().err.strip() == f"{p}:4:12: %z is not defined"


def test_check_missing_file_and_binary(tmp_path, capsys):
    assert main(["check", str(tmp_path / "nope.eqir")]) == 1
    assert "cannot read" in capsys.readouterr().err
    p = tmp_path / "bin.eqir"
    p.write_bytes(bytes(range(256)))
    assert main(["check", str(p)]) == 1
    assert "not UTF-8" in capsys.readouterr().err or "unexpected character" in capsys.readouterr().err


def test_fmt(tmp_path, capsys):
    p = tmp_path / "messy.eqir"
    p.write_text("module @m func @f(%x: f32[4]) -> f32[4] { %y = neg %x : f32[4] return %y }")
    assert main(["fmt", "--check", str(p)]) == 1
    capsys.readouterr()
    assert main(["fmt", str(p)]) == 0
    assert capsys.readouterr().out == GOOD
    assert main(["fmt", "-i", str(p)]) == 0
    assert p.read_text() == GOOD
    assert main(["fmt", "--check", str(p)]) == 0


def test_fmt_keeps_a_byte_order_mark_and_checks_the_text_after_it(tmp_path, capsys):
    """A file starting with a UTF-8 BOM (as Windows editors write it) was never in canonical
    form for --check (the BOM was compared as text), and -i dropped it. The BOM is not part
    of the text: -i keeps the file's, --check and the printed text go without it."""
    p = tmp_path / "bom.eqir"
    p.write_bytes(b"\xef\xbb\xbf" + GOOD.encode())
    assert main(["fmt", "--check", str(p)]) == 0
    assert main(["fmt", str(p)]) == 0
    assert capsys.readouterr().out == GOOD
    p.write_bytes(b"\xef\xbb\xbf" + GOOD.replace("\n\n", "\n").encode())
    assert main(["fmt", "--check", str(p)]) == 1
    capsys.readouterr()
    assert main(["fmt", "-i", str(p)]) == 0
    assert p.read_bytes() == b"\xef\xbb\xbf" + GOOD.encode()
    assert main(["fmt", "--check", str(p)]) == 0
    plain = tmp_path / "plain.eqir"
    plain.write_text("module @m\n# caf\u00e9\n" + GOOD.removeprefix("module @m\n"),
                     encoding="utf-8")
    assert main(["fmt", "-i", str(plain)]) == 0
    assert plain.read_bytes().startswith(b"module @m\n\n# caf\xc3\xa9\n")


def test_console_script_runs(tmp_path):
    p = tmp_path / "good.eqir"
    p.write_text(GOOD)
    r = subprocess.run([sys.executable, "-m", "eqsat.cli", "check", "-q", str(p)],
                       capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout == ""


def test_a_reader_that_goes_away_stops_the_output_without_a_traceback(tmp_path):
    p = tmp_path / "long.eqir"  # canonical text past stdout's buffer, so main() writes it
    p.write_text("module @m\n" + "".join(
        f"\nfunc @f{i}(%x: f32[4]) -> f32[4] {{\n  %y = neg %x : f32[4]\n  return %y\n}}\n"
        for i in range(500)))
    proc = subprocess.Popen([sys.executable, "-m", "eqsat.cli", "fmt", str(p)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # as `eqsat fmt long.eqir | head -c0` does
    err = proc.stderr.read().decode()
    assert proc.wait() == 141 and "Traceback" not in err and "BrokenPipe" not in err


def test_run_compiled_and_interpreted(tmp_path, capsys):
    import numpy as np

    p = tmp_path / "good.eqir"
    p.write_text(GOOD)
    inputs = tmp_path / "in.npz"
    np.savez(inputs, x=np.arange(4, dtype=np.float32))
    out = tmp_path / "out.npz"
    assert main(["run", str(p), "f", "--inputs", str(inputs), "-o", str(out)]) == 0
    captured = capsys.readouterr()
    assert "%y: float32[4]" in captured.out and "compiled" in captured.err
    np.testing.assert_array_equal(np.load(out)["result0"], -np.arange(4, dtype=np.float32))
    assert main(["run", str(p), "f", "--inputs", str(inputs), "--interpret"]) == 0
    assert "interpreter" in capsys.readouterr().err
    exact = tmp_path / "results"  # written under exactly this name, not results.npz
    assert main(["run", str(p), "f", "--inputs", str(inputs), "-o", str(exact)]) == 0
    assert exact.exists() and not (tmp_path / "results.npz").exists()
    np.testing.assert_array_equal(np.load(exact)["result0"], -np.arange(4, dtype=np.float32))
    extra = tmp_path / "extra.npz"
    np.savez(extra, x=np.arange(4, dtype=np.float32), w=np.ones(2))
    assert main(["run", str(p), "f", "--inputs", str(extra)]) == 0
    assert "array(s) w match no parameter and are not used" in capsys.readouterr().err


@pytest.fixture
def good(tmp_path):
    """GOOD in a file, and a helper saving named arrays to an .npz beside it."""
    import numpy as np

    p = tmp_path / "good.eqir"
    p.write_text(GOOD)

    def npz(name: str, **arrays) -> str:
        np.savez(tmp_path / name, **arrays)
        return str(tmp_path / name)
    return str(p), npz


def test_run_errors(good, capsys):
    import numpy as np

    p, npz = good
    wrong = npz("wrong.npz", z=np.zeros(4, np.float32))
    assert main(["run", p, "f", "--inputs", wrong]) == 1
    assert "no array for parameter(s) %x" in capsys.readouterr().err
    shape = npz("shape.npz", x=np.zeros(5, np.float32))
    assert main(["run", p, "f", "--inputs", shape]) == 1
    assert "must have shape [4]" in capsys.readouterr().err
    assert main(["run", p, "g", "--inputs", shape]) == 1
    assert "has no function @g" in capsys.readouterr().err


def test_run_refuses_files_that_are_not_npz(good, tmp_path, capsys):
    import numpy as np

    p, _ = good
    npy = tmp_path / "x.npy"
    np.save(npy, np.zeros(4, np.float32))
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"PK\x03\x04 not a zip archive")
    text = tmp_path / "in.eqir"  # numpy says it "contains pickled (object) data"
    text.write_text(GOOD)
    for path, message in ((npy, "expected an .npz file"), (bad, "cannot read the inputs"),
                          (text, "it is neither an .npz nor an .npy file")):
        assert main(["run", p, "f", "--inputs", str(path)]) == 1
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err


def test_run_refuses_damaged_archives_without_a_traceback(good, tmp_path, capsys):
    import zipfile

    import numpy as np

    p, _ = good
    packed = tmp_path / "packed.npz"
    np.savez_compressed(packed, x=np.arange(64, dtype=np.float32))
    raw = packed.read_bytes()
    damaged = []  # flipped bytes that raised zlib.error, NotImplementedError, RuntimeError
    for i, flip in ((28, 0xFF), (len(raw) - 67, 0xFF), (len(raw) - 65, 0x01)):
        path = tmp_path / f"damaged{i}.npz"
        path.write_bytes(raw[:i] + bytes([raw[i] ^ flip]) + raw[i + 1:])
        damaged.append(path)
    member = tmp_path / "member.npz"  # a zip member that np.save did not write
    with zipfile.ZipFile(member, "w") as z:
        z.writestr("x", b"hello")
    for path in [*damaged, member]:
        assert main(["run", p, "f", "--inputs", str(path)]) == 1
        assert f"{path}: cannot read the inputs" in capsys.readouterr().err


def test_run_takes_the_function_as_written_in_the_text(good, capsys):
    import numpy as np

    p, npz = good
    assert main(["run", p, "@f", "--inputs", npz("in.npz", x=np.ones(4, np.float32))]) == 0
    out = capsys.readouterr()
    assert "ran @f in" in out.err and "[-1. -1. -1. -1.]" in out.out


def test_fmt_check_of_stdin_and_unwritable_outputs(good, tmp_path, capsys, monkeypatch):
    import io

    import numpy as np

    p, npz = good
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(GOOD.encode())))
    assert main(["fmt", "--check", "-"]) == 0
    inputs = npz("in.npz", x=np.arange(4, dtype=np.float32))
    out = str(tmp_path / "no such folder" / "out.npz")
    assert main(["run", p, "f", "--inputs", inputs, "-o", out]) == 1
    assert "cannot write" in capsys.readouterr().err
