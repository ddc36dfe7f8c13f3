"""Native e-graphs reused across modules (rules/egraph_pool.py): each module must find an
e-graph holding nothing of the modules before it."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import eqsat
from eqsat.rules import bridge, default, egraph_pool, parse as parse_rules
from eqsat.rules.compile import compile_ruleset
from eqsat.rules.runner import _matches, saturate, saturate_egraph

A = """module @a
func @f(%x: f32[4], %y: f32[4]) -> f32[4] {
  %s = add %x, %y : f32[4]
  %e = exp %s : f32[4]
  return %e
}
"""
B = """module @b
func @f(%x: f32[4]) -> f32[4] {
  %s = mul %x, %x : f32[4]
  return %s
}
"""


@pytest.fixture(autouse=True)
def empty_pool():
    egraph_pool.clear()
    yield
    egraph_pool.clear()


def _kept(rules: str) -> list:
    return egraph_pool.kept(rules)


def test_a_closed_egraph_is_reused_and_holds_nothing_of_its_module():
    rules = compile_ruleset(default())
    eg = bridge.load(eqsat.parse(A), rules=rules)
    native = eg.native
    eg.close()
    assert _kept(rules) == [native]
    eg2 = bridge.load(eqsat.parse(B), rules=rules)
    assert eg2.native is native
    ser = eg2.serialize()
    ops = {n.op for n in ser.nodes.values()}
    assert "add" not in ops and "exp" not in ops and "mul" in ops
    assert len(ser.classes) == 2  # %x and %x * %x
    eg2.close()


def test_optimizing_one_module_after_another_gives_each_its_own_program():
    a, b = eqsat.parse(A), eqsat.parse(B)
    for _ in range(2):
        oa, ob = eqsat.optimize(a), eqsat.optimize(b)
        x = np.linspace(-1, 1, 4, dtype=np.float32)
        np.testing.assert_allclose(eqsat.interpret(oa, "f", x, x), np.exp(2 * x), rtol=1e-6)
        np.testing.assert_allclose(eqsat.interpret(ob, "f", x), x * x, rtol=1e-6)
    # the built-in rules are all well-typed: their e-graph's analysis does not check types
    assert len(egraph_pool.kept(compile_ruleset(default()), "unchecked")) >= 1


def test_an_egraph_is_kept_per_schema_and_rule_set():
    """An e-graph whose analysis does not check types (for well-typed rules) never serves a
    load that asks for the checking one with the same rules, nor the other way round: each
    module finds the analysis it asked for."""
    rules = compile_ruleset(default())
    m = eqsat.parse(A)
    unchecked = bridge.load(m, rules=rules, checks=False)
    native = unchecked.native
    unchecked.close()
    checked = bridge.load(m, rules=rules)
    assert checked.native is not native and checked.checks
    checked.close()
    assert egraph_pool.kept(rules, "unchecked") == [native]
    again = bridge.load(m, rules=rules, checks=False)
    assert again.native is native and not again.checks
    with pytest.raises(bridge.BridgeError, match="takes only the rules it was loaded with"):
        again.add_rules(compile_ruleset(parse_rules("rule mine: neg(neg(?x)) => ?x")))
    again.close()


def test_a_user_rule_taking_the_typed_step_gets_the_checking_analysis():
    mine = parse_rules("rule r: neg(?x) => neg(mul(?x, const(1.0, shape=[1], dtype=f32)))")
    rules = default() + mine
    eg, _ = saturate(eqsat.parse(A), rules)
    assert eg.checks
    eg.close()
    assert len(egraph_pool.kept(compile_ruleset(rules), "checked")) == 1
    assert egraph_pool.kept(compile_ruleset(rules), "unchecked") == []


def test_an_egraph_whose_run_failed_is_dropped():
    eg = bridge.load(eqsat.parse(A))
    with pytest.raises(Exception):
        eg.run("(this is not egglog)")
    eg.close()
    assert _kept("") == []
    with pytest.raises(bridge.BridgeError, match="closed"):
        eg.run("(print-size)")


def test_rules_added_to_an_egraph_of_other_rules_are_gone_when_it_is_reused():
    """A rule set declared over the kept one (here: none) is popped with the module."""
    mine = parse_rules("rule twice: add(?x, ?x) => add(neg(neg(?x)), ?x)")
    m = eqsat.parse(A.replace("add %x, %y", "add %x, %x"))
    eg = bridge.load(m)
    report = saturate_egraph(eg, mine)
    assert report.fired.get("twice", 0) >= 1
    native = eg.native
    eg.close()
    eg2 = bridge.load(m)
    assert eg2.native is native
    matches, _ = _matches(eg2.run("(run-schedule (run rewrite))"))
    assert "twice" not in matches  # the rule went with the module it was added for
    eg2.close()


def test_kept_rule_sets_are_bounded():
    m = eqsat.parse(B)
    for i in range(egraph_pool.KEEP_RULE_SETS + 3):
        rules = parse_rules(f"rule r{i}: mul(?x, ?x) => mul(?x, ?x)")
        eg, _ = saturate(m, rules)
        eg.close()
    assert egraph_pool.kept_rule_sets() <= egraph_pool.KEEP_RULE_SETS


def _reference(modules: list, rules=None) -> list[str]:
    """Each module optimized with an e-graph of its own (the pool emptied before each)."""
    out = []
    for m in modules:
        egraph_pool.clear()
        out.append(str(eqsat.optimize(m, rules=rules)))
    return out


def test_an_egraph_kept_by_one_thread_never_serves_another():
    """egglog's e-graphs belong to the thread that made them (another thread's use raised
    pyo3's PanicException, 'EGraph is unsendable'): one a thread kept stays with it."""
    a = eqsat.parse(A)
    want = _reference([a])
    with ThreadPoolExecutor(1) as pool:
        assert pool.submit(lambda: str(eqsat.optimize(a))).result() == want[0]
    assert str(eqsat.optimize(a)) == want[0]
    with ThreadPoolExecutor(1) as pool:
        assert pool.submit(lambda: str(eqsat.optimize(a))).result() == want[0]


