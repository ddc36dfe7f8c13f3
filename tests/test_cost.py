"""Cost models: work per op, roofline targets, module costs, the cached cpu measurement."""

from __future__ import annotations

import dataclasses
import json

import pytest

import eqsat
from eqsat.extract import (CUDA, TARGETS, EGraph, Roofline, Work, cost_model, function_costs,
                           module_cost, node_costs, work)
from eqsat.extract import machine
from eqsat.extract.cost import LANE_FLOPS, OVERLAP, body_flops
from eqsat.ir import DType
from eqsat.ir.op_costs import element_cost

f32 = DType.f32


def mod(text: str) -> eqsat.Module:
    return eqsat.parse("module @m\n" + text)


CHAIN = """
func @left(%a: f32[4096,64], %b: f32[64,4096], %c: f32[4096,64]) -> f32[4096,64] {
  %ab = matmul %a, %b : f32[4096,4096]
  %r = matmul %ab, %c : f32[4096,64]
  return %r
}
func @right(%a: f32[4096,64], %b: f32[64,4096], %c: f32[4096,64]) -> f32[4096,64] {
  %bc = matmul %b, %c : f32[64,64]
  %r = matmul %a, %bc : f32[4096,64]
  return %r
}
"""

UNFUSED = """
func @f(%x: f32[1024,1024], %y: f32[1024,1024]) -> f32[1024,1024] {
  %a = add %x, %y : f32[1024,1024]
  %b = tanh %a : f32[1024,1024]
  %c = mul %b, %x : f32[1024,1024]
  return %c
}
"""

FUSED = """
func @f(%x: f32[1024,1024], %y: f32[1024,1024]) -> f32[1024,1024] {
  %c = map %x, %y, body=mul(tanh(add($0, $1)), $0) : f32[1024,1024]
  return %c
}
"""

# A fixed model so the tests do not depend on this machine's measurement.
SLOW_CPU = Roofline("cpu-like", peak_flops=100e9, bandwidth=20e9, launch=1e-6)


@pytest.mark.parametrize("model", [CUDA, SLOW_CPU], ids=["cuda", "cpu-like"])
def test_matmul_chain_orders_differ_as_flops_say(model):
    costs = function_costs(mod(CHAIN), model)
    # (AB)C does 4.3e9 flops and writes a 64 MiB intermediate; A(BC) 6.7e7
    assert costs["left"] > 5 * costs["right"]


def test_matmul_work_is_2mnk():
    w = work("matmul", {}, [f32[2, 8, 16], f32[2, 16, 4]], [f32[2, 8, 4]])
    assert w.flops == 2 * 2 * 8 * 16 * 4
    assert w.bytes == 4 * (2 * 8 * 16 + 2 * 16 * 4 + 2 * 8 * 4)
    assert w.kernels == 1
    # a transposed operand stored as [k, m] is priced the same
    wt = work("matmul_t", {"ta": 1, "tb": 0}, [f32[2, 16, 8], f32[2, 16, 4]], [f32[2, 8, 4]])
    assert wt == w


@pytest.mark.parametrize("model", [CUDA, SLOW_CPU], ids=["cuda", "cpu-like"])
def test_fused_map_is_cheaper_than_its_unfused_chain(model):
    unfused, fused = module_cost(mod(UNFUSED), model), module_cost(mod(FUSED), model)
    assert fused < unfused
    # same flops; the fused kernel moves 3 arrays instead of 8 and launches once instead of 3
    n = 1024 * 1024
    w_fused = work("map", mod(FUSED)["f"].body[0].attr, [f32[1024, 1024]] * 2, [f32[1024, 1024]])
    assert w_fused.bytes == 3 * 4 * n and w_fused.kernels == 1
    assert w_fused.flops == LANE_FLOPS * (1 + element_cost("tanh") + 1) * n


def test_transcendentals_weigh_more_than_adds():
    t = [f32[64]]
    assert work("exp", {}, t, t).flops > 5 * work("add", {}, t * 2, t).flops
    assert work("tanh", {}, t, t).flops >= work("exp", {}, t, t).flops
    # the generated sin reduces its argument at length: over four exps (measured)
    assert work("sin", {}, t, t).flops > 4 * work("exp", {}, t, t).flops


