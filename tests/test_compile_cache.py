"""The cached compile path: what it skips (kernel builders, plans, the pool runtime's IR) and
what still makes it miss (module text, code generator source, EQSAT_GEMM, thread count)."""

from __future__ import annotations

import gc
import json
import os
import re
import subprocess
import sys
import types
import weakref
from pathlib import Path

import numpy as np
import pytest

import eqsat
from eqsat import cache
from eqsat.backend import compile_module, cpu, jit
from eqsat.ir import parse

N = 1 << 20  # large enough that the kernels run on the thread pool
BIG = f"""module @big
func @f(%x: f32[{N}], %y: f32[{N}]) -> f32[{N}] {{
  %0 = mul %x, %y : f32[{N}]
  %1 = tanh %0 : f32[{N}]
  %2 = add %1, %x : f32[{N}]
  return %2
}}"""

# A fresh process: compile BIG from the cache in argv[1], check it against interpret, and say
# which backend modules it imported.
SCRIPT = f"""
import sys, json
import numpy as np
import eqsat
from eqsat.backend import compile_module
m = eqsat.parse({BIG!r})
x = np.linspace(-3, 3, {N}, dtype=np.float32)
y = np.cos(x)
got = compile_module(m, cache_dir=sys.argv[1]).f(x, y)
want = eqsat.interpret(m, "f", x, y)
ok = bool(np.allclose(got, want, rtol=1e-5, atol=1e-6))
mods = [n for n in ("entry", "gemm", "parallel", "llvm_kernels", "fused_kernels", "matmul_kernels")
        if "eqsat.backend." + n in sys.modules]
print(json.dumps([ok, mods]))
"""


def _fresh(cache: Path, **env: str) -> tuple[bool, list[str]]:
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(cache)], capture_output=True,
                         text=True, check=True, env={**os.environ, **env})
    ok, mods = json.loads(out.stdout.strip().splitlines()[-1])
    return ok, mods


def test_cached_compile_skips_the_kernel_builders_and_the_pool_ir(tmp_path):
    ok, cold = _fresh(tmp_path)
    assert ok and "entry" in cold
    objects = {p.name for p in tmp_path.iterdir()}
    assert any(n.endswith(".layout.json") for n in objects)
    if cpu.threads() >= 2:
        assert any(n.startswith("runtime-pool-") for n in objects)  # the pool runtime's object
    ok, warm = _fresh(tmp_path)
    assert ok and warm == []


def _read_layout(layout: Path) -> dict:
    return json.loads(cache.load_checked(layout.parent, layout.name))


def _write_layout(layout: Path, data: dict) -> None:
    cache.store_checked(layout.parent, layout.name, json.dumps(data).encode())


def test_missing_or_damaged_layout_compiles_again(tmp_path):
    _fresh(tmp_path)
    (layout,) = tmp_path.glob("*.layout.json")
    _write_layout(layout, {"align": 64, "functions": {"g": {"symbol": "x", "arena_bytes": 0}}})
    ok, mods = _fresh(tmp_path)
    assert ok and "entry" in mods  # not this module's layout: a miss
    assert _read_layout(layout)["functions"].keys() == {"f"}
    layout.unlink()
    ok, mods = _fresh(tmp_path)
    assert ok and "entry" in mods and layout.exists()


def test_layout_naming_a_missing_symbol_compiles_again(tmp_path):
    # a hand-edited layout with this module's functions but a symbol the object lacks raised
    # KeyError from the loader; it is a miss now, compiled again and overwritten
    _fresh(tmp_path)
    (layout,) = tmp_path.glob("*.layout.json")
    data = _read_layout(layout)
    data["functions"]["f"]["symbol"] = "no.such.symbol"
    _write_layout(layout, data)
    ok, mods = _fresh(tmp_path)
    assert ok and "entry" in mods
    assert _read_layout(layout)["functions"]["f"]["symbol"] != "no.such.symbol"


ARENA = """module @arena
func @f(%x: f32[64,64]) -> f32[64] {
  %e = exp %x : f32[64,64]
  %t = transpose %e, perm=[1,0] : f32[64,64]
  %m = mul %t, %e : f32[64,64]
  %s = sum %m, axes=[1] : f32[64]
  return %s
}"""