def test_threads_optimizing_at_once_get_what_a_fresh_egraph_gives():
    """Several threads optimizing modules with the built-in rules and with a user's rules,
    interleaved, each get the program an e-graph of its own gives."""
    mine = parse_rules("rule twice: add(?x, ?x) => mul(?x, add(?x, ?x))")
    modules = [eqsat.parse(A), eqsat.parse(B), eqsat.parse(A.replace("add %x, %y", "add %x, %x"))]
    jobs = [(m, r) for m in modules for r in (None, mine)]
    want = {i: _reference([m], r)[0] for i, (m, r) in enumerate(jobs)}

    def work(k: int) -> list[tuple[int, str]]:
        order = [(k + j) % len(jobs) for j in range(len(jobs))]
        return [(i, str(eqsat.optimize(jobs[i][0], rules=jobs[i][1]))) for i in order]

    with ThreadPoolExecutor(4) as pool:
        for results in pool.map(work, range(4)):
            for i, text in results:
                assert text == want[i]


FORK_SCRIPT = """
import os, sys, time
from concurrent.futures import ThreadPoolExecutor
import eqsat
m = eqsat.parse(sys.argv[1])
threads = ThreadPoolExecutor(1)
threads.submit(eqsat.optimize, m).result()  # an e-graph kept by a thread that stays
eqsat.optimize(m)
pid = os.fork()
if pid == 0:
    CHILD
    sys.exit(0)
deadline = time.monotonic() + 30
while time.monotonic() < deadline:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        break
    time.sleep(0.02)
else:
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    status = "hung"
print(status, flush=True)
threads.shutdown()
print(eqsat.optimize(m) is not None)
"""


def _fork(child: str) -> subprocess.CompletedProcess:
    script = FORK_SCRIPT.replace("CHILD", child)
    return subprocess.run([sys.executable, "-c", script, A], capture_output=True, text=True,
                          timeout=120)


def test_a_process_forked_after_optimizing_exits():
    """egglog frees an e-graph on its thread pool, whose threads a forked child does not
    have: the e-graphs the parent kept, freed as the child's interpreter ended, hung it (and
    those of the parent's other threads printed 'EGraph is unsendable, but is being dropped
    on another thread' at the fork). A child never frees them."""
    out = _fork("print('child', flush=True)")
    assert (out.stdout, out.stderr) == ("child\n0\nTrue\n", "")


def test_optimizing_in_a_process_forked_after_optimizing_says_why_it_cannot():
    """A forked child cannot free an e-graph of its own either (egglog's thread pool stayed
    with the parent): its optimize hung where it finished. It raises an eqsat.Error naming
    the cause and the fixes instead; the child goes on, and exits."""
    child = ("try:\n"
             "        eqsat.optimize(m)\n"
             "    except eqsat.Error as e:\n"
             "        print(type(e).__name__, 'spawn' in str(e), flush=True)")
    out = _fork(child)
    assert (out.stdout, out.stderr) == ("ForkedProcessError True\n0\nTrue\n", "")


def test_clear_in_a_child_forked_while_another_thread_clears():
    """The lock of clear() held by another thread at the fork stayed held in the child."""
    script = ("import os, threading\n"
              "from eqsat.rules import egraph_pool\n"
              "egraph_pool._generation_lock.acquire()  # another thread, in clear()\n"
              "pid = os.fork()\n"
              "if pid == 0:\n"
              "    threading.Timer(5, os._exit, (1,)).start()\n"
              "    egraph_pool.clear()\n"
              "    os._exit(0)\n"
              "print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=60)
    assert (out.stdout, out.stderr) == ("0\n", "")