def test_f64_work_costs_more_than_f32():
    """Half the lanes per vector, and longer polynomials for the transcendentals."""
    f64 = DType.f64
    for op in ("add", "exp", "tanh", "sin"):
        wide, narrow = work(op, {}, [f64[64]], [f64[64]]), work(op, {}, [f32[64]], [f32[64]])
        assert wide.flops >= 2 * narrow.flops
    assert work("matmul", {}, [f64[8, 16], f64[16, 4]], [f64[8, 4]]).flops == 2 * 2 * 8 * 16 * 4
    assert work("sum", {"axes": (0,)}, [f64[64]], [f64[()]]).flops == 2 * LANE_FLOPS * 64


def test_reshapes_are_free_and_copies_cost_their_bytes():
    x, y = f32[256, 512], f32[512, 256]
    assert work("reshape", {}, [x], [f32[512, 256]]) == Work()
    # a broadcast or a slice left standing is a copy kernel on the GPU; the CPU's kernels read
    # both in place
    assert work("broadcast", {}, [f32[512]], [x]) == Work(0.0, 4 * 512 + x.nbytes, 1)
    window = work("slice", {"start": (0, 0), "stop": (128, 512)}, [x], [f32[128, 512]])
    assert window == Work(0.0, 2 * f32[128, 512].nbytes, 1)  # it reads only its window
    attrs = {"start": (0, 0), "stop": (128, 512)}
    assert cost_model("cuda").stmt_cost("slice", attrs, [x], [f32[128, 512]]) > 0
    assert cost_model("cpu").stmt_cost("slice", attrs, [x], [f32[128, 512]]) == 0
    assert cost_model("cpu").stmt_cost("broadcast", {}, [f32[512]], [x]) == 0
    t = work("transpose", {"perm": (1, 0)}, [x], [y])
    assert t.bytes == 2 * x.nbytes and t.flops == 0 and t.kernels == 1
    # folding the transpose into the matmul saves its whole cost
    plain = mod("""
    func @f(%a: f32[512,256], %b: f32[512,64]) -> f32[256,64] {
      %t = transpose %a, perm=[1,0] : f32[256,512]
      %r = matmul %t, %b : f32[256,64]
      return %r
    }""")
    folded = mod("""
    func @f(%a: f32[512,256], %b: f32[512,64]) -> f32[256,64] {
      %r = matmul_t %a, %b, ta=1, tb=0 : f32[256,64]
      return %r
    }""")
    for model in (CUDA, SLOW_CPU):
        saved = module_cost(plain, model) - module_cost(folded, model)
        assert saved == pytest.approx(model.seconds(t))


def test_map_reduce_and_epilogue_work():
    w = work("map_reduce", mod("""
    func @f(%x: f32[8,4], %y: f32[4]) -> f32[8] {
      %s = map_reduce %x, %y, body=mul($0, $1), reduce=sum, axes=[1] : f32[8]
      return %s
    }""")["f"].body[0].attr, [f32[8, 4], f32[4]], [f32[8]])
    assert w.flops == LANE_FLOPS * 2 * 32 and w.bytes == 4 * (32 + 4 + 8) and w.kernels == 1
    epi = mod("""
    func @f(%x: f32[128,64], %w: f32[64,10], %b: f32[10]) -> f32[128,10] {
      %h = matmul_epi %x, %w, %b, ta=0, tb=0, body=relu(add($0, $1)) : f32[128,10]
      return %h
    }""")
    body = epi["f"].body[0].attr
    w = work("matmul_epi", body, [f32[128, 64], f32[64, 10], f32[10]], [f32[128, 10]])
    assert w.flops == 2 * 128 * 64 * 10 + LANE_FLOPS * 2 * 128 * 10
    assert w.bytes == 4 * (128 * 64 + 64 * 10 + 10 + 128 * 10)