def test_layout_with_a_changed_arena_size_compiles_again(tmp_path):
    """A layout that still parses after damage (one digit of an arena size changed) was
    trusted: the code wrote past the arena it was given and the process died (SIGSEGV). The
    layout carries a digest like the object, so that is a miss, compiled again."""
    script = (f"import sys, numpy as np, eqsat\n"
              f"from eqsat.backend import compile_module\n"
              f"m = eqsat.parse({ARENA!r})\n"
              f"x = np.linspace(-2, 2, 64 * 64, dtype=np.float32).reshape(64, 64)\n"
              f"got = compile_module(m, cache_dir=sys.argv[1]).f(x)\n"
              f"print(np.allclose(got, eqsat.interpret(m, 'f', x), rtol=1e-5))\n")
    compile_module(parse(ARENA), cache_dir=tmp_path)
    (layout,) = tmp_path.glob("*.layout.json")
    data = layout.read_bytes()
    assert re.search(rb'"arena_bytes": [1-9]', data)  # else there is nothing to shrink
    layout.write_bytes(re.sub(rb'"arena_bytes": \d+', b'"arena_bytes": 0', data))
    run = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True,
                         text=True)
    assert run.returncode == 0 and run.stdout.split() == ["True"], run.stderr[-2000:]
    assert layout.read_bytes() == data  # compiled again and stored again


def test_empty_cache_dir_is_refused(tmp_path, monkeypatch):
    # "" meant the current directory (Path("") is "."): objects landed wherever the process ran
    monkeypatch.chdir(tmp_path)
    with pytest.raises(eqsat.Error, match="cache_dir is empty"):
        compile_module(parse(BIG), cache_dir="")
    assert list(tmp_path.iterdir()) == []


def test_pool_object_survives_a_damaged_kernel_cache(tmp_path):
    # the pool object is its own entry: deleting it rebuilds it, results unchanged
    _fresh(tmp_path)
    for p in tmp_path.glob("runtime-pool-*.o"):
        p.unlink()
    ok, mods = _fresh(tmp_path)
    assert ok and "parallel" in mods  # built again from its IR
    if cpu.threads() >= 2:
        assert list(tmp_path.glob("runtime-pool-*.o"))


