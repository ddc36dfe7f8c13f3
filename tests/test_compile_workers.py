"""Parallel compilation: a program's LLVM IR cut into parts (llvm_split) that worker processes
compile while this process compiles one; the parts together must make the same program."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import llvmlite.binding as llvm
import numpy as np
import pytest

import eqsat
from eqsat.backend import compile_module, compile_workers, cpu, jit, llvm_split
from eqsat.ir.samples import random_arguments

from cpu_helpers import assert_matches
from worker_helpers import start_ready

EXAMPLES = Path(eqsat.__file__).parent / "examples"


def _program(name: str) -> eqsat.Module:
    return eqsat.differentiate(eqsat.parse((EXAMPLES / name).read_text()))


def _defined(text: str) -> dict[str, bool]:
    """Function name -> internal, for every definition of LLVM IR text."""
    return {m.group(2): m.group(1) is not None
            for m in re.finditer(r'^define (internal )?[^@]*@"([^"]+)"', text, re.M)}


@pytest.fixture
def workers(monkeypatch):
    """Compile workers running, every module large enough to split; stopped afterwards."""
    monkeypatch.setattr(compile_workers, "MIN_COST", 0)

    def run(count: int) -> None:
        compile_workers.stop()
        start_ready(count)
    yield run
    compile_workers.stop()


@pytest.mark.parametrize("parts", [2, 3])
def test_parts_define_each_function_once_and_compile(parts, fresh):
    """Every external function and every kernel the pool runs is defined in one part; internal
    helpers and kernels called directly are copied into each part that calls them (LLVM
    specializes them on their callers' constant extents); only thread tasks become external
    for a caller in another part; each part verifies. Every kernel is split over two threads
    (which of mlp's products do on their own depends on the host's vector width)."""
    fresh(2, 0)
    text, _ = cpu.lower(_program("mlp.eqir"))
    pieces = llvm_split.split(text, parts)
    assert len(pieces) == parts
    whole = _defined(text)
    seen: dict[str, int] = {}
    for piece in pieces:
        jit.optimize(piece)  # parses and verifies
        for name, internal in _defined(piece).items():
            seen[name] = seen.get(name, 0) + 1
            if whole[name] and not internal:
                assert name.endswith(".thread"), name
    assert set(seen) == set(whole)
    for name, count in seen.items():
        assert count == 1 or whole[name], name
    threaded = [n for n in whole if n.endswith(".thread")]
    assert threaded and all(seen[n] == 1 for n in threaded)


def test_kernels_called_directly_stay_internal_and_specialized():
    """A long chain of small ops: every kernel is called directly with constant extents, so
    each part that calls one has its own internal copy, and the entries are what is divided."""
    from large_programs import long_chain

    text, _ = cpu.lower(eqsat.differentiate(eqsat.parse(long_chain(200))))
    pieces = llvm_split.split(text, 2)
    assert len(pieces) == 2
    for piece in pieces:
        defined = _defined(piece)
        assert all(internal for n, internal in defined.items() if re.match(r"k\d+\.", n))
        assert sum(n.startswith("eqsat.fn.") and not internal
                   for n, internal in defined.items()) == 1


def test_small_modules_stay_whole():
    text, _ = cpu.lower(_program("mlp.eqir"))
    assert llvm_split.split(text, 2, min_cost=10**6) == [text]
    assert llvm_split.split(text, 1) == [text]


def test_pack_roundtrip():
    objs = [b"\x7fELF one", b"\x7fELF two!", b""]
    assert jit.unpack_objects(jit.pack_objects(objs)) == objs
    assert jit.pack_objects([b"\x7fELF x"]) == b"\x7fELF x"
    assert jit.unpack_objects(b"\x7fELF x") == [b"\x7fELF x"]


@pytest.mark.parametrize("count", [1, 2])
def test_programs_compiled_in_parts_match_interpret(workers, count):
    """The MLP with its gradient and the transformer block, compiled by this process and
    `count` workers, compute what the interpreter does; the code is in several objects."""
    workers(count)
    for name in ("mlp.eqir", "transformer.eqir"):
        m = _program(name)
        exe = compile_module(m, cache_dir=None)
        assert len(jit.unpack_objects(_object(m))) == count + 1
        rng = np.random.default_rng(0)
        for f in m.functions:
            args = random_arguments(f, -1.0, 1.0, rng)
            assert_matches(exe(f.name, *args), eqsat.interpret(m, f.name, *args),
                           ulps=64, atol=1e-5)


def _object(m: eqsat.Module) -> bytes:
    text, _ = cpu.lower(m)
    return compile_workers.compile_objects(text)


def test_a_dead_worker_is_replaced_by_compiling_here(workers):
    workers(1)
    compile_workers._workers[0].proc.kill()
    compile_workers._workers[0].proc.wait()
    m = _program("mlp.eqir")
    assert len(jit.unpack_objects(_object(m))) == 1  # no worker alive: one object, here
    start_ready(1)
    assert len(jit.unpack_objects(_object(m))) == 2


def test_a_worker_still_starting_is_not_waited_for(monkeypatch):
    """A part goes only to a worker that said it is ready: before, this process compiles all."""
    monkeypatch.setattr(compile_workers, "MIN_COST", 0)
    compile_workers.stop()
    compile_workers.start(1)
    try:
        monkeypatch.setattr(compile_workers._Worker, "usable", lambda self: False)
        assert len(jit.unpack_objects(_object(_program("mlp.eqir")))) == 1
    finally:
        compile_workers.stop()


def test_workers_that_cannot_start_are_not_started_again(monkeypatch):
    """A worker that dies before it is ready (here: its Python cannot import eqsat) leaves
    this process compiling alone, without a new process at every compile."""
    monkeypatch.setattr(compile_workers, "_broken", False)
    compile_workers.stop()
    monkeypatch.setattr(compile_workers._Worker, "COMMAND", "import sys; sys.exit(3)")
    compile_workers.start(1)
    compile_workers._workers[0].proc.wait()
    compile_workers.start(1)
    assert compile_workers._workers == [] and compile_workers._broken
    assert len(jit.unpack_objects(_object(_program("mlp.eqir")))) == 1


def test_a_worker_failing_mid_compile_leaves_its_part_to_this_process(workers, monkeypatch):
    """A worker that exits while it has a part (here: it is killed as the request goes out)
    costs nothing but time: the part is compiled here and the program runs."""
    workers(1)
    worker = compile_workers._workers[0]
    real = compile_workers._Worker.compile

    def dying(self, text, level, unroll):
        self.proc.kill()
        self.proc.wait()
        return real(self, text, level, unroll)

    monkeypatch.setattr(compile_workers._Worker, "compile", dying)
    m = _program("mlp.eqir")
    blob = _object(m)
    assert len(jit.unpack_objects(blob)) == 2 and not worker.alive()
    code = jit.Code(blob)
    assert code.address("eqsat.fn.loss_grad")


def test_parts_are_cached_and_loaded_from_disk(workers, tmp_path):
    """A program compiled in parts is stored as one packed entry; a fresh process loads it."""
    workers(1)
    m = _program("mlp.eqir")
    compile_module(m, cache_dir=tmp_path)
    (obj,) = [p for p in tmp_path.glob("*.o")]
    assert len(jit.unpack_objects(jit.cache_load(tmp_path, obj.stem))) == 2
    script = (f"import eqsat, numpy as np, sys\n"
              f"from eqsat.backend import compile_module, cpu, compile_workers\n"
              f"m = eqsat.differentiate(eqsat.parse(open({str(EXAMPLES / 'mlp.eqir')!r}).read()))\n"
              f"cpu.lower = None\n"  # a cache hit never lowers
              f"exe = compile_module(m, cache_dir={str(tmp_path)!r})\n"
              f"x = np.ones((128, 784), np.float32); w = np.ones((784, 10), np.float32)\n"
              f"print(float(exe.predict(x, w, np.zeros(10, np.float32))[0, 0]))\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "784.0"


def test_a_forked_child_compiles_with_workers_of_its_own(workers):
    workers(1)
    parent_worker = compile_workers._workers[0]
    m = _program("mlp.eqir")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its parent's worker is not its own
        ok = 0
        try:
            ok = int(compile_workers._workers == [])
            start_ready(1)
            ok &= int(len(jit.unpack_objects(_object(m))) == 2)
            compile_workers.stop()
        finally:
            os.write(write, bytes([ok]))
            os._exit(0)
    os.close(write)
    assert os.read(read, 1) == b"\x01"
    os.waitpid(pid, 0)
    assert parent_worker.alive()
    assert len(jit.unpack_objects(_object(m))) == 2


def test_no_worker_where_the_executable_is_no_python(monkeypatch):
    """In an embedded Python (uWSGI, a frozen app) sys.executable is the host program."""
    assert compile_workers._is_python(sys.executable)
    assert all(compile_workers._is_python(p) for p in ("/usr/bin/python3", "python3.12",
                                                       "C:/Py/python.exe", "pypy3"))
    assert not any(compile_workers._is_python(p) for p in ("/usr/bin/uwsgi", "", None,
                                                           "/opt/app/blender"))
    compile_workers.stop()
    monkeypatch.setattr(sys, "executable", "/usr/bin/uwsgi")
    compile_workers.start(1)
    assert compile_workers._workers == []


def test_worker_count_setting(monkeypatch):
    from eqsat.backend.settings import compile_workers as count

    monkeypatch.setenv("EQSAT_COMPILE_WORKERS", "2")
    assert count() == 2
    monkeypatch.setenv("EQSAT_COMPILE_WORKERS", "0")
    assert count() == 0
    monkeypatch.setenv("EQSAT_COMPILE_WORKERS", "two")
    with pytest.raises(eqsat.Error, match="EQSAT_COMPILE_WORKERS"):
        count()
    monkeypatch.delenv("EQSAT_COMPILE_WORKERS")
    assert 0 <= count() <= 3
    from eqsat.backend import settings

    monkeypatch.setattr(settings, "usable_cores", lambda: 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (1.0, 1.0, 1.0))  # this process: one busy
    assert count() == 1
    monkeypatch.setattr(os, "getloadavg", lambda: (1.9, 1.0, 1.0))  # another process too
    assert count() == 0
    monkeypatch.setattr(settings, "usable_cores", lambda: 16)
    monkeypatch.setattr(os, "getloadavg", lambda: (4.0, 1.0, 1.0))
    assert count() == 3
    monkeypatch.setenv("EQSAT_COMPILE_WORKERS", "2")  # as told, whatever the load
    monkeypatch.setattr(os, "getloadavg", lambda: (40.0, 1.0, 1.0))
    assert count() == 2


@pytest.mark.parametrize("optimize", [True, False])
def test_a_bad_worker_count_is_an_error_at_every_compile(monkeypatch, tmp_path, optimize):
    """EQSAT_COMPILE_WORKERS was read only where a compile optimized a program anew: a typo
    went unnoticed while the optimization was cached, or without optimizing at all."""
    monkeypatch.setenv("EQSAT_CACHE_DIR", str(tmp_path))
    m = eqsat.parse((EXAMPLES / "mlp.eqir").read_text())
    eqsat.compile(m, optimize=optimize)
    monkeypatch.setenv("EQSAT_COMPILE_WORKERS", "tw0")
    with pytest.raises(eqsat.Error, match="EQSAT_COMPILE_WORKERS"):
        eqsat.compile(m, optimize=optimize)
    with pytest.raises(eqsat.Error, match="EQSAT_COMPILE_WORKERS"):
        compile_module(eqsat.differentiate(m), cache_dir=None)


def test_compile_starts_workers_only_when_it_optimizes(monkeypatch, tmp_path):
    """eqsat.compile starts the workers before it optimizes a program not optimized before;
    a compile without optimization, or of a program whose optimization is cached, starts none."""
    monkeypatch.setenv("EQSAT_CACHE_DIR", str(tmp_path))
    started = []
    monkeypatch.setattr(eqsat.backend, "start_compile_workers", lambda: started.append(1))
    m = eqsat.parse((EXAMPLES / "mlp.eqir").read_text())
    eqsat.compile(m, optimize=False)
    assert started == []
    eqsat.compile(m)
    assert started == [1]
    eqsat.compile(m)
    assert started == [1]


def test_llvm_of_a_module_is_unchanged_by_workers():
    """eqsat.emit shows the whole module optimized in one piece, workers or not."""
    m = eqsat.parse((EXAMPLES / "mlp.eqir").read_text())
    llvm.parse_assembly(eqsat.emit(m, target="llvm")).verify()


def test_a_request_is_written_whole_where_the_pipe_takes_part_of_each_write():
    class Short:
        def __init__(self):
            self.got = b""

        def write(self, data):
            self.got += bytes(data[:1000])
            return min(len(data), 1000)

    pipe, data = Short(), bytes(range(256)) * 40
    compile_workers._write(pipe, data)
    assert pipe.got == data


def test_parts_take_about_equal_compile_times():
    """The transformer block in two parts: balanced by lines of IR, one part took 1.6-1.7x
    the other's LLVM time (its kernels' many small functions cost more than their lines
    say). CPU times, medians of interleaved rounds; balanced, the ratio is 1.0-1.1."""
    import time

    text, _ = cpu.lower(eqsat.optimize(_program("transformer.eqir")))
    pieces = llvm_split.split(text, 2)
    times: list[list[float]] = [[], []]
    for _ in range(3):
        for piece, spent in zip(pieces, times):
            t0 = time.process_time()
            jit.compile_object(piece)
            spent.append(time.process_time() - t0)
    slow, fast = sorted((float(np.median(t)) for t in times), reverse=True)
    assert slow / fast < 1.4, (slow, fast)