def test_call_costs_its_callee_and_module_cost_sums_functions():
    m = mod("""
    func @g(%x: f32[64,64]) -> f32[64,64] {
      %e = exp %x : f32[64,64]
      return %e
    }
    func @f(%x: f32[64,64]) -> f32[64,64] {
      %a = call @g(%x) : f32[64,64]
      %b = add %a, %x : f32[64,64]
      return %b
    }""")
    costs = function_costs(m, CUDA)
    add = CUDA.stmt_cost("add", {}, [f32[64, 64]] * 2, [f32[64, 64]])
    assert costs["f"] == pytest.approx(costs["g"] + add)
    assert module_cost(m, CUDA) == pytest.approx(costs["f"] + costs["g"])
    assert eqsat.ir.verify(m) is m


def test_gradient_declarations_are_costed_after_expansion():
    m = mod("""
    func @loss(%x: f32[16,8], %w: f32[8,4]) -> f32[] {
      %p = matmul %x, %w : f32[16,4]
      %t = sum %p, axes=[0,1] : f32[]
      return %t
    }
    func @loss_grad = grad @loss wrt %w
    """)
    costs = function_costs(m, CUDA)
    assert set(costs) == {"loss", "loss_grad"}
    assert costs["loss_grad"] > 0


def test_unknown_target_lists_the_valid_ones():
    with pytest.raises(eqsat.Error, match="unknown target 'tpu'.*cpu, cuda"):
        module_cost(mod(CHAIN), "tpu")
    with pytest.raises(eqsat.Error):
        cost_model(42)
    assert TARGETS == ("cpu", "cuda")
    with pytest.raises(eqsat.Error, match="bandwidth"):
        Roofline("bad", 1e9, 0.0, 0.0)


def test_a_custom_cost_model_is_used_as_is():
    class CountKernels:
        name = "kernels"

        def stmt_cost(self, op, attrs, operands, results):
            return 0.0 if op in ("reshape", "broadcast") else 1.0

    assert module_cost(mod(UNFUSED), CountKernels()) == 3.0
    assert module_cost(mod(FUSED), CountKernels()) == 1.0


def test_node_costs_of_an_egraph_match_the_statements():
    t = f32[1024, 1024]
    g = EGraph([("x", "param", {"name": "x"}, []), ("y", "param", {"name": "y"}, []),
                ("a", "add", {}, ["x", "y"]), ("b", "tanh", {}, ["a"]),
                ("c", "mul", {}, ["b", "x"])],
               types={"x": t, "y": t, "a": t, "b": t, "c": t}, roots=["c"])
    assert node_costs(g, CUDA).sum() == pytest.approx(module_cost(mod(UNFUSED), CUDA))
    with pytest.raises(eqsat.Error, match="callee"):
        node_costs(EGraph([("x", "param", {}, []), ("r", "call", {"callee": "g"}, ["x"])],
                          types={"x": t, "r": t}, roots=["r"]), CUDA)


def test_cpu_rates_are_measured_once_and_cached(tmp_path, monkeypatch):
    first = machine.cpu_rates(tmp_path)
    assert first.gflops > 0.1 and first.bandwidth_gbs > 0.1
    data = json.loads((tmp_path / machine.CACHE_FILE).read_text())
    assert data["gflops"] == first.gflops

    def no_measuring():
        raise AssertionError("measured again despite a valid cache")

    monkeypatch.setattr(machine, "measure", no_measuring)
    assert machine.cpu_rates(tmp_path) == first
    monkeypatch.setenv(machine.CACHE_ENV, str(tmp_path))
    assert machine.cache_dir() == tmp_path
    assert machine.cpu_rates() == first