@pytest.mark.parametrize("damage", ["empty", "cut"])
def test_damaged_object_compiles_again(tmp_path, damage):
    # an emptied or cut-short object (a crash or a full disk) was handed to the loader as it
    # was: the process died (SIGSEGV); it is a miss now, compiled again and overwritten
    _fresh(tmp_path)
    objects = [p for p in tmp_path.glob("*.o")]
    assert objects
    for p in objects:
        data = p.read_bytes()
        p.write_bytes(b"" if damage == "empty" else data[:len(data) // 2])
    ok, mods = _fresh(tmp_path)
    assert ok and "entry" in mods
    ok, mods = _fresh(tmp_path)
    assert ok and mods == []  # the rewritten entries are good


@pytest.mark.parametrize("damage", ["empty", "header", "cut"])
def test_damaged_optimized_program_is_optimized_again(tmp_path, damage):
    # an optimized program that still parses after damage (empty text is an empty module, a
    # cut at a function's end a module without the rest) gave an executable missing functions
    script = ("import sys, numpy as np, eqsat\n"
              "m = eqsat.parse(sys.argv[1])\n"
              "x = np.linspace(-1, 1, 8, dtype=np.float32)\n"
              "got = eqsat.compile(m).g(x)\n"
              "print(bool(np.allclose(got, eqsat.interpret(m, 'g', x), rtol=1e-5)))\n")
    text = ("module @two\nfunc @f(%x: f32[8]) -> f32[8] {\n  %0 = tanh %x : f32[8]\n  return %0\n}\n"
            "func @g(%x: f32[8]) -> f32[8] {\n  %0 = exp %x : f32[8]\n  return %0\n}\n")
    env = {**os.environ, "EQSAT_CACHE_DIR": str(tmp_path)}

    def run() -> str:
        out = subprocess.run([sys.executable, "-c", script, text], capture_output=True,
                             text=True, env=env)
        return out.stdout.strip() + out.stderr.strip()[-300:]

    assert run() == "True"
    (entry,) = (tmp_path / "optimized").glob("*.eqir")
    data = entry.read_bytes()
    entry.write_bytes({"empty": b"", "header": b"module @two\n",
                       "cut": data[:data.index(b"func @g")]}[damage])
    assert run() == "True"


def test_failed_store_leaves_no_temporary_file(tmp_path):
    """A store that could not finish (here a directory where the object goes; a full disk
    alike) left its temporary file behind on every compile."""
    m = parse(BIG.replace("@big", "@blocked"))
    (tmp_path / f"{cpu.cache_key(m)}.o").mkdir()
    for _ in range(2):
        exe = compile_module(m, cache_dir=tmp_path)
        cpu._memory.clear()
    x = np.linspace(-1, 1, N, dtype=np.float32)
    np.testing.assert_allclose(exe.f(x, x), eqsat.interpret(m, "f", x, x), rtol=1e-5, atol=1e-6)
    assert not list(tmp_path.glob("*.tmp"))


@pytest.mark.parametrize("umask", [0o022, 0o077], ids=["022", "077"])
def test_entries_are_created_as_the_umask_says(tmp_path, umask):
    """Entries were mkstemp's 0o600 whatever the umask: a cache that one user filled (a
    container image's build step) could not be read by any other, who compiled everything
    cold. They get what `open` gives a new file now."""
    old = os.umask(umask)
    try:
        compile_module(parse(ARENA.replace("@arena", f"@umask{umask}")), cache_dir=tmp_path)
    finally:
        os.umask(old)
    entries = list(tmp_path.iterdir())
    assert entries and {p.stat().st_mode & 0o777 for p in entries} == {0o666 & ~umask}


@pytest.mark.parametrize("mode", ["all", "batched", "0", " 0 ", ""])
def test_gemm_switches_without_gemm_match_gemm(mode):
    script = ("import sys\nfrom eqsat.backend import cpu\n"
              "assert 'eqsat.backend.gemm' not in sys.modules\n"
              "a = cpu.gemm_switches()\n"
              "from eqsat.backend import gemm\n"
              "print(a == (gemm.ENABLED, gemm.LONE_PRODUCTS) == cpu.gemm_switches())\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True, env={**os.environ, "EQSAT_GEMM": mode})
    assert out.stdout.split() == ["True"]


def test_threads_without_parallel_match_parallel():
    from eqsat.backend import parallel

    assert cpu.threads() == parallel.THREADS


def test_key_changes_with_module_gemm_threads_and_source(monkeypatch):
    from eqsat.backend import gemm, parallel

    m = parse(BIG)
    key = cpu.cache_key(m)
    assert cpu.cache_key(parse(BIG.replace("tanh", "sigmoid"))) != key
    monkeypatch.setattr(gemm, "LONE_PRODUCTS", not gemm.LONE_PRODUCTS)
    assert cpu.cache_key(m) != key
    monkeypatch.undo()
    monkeypatch.setattr(parallel, "THREADS", parallel.THREADS + 1)
    assert cpu.cache_key(m) != key
    monkeypatch.undo()
    assert cpu.cache_key(m) == key
    # the code generator's source: the (per-process) fingerprint covers every backend file,
    # and the IR layer's it lowers with (a changed fused-op expansion kept its stale objects)
    fresh = jit.fingerprint.__wrapped__
    assert fresh() == jit.fingerprint()
    real = Path.read_bytes
    for changed in ("parallel.py", "fused.py", "scalar_expr.py", "host.py"):
        monkeypatch.setattr(Path, "read_bytes",
                            lambda p, changed=changed: real(p) + (b"#" if p.name == changed
                                                                  else b""))
        assert fresh() != jit.fingerprint()


def test_key_while_another_thread_imports_gemm_and_parallel(monkeypatch):
    """A first compile imports gemm and parallel under the compile lock; another thread
    computing its key meanwhile found them in sys.modules before their switches were
    assigned, and raised AttributeError (8 threads compiling at once from an empty cache)."""
    m = parse(BIG)
    key = cpu.cache_key(m)
    for name in ("gemm", "parallel"):
        monkeypatch.setitem(sys.modules, f"eqsat.backend.{name}", types.ModuleType(name))
    assert cpu.cache_key(m) == key


def test_gemm_env_changes_the_key_in_fresh_processes():
    script = (f"import eqsat\nfrom eqsat.backend import cpu\n"
              f"print(cpu.cache_key(eqsat.parse({BIG!r})))\n")
    keys = {subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                           check=True, env={**os.environ, "EQSAT_GEMM": mode}).stdout.strip()
            for mode in ("all", "batched", "0")}
    assert len(keys) == 3


def test_memory_cache_reuses_code_and_layout(tmp_path):
    m = parse(BIG)
    a = compile_module(m, cache_dir=tmp_path)
    b = compile_module(m, cache_dir=tmp_path)
    assert a._code is b._code and a.key == b.key
    x = np.linspace(-1, 1, N, dtype=np.float32)
    np.testing.assert_array_equal(a.f(x, x), b.f(x, x))
    np.testing.assert_allclose(a.f(x, x), eqsat.interpret(m, "f", x, x), rtol=1e-5, atol=1e-6)


def test_memory_cache_lets_go_of_code_no_executable_uses(tmp_path):
    """Each loaded program kept its engine (~150 KB) for the life of the process: 500
    distinct programs compiled and dropped grew RSS by 75 MB."""
    m = parse(BIG.replace("@big", "@dropped"))
    exe = compile_module(m, cache_dir=tmp_path)
    code = weakref.ref(exe._code)
    del exe
    gc.collect()
    assert code() is None and cpu.cache_key(m) not in cpu._memory
    x = np.linspace(-1, 1, N, dtype=np.float32)
    np.testing.assert_allclose(compile_module(m, cache_dir=tmp_path).f(x, x),
                               eqsat.interpret(m, "f", x, x), rtol=1e-5, atol=1e-6)


# A fresh process: RSS growth (KiB) over 100 cold compiles (or PTX emissions) of distinct
# programs, each dropped, after 20 to warm up.
GROWTH = """
import gc, os, sys
import eqsat
from eqsat.backend import cpu
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
def compile_dropped(n):
    m = eqsat.parse(f"module @m\\nfunc @f(%x: f32[{n}]) -> f32[{n}] {{\\n"
                    f"  %0 = add %x, %x : f32[{n}]\\n  return %0\\n}}\\n")
    if sys.argv[1] == "ptx":
        eqsat.emit(m, target="ptx")
    else:
        cpu.compile_module(m, cache_dir=None).f
for n in range(1001, 1021):
    compile_dropped(n)
gc.collect()
before = rss()
for n in range(1, 101):
    compile_dropped(n)
gc.collect()
print((rss() - before) // 1024)
"""


@pytest.mark.parametrize("target", ["cpu", "ptx"])
def test_cold_compiles_of_distinct_programs_free_their_pass_pipelines(target):
    """llvmlite never freed a pass pipeline (jit.free_pass_manager): these 100 kept 9.5 MB
    (8.5 MB as PTX), within 0.2 MB run to run; freed, 0.9 or 1.9 MB (0.5 MB as PTX), what
    llvmlite's PassBuilder leaks besides (README, Compiling and running)."""
    out = subprocess.run([sys.executable, "-c", GROWTH, target], capture_output=True,
                         text=True, check=True)
    assert int(out.stdout.split()[-1]) < 4096


CALLS = """module @calls
func @f(%x: f64[4], %y: f64[4]) -> (f64[4], f64[4]) {
  %a, %b = call @g(%x, %y) : f64[4], f64[4]
  %c = mul %a, %b : f64[4]
  return %c, %a
}
func @g(%x: f64[4], %y: f64[4]) -> (f64[4], f64[4]) {
  %s = add %x, %y : f64[4]
  %d = sub %x, %y : f64[4]
  return %s, %d
}"""


def test_layout_of_a_module_with_calls_hits_in_a_fresh_process(tmp_path):
    # plans come in call order (g before f), module order is f, g: still a hit
    script = (f"import sys, json, numpy as np, eqsat\n"
              f"from eqsat.backend import compile_module\n"
              f"m = eqsat.parse({CALLS!r})\n"
              f"x, y = np.arange(4.0), np.array([1.0, -2.0, 0.5, 3.0])\n"
              f"exe = compile_module(m, cache_dir=sys.argv[1])\n"
              f"got = [exe.f(x, y), exe.g(x, y)]\n"
              f"want = [eqsat.interpret(m, 'f', x, y), eqsat.interpret(m, 'g', x, y)]\n"
              f"ok = all(np.array_equal(a, b) for g, w in zip(got, want) for a, b in zip(g, w))\n"
              f"print(json.dumps([ok, 'eqsat.backend.entry' in sys.modules]))\n")
    runs = [json.loads(subprocess.run([sys.executable, "-c", script, str(tmp_path)],
                                      capture_output=True, text=True,
                                      check=True).stdout.strip().splitlines()[-1])
            for _ in range(2)]
    assert runs == [[True, True], [True, False]]


PRODUCT = """module @mm
func @f(%a: f32[64,300], %b: f32[300,200]) -> f32[64,200] {
  %c = matmul %a, %b : f32[64,200]
  return %c
}"""
PRODUCT_SCRIPT = f"""
import sys, json
import numpy as np
import eqsat
from eqsat.backend import compile_module
m = eqsat.parse({PRODUCT!r})
rng = np.random.default_rng(0)
a, b = rng.standard_normal((64, 300), np.float32), rng.standard_normal((300, 200), np.float32)
got = compile_module(m, cache_dir=sys.argv[1]).f(a, b)
ok = bool(np.allclose(got, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-3))
print(json.dumps([ok, [n for n in ("gemm", "entry") if "eqsat.backend." + n in sys.modules]]))
"""


def test_gemm_runtime_is_compiled_once_per_machine(tmp_path):
    """The GEMM's driver is a runtime library: built on first use, then loaded from its cached
    object by every program (never compiled into one), rebuilt when damaged."""
    from eqsat.backend import gemm

    if not gemm.supports(eqsat.ir.DType.f32):
        pytest.skip("the generated GEMM is switched off (EQSAT_GEMM)")

    def run() -> tuple[bool, list[str]]:
        out = subprocess.run([sys.executable, "-c", PRODUCT_SCRIPT, str(tmp_path)],
                             capture_output=True, text=True, check=True)
        ok, mods = json.loads(out.stdout.strip().splitlines()[-1])
        return ok, mods

    assert run() == (True, ["gemm", "entry"])
    (runtime,) = tmp_path.glob("runtime-gemm-f32-*.o")
    built = runtime.stat().st_mtime_ns
    for p in tmp_path.glob("*.o"):
        if not p.name.startswith("runtime-"):
            p.unlink()
    assert run() == (True, ["gemm", "entry"])  # the program compiled again...
    assert runtime.stat().st_mtime_ns == built  # ...against the runtime as it was
    assert run() == (True, [])  # all cached: no kernel builder, no GEMM IR
    runtime.write_bytes(runtime.read_bytes()[:100])
    assert run() == (True, ["gemm"])  # only the damaged runtime is built again
    assert runtime.stat().st_size > 100


# A fresh process: a product on the BLAS from the cache in argv[1], with only the OpenBLAS
# bundled with argv[2] ("numpy": ILP64, "scipy": LP64) bound; prints its binding and the check.
BLAS_SCRIPT = """
import sys
import numpy as np
import eqsat
from eqsat.backend import blas, compile_module
blas._BUNDLED = tuple(b for b in blas._BUNDLED if b[0] == sys.argv[2])
m = eqsat.parse('''module @lone
func @f(%a: f32[64,96], %b: f32[96,80]) -> f32[64,80] {
  %0 = matmul %a, %b : f32[64,80]
  return %0
}''')
a = np.linspace(-1, 1, 64 * 96, dtype=np.float32).reshape(64, 96)
b = np.cos(np.arange(96 * 80, dtype=np.float32)).reshape(96, 80)
got = compile_module(m, cache_dir=sys.argv[1]).f(a, b)
print(",".join(sorted(blas.addresses())), bool(np.allclose(got, a @ b, rtol=1e-4, atol=1e-4)))
"""


def test_objects_calling_another_blas_binding_are_not_reused(tmp_path):
    """One cache shared by environments whose BLAS binds under other symbols (numpy's ILP64
    OpenBLAS, scipy's LP64 one: two virtual environments) reused the other's object code: its
    gemm calls went to unbound symbols and the process died of a segfault."""
    env = {**os.environ, "EQSAT_GEMM": "0"}
    outs = [subprocess.run([sys.executable, "-c", BLAS_SCRIPT, str(tmp_path), lib],
                           capture_output=True, text=True, env=env)
            for lib in ("numpy", "scipy")]
    bindings = {o.stdout.split()[0] for o in outs if o.returncode == 0 and o.stdout}
    if len(bindings) < 2 and all(o.returncode == 0 for o in outs):
        pytest.skip("numpy's and scipy's OpenBLAS are not both bundled here")
    assert [(o.returncode, o.stdout.split()[-1:]) for o in outs] == [(0, ["True"])] * 2


@pytest.mark.parametrize("value", ["off", "blas", "1", "ALL"])
def test_an_unknown_gemm_setting_is_an_error_at_compile(monkeypatch, value):
    """EQSAT_GEMM other than all, batched or 0 meant "all", so a typo went unnoticed."""
    from eqsat.backend import cpu

    monkeypatch.setenv("EQSAT_GEMM", value)
    with pytest.raises(eqsat.Error, match="EQSAT_GEMM must be"):
        cpu.cache_key(eqsat.parse(
            "func @f(%x: f32[2]) -> f32[2] {\n  %0 = neg %x : f32[2]\n  return %0\n}"))
    monkeypatch.setenv("EQSAT_GEMM", " batched ")
    cpu.cache_key(eqsat.parse(
        "func @f(%x: f32[2]) -> f32[2] {\n  %0 = neg %x : f32[2]\n  return %0\n}"))
