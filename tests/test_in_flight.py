"""Exit waits for native calls under way and holds back new ones, never a nested one."""

import subprocess
import sys
import threading

from eqsat.rules.in_flight import InFlight

NESTED_AT_EXIT = """
import threading, time
from eqsat.rules.in_flight import native_call
started = threading.Event()

def work() -> None:
    with native_call():
        started.set()
        time.sleep(0.5)  # the interpreter's exit is draining by now
        with native_call():
            pass

threading.Thread(target=work, daemon=True).start()
started.wait()
"""


def test_a_call_nested_in_one_under_way_is_not_held_back_at_exit():
    """The drain waited for the outer call while holding back the inner one: a hang."""
    done = subprocess.run([sys.executable, "-c", NESTED_AT_EXIT], timeout=30,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def test_after_drain_only_nested_calls_start():
    calls = InFlight()
    inside, nested_ran, other_started = threading.Event(), threading.Event(), threading.Event()
    release = threading.Event()

    def outer() -> None:
        with calls.call():
            inside.set()
            release.wait()
            with calls.call():
                nested_ran.set()

    def other() -> None:
        with calls.call():
            other_started.set()

    t = threading.Thread(target=outer)
    t.start()
    inside.wait()
    drained = threading.Thread(target=calls.drain)
    drained.start()
    late = threading.Thread(target=other, daemon=True)
    late.start()
    release.set()
    t.join(10)
    drained.join(10)
    assert nested_ran.is_set() and not drained.is_alive()
    assert not other_started.wait(0.2)