@pytest.mark.parametrize("llc_mib", [2, 32, 480, 4096])
def test_measuring_copies_a_bounded_number_of_bytes(llc_mib, monkeypatch):
    """The copies that measure the bandwidths outgrow the last-level cache, up to a cap: a
    virtual machine reporting its socket's 480 MiB L3 copied 960 MiB arrays, and the first
    compile on an empty cache took 6.3 s instead of under one."""
    sizes = []
    make = machine._copy_buffers

    def recorded(nbytes: int):
        sizes.append(nbytes)
        return make(min(nbytes, 1 << 20))  # the sizes are the point, not the rates

    monkeypatch.setattr(machine, "last_level_cache", lambda: llc_mib * 2**20)
    monkeypatch.setattr(machine, "_copy_buffers", recorded)
    rates = machine.measure()
    assert rates.cache_bytes == llc_mib * 2**20 // 2
    assert sizes == [min(max(machine._COPY_BYTES, 2 * llc_mib * 2**20), machine._COPY_MAX_BYTES)]
    assert rates.cache_bandwidth_gbs >= rates.bandwidth_gbs > 0


def test_a_damaged_or_foreign_cache_is_measured_again(tmp_path, monkeypatch):
    path = tmp_path / machine.CACHE_FILE
    fake = machine.CpuRates(1.0, 2.0, machine.machine_key())
    monkeypatch.setattr(machine, "measure", lambda: fake)
    path.write_text("{not json")
    assert machine.cpu_rates(tmp_path) == fake
    path.write_text(json.dumps({"gflops": 5.0, "bandwidth_gbs": 5.0, "key": "another machine"}))
    assert machine.cpu_rates(tmp_path) == fake
    # a file of an older eqsat, without the cache's rate, is measured again
    path.write_text(json.dumps({"gflops": 5.0, "bandwidth_gbs": 5.0, "key": machine.machine_key()}))
    assert machine.cpu_rates(tmp_path) == fake
    assert machine.cpu_rates(tmp_path / "missing" / "dir") == fake


def test_the_cpu_model_follows_the_cache_directory_in_force(tmp_path, monkeypatch):
    """The model was kept by the directory argument (None for "the default"), so one made
    while EQSAT_CACHE_DIR named another directory was used after it changed: the suite's
    check that the model matches cpu_rates() failed after a test that had set the variable."""
    for i, gflops in enumerate((3.0, 7.0)):
        d = tmp_path / str(i)
        d.mkdir()
        rates = machine.CpuRates(gflops, 2.0, machine.machine_key(), 4.0, 1 << 20)
        (d / machine.CACHE_FILE).write_text(json.dumps(dataclasses.asdict(rates)))
        monkeypatch.setenv(machine.CACHE_ENV, str(d))
        assert cost_model("cpu").peak_flops == gflops * 1e9


def test_rates_that_cannot_be_stored_leave_no_temporary_file(tmp_path, monkeypatch):
    """Every process that measured the rates and could not store them (a full disk; here a
    directory where the file goes) left its machine.PID.tmp behind."""
    fake = machine.CpuRates(1.0, 2.0, machine.machine_key())
    monkeypatch.setattr(machine, "measure", lambda: fake)
    (tmp_path / machine.CACHE_FILE).mkdir()
    assert machine.cpu_rates(tmp_path) == fake
    assert [p.name for p in tmp_path.iterdir()] == [machine.CACHE_FILE]


def test_cpu_target_uses_the_measured_rates():
    model = cost_model("cpu")
    assert model.name == "cpu" and model.peak_flops > 0 and model.bandwidth > 0
    assert module_cost(mod(CHAIN), "cpu") > 0


def test_roofline_charges_a_share_of_the_lesser_term():
    """Two kernels moving the same bytes: the one computing more costs more, though both are
    memory-bound (a pure max would tie them, and extraction would pick either)."""
    light, heavy = Work(1e6, 4e6, 1), Work(2e6, 4e6, 1)
    for model in (CUDA, SLOW_CPU):
        assert model.seconds(light) < model.seconds(heavy)
        memory = 4e6 / model.bandwidth
        assert model.seconds(light) == pytest.approx(
            memory + model.overlap * 1e6 / model.peak_flops + model.launch)


def test_small_kernels_get_one_core_and_cached_bytes_the_cache_bandwidth():
    """The CPU backend keeps a kernel whose bytes plus simple operations are under its
    threading threshold on the calling thread: one core's share of the peak. A kernel whose
    bytes fit in the cache reads what the kernel before it left there."""
    model = Roofline("two cores", peak_flops=100e9, bandwidth=20e9, launch=0.0, cores=2,
                     serial_work=1e6, cache_bytes=1e6, cache_bandwidth=80e9)
    small = Work(flops=4e5, bytes=4e5, kernels=1)  # 4e5 bytes + 2e5 operations: serial
    compute, memory = 4e5 / 50e9, 4e5 / 80e9
    assert model.seconds(small) == pytest.approx(max(compute, memory)
                                                 + OVERLAP * min(compute, memory))
    large = Work(flops=4e7, bytes=4e7, kernels=1)
    compute, memory = 4e7 / 100e9, 4e7 / 20e9
    assert model.seconds(large) == pytest.approx(memory + OVERLAP * compute)
    for bad in ({"cores": 0}, {"serial_work": -1.0}, {"cache_bytes": float("nan")},
                {"cache_bytes": 1e6, "cache_bandwidth": 0.0}, {"overlap": 1.5}):
        with pytest.raises(eqsat.Error, match="Roofline 'x'"):
            Roofline("x", peak_flops=1e9, bandwidth=1e9, launch=0.0, **bad)


def test_a_kernel_on_the_calling_core_costs_a_call_not_a_thread_handoff():
    """On the CPU a kernel too small for the threads is a call and a loop's setup (chains of
    41 small kernels ran 3-4 ns per kernel slower than one); a microsecond apiece, the price
    of handing one to the pool, made 41 tiny negations cost 41 us and bought fusion with
    recomputation that ran slower than the program as written."""
    model = Roofline("two cores", peak_flops=100e9, bandwidth=20e9, launch=1e-6, cores=2,
                     serial_work=1e6, serial_launch=2e-8)
    assert model.seconds(Work(flops=100.0, bytes=100.0, kernels=1)) < 3e-8
    assert model.seconds(Work(flops=4e7, bytes=4e7, kernels=1)) > 1e-6
    assert SLOW_CPU.seconds(Work(0.0, 0.0, 1)) == SLOW_CPU.launch  # unset: one price for all
    chain = mod("func @f(%x: f32[8]) -> f32[8] {\n" + "".join(
        f"  %v{i + 1} = neg %v{i} : f32[8]\n" for i in range(41)).replace("%v0", "%x")
        + "  return %v41\n}")
    assert eqsat.cost(chain, target="cpu") < 2e-6
    with pytest.raises(eqsat.Error, match="serial_launch must be >= 0"):
        Roofline("x", peak_flops=1e9, bandwidth=1e9, launch=0.0, serial_launch=-1.0)


def test_zero_size_kernels_cost_on_a_model_without_a_cache():
    """A kernel of zero bytes is not 'in the cache' of a model that has none: it divided by
    the cache bandwidth of 0 (ZeroDivisionError from cost, optimize and compile for cuda)."""
    m = mod("""
func @f(%a: f32[0,5], %b: f32[0,5]) -> f32[0,5] {
  %y = exp %a : f32[0,5]
  %z = add %y, %b : f32[0,5]
  return %z
}""")
    for model in (CUDA, SLOW_CPU):
        assert model.seconds(Work(0.0, 0.0, 1)) == model.launch
        assert eqsat.cost(m, target=model) >= 0.0
    assert eqsat.cost(eqsat.optimize(m, target="cuda"), target="cuda") >= 0.0


def test_cpu_model_knows_the_cores_the_threshold_and_the_cache():
    from eqsat.host import PARALLEL_MIN_WORK, usable_cores

    model = cost_model("cpu")
    rates = machine.cpu_rates()
    assert model.cores == usable_cores() and model.serial_work == PARALLEL_MIN_WORK
    assert model.cache_bytes == rates.cache_bytes > 0
    assert model.cache_bandwidth == rates.cache_bandwidth_gbs * 1e9 >= model.bandwidth


def test_last_level_cache_is_the_largest_size_sysfs_lists(tmp_path):
    for index, size in enumerate(["32K", "1024K", "32768K", "garbage"]):
        (tmp_path / f"index{index}").mkdir()
        (tmp_path / f"index{index}" / "size").write_text(size + "\n")
    assert machine.last_level_cache(tmp_path) == 32 * 2**20
    assert machine.last_level_cache(tmp_path / "missing") == machine._DEFAULT_LLC


def test_row_invariant_subterms_cost_once_per_row():
    """rsqrt of a per-row value is hoisted out of the row loop by the code generator: it costs
    once per row, the per-element product once per element."""
    body = mod("""
    func @f(%x: f32[256,512], %v: f32[256,1]) -> f32[256,512] {
      %y = map %x, %v, body=mul($0, rsqrt($1)) : f32[256,512]
      return %y
    }""")["f"].body[0].attr["body"]
    ins = [f32[256, 512], f32[256, 1]]
    rsqrt = element_cost("rsqrt")
    assert body_flops(body, ins, (256, 512)) == 256 * 512 * 1 + 256 * rsqrt
    # a column vector varies along the rows only; a row vector along the last axis
    assert body_flops(body, [f32[256, 512], f32[512]], (256, 512)) == 256 * 512 * (1 + rsqrt)
    assert work("map", {"body": body}, ins, [f32[256, 512]]).flops == LANE_FLOPS * (
        256 * 512 + 256 * rsqrt)


def test_every_layer_counts_the_cores_this_process_may_use(monkeypatch):
    """The CPU backend's threads and the measured peak both follow the CPU affinity (a
    container or taskset narrows it below os.cpu_count()), at most 16."""
    from eqsat import host
    from eqsat.backend import settings

    monkeypatch.setattr(host.os, "sched_getaffinity", lambda pid: {3}, raising=False)
    assert host.usable_cores() == settings.default_threads() == 1
    monkeypatch.setattr(host.os, "sched_getaffinity", lambda pid: set(range(64)), raising=False)
    assert host.usable_cores() == settings.default_threads() == host.MAX_THREADS


def test_a_full_reduction_runs_on_one_core():
    """The CPU backend splits an outermost kept axis among threads, and cuts a reduction whose
    outermost axis is reduced (a column sum, a full sum) into parts the threads share where
    that axis has a multiple of REDUCTION_PARTS rows and the domain SPLIT_MIN_ELEMENTS
    elements; the rest runs on one core."""
    x = f32[1024, 1024]
    model = Roofline("two cores", peak_flops=100e9, bandwidth=20e9, launch=0.0, cores=2,
                     serial_work=2**20)
    rows = work("sum", {"axes": (1,)}, [x], [f32[1024]])
    cols = work("sum", {"axes": (0,)}, [x], [f32[1024]])
    whole = work("sum", {"axes": (0, 1)}, [x], [f32[()]])
    assert not rows.one_core and not cols.one_core and not whole.one_core
    odd = f32[1023, 1024]
    assert work("sum", {"axes": (0,)}, [odd], [f32[1024]]).one_core
    assert work("sum", {"axes": (0, 1)}, [odd], [f32[()]]).one_core
    assert work("sum", {"axes": (1,)}, [f32[1, 1024]], [f32[1]]).one_core
    assert not work("sum", {"axes": (0,)}, [f32[1, 1024, 8]], [f32[1024, 8]]).one_core
    cube = f32[8, 64, 32]  # 16k elements: too few to cut
    assert not work("sum", {"axes": (1, 2)}, [cube], [f32[8]]).one_core
    assert work("sum", {"axes": (0, 1)}, [cube], [f32[32]]).one_core
    assert work("sum", {"axes": (0, 2)}, [cube], [f32[64]]).one_core
    big = f32[64, 64, 32]
    assert not work("sum", {"axes": (0, 2)}, [big], [f32[64]]).one_core
    assert model.seconds(Work(1e10, 1e6, 1, one_core=True)) == pytest.approx(
        2 * model.seconds(Work(1e10, 1e6, 1)), rel=1e-3)
