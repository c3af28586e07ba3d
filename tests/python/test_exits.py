"""However a script leaves a Loader loop, the process exits with the script's own status, promptly, with no
fatal error: break, an exception, KeyboardInterrupt (raised or a real SIGINT), sys.exit inside the loop, a
live iterator left at the end of the script, an exception in a callable. Each case runs as a child
process, for 1, 2 and 4 workers, with a Python callable and with a builtin function."""
import os
import signal
import subprocess
import sys
import time

import pytest

# The child prints the monotonic time just before it leaves the loop; the parent takes the time the
# process ended. CLOCK_MONOTONIC is one clock for every process of the machine.
CHILD = r"""
import os, signal, sys, time
import dpipe

def slow(x):
    time.sleep(0.0005)   # a callable that takes a while (and releases the GIL meanwhile)
    return x

def bad(x):
    if x == 500:
        raise ValueError("bad element")
    return x

CASE, WORKERS, FN = sys.argv[1], int(sys.argv[2]), sys.argv[3]
step = {"python": dpipe.map(slow), "builtin": dpipe.map("affine", mul=2)}[FN]
if CASE == "callable_raises":
    step = dpipe.map(bad)
p = dpipe.range(0, 1_000_000) | dpipe.sharding_filter() | step | dpipe.batch(size=4)
loader = dpipe.Loader(p, seed=1, workers=WORKERS)

def leaving():
    print("leaving", time.monotonic(), flush=True)

if CASE == "live_iterator":   # an iterator the script never finishes, alive at the end of the script
    it = iter(loader)
    for _ in range(20):
        next(it)
    leaving()
elif CASE == "callable_raises":
    try:
        for b in loader:
            pass
    finally:
        leaving()
else:
    for n, b in enumerate(loader):
        if n == 20:
            leaving()
            if CASE == "break":
                break
            if CASE == "raise":
                raise RuntimeError("the script's own error")
            if CASE == "keyboard_interrupt":
                raise KeyboardInterrupt
            if CASE == "sigint":
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(5)   # the handler raises KeyboardInterrupt here, at once
            if CASE == "sys_exit":
                sys.exit(3)
print("after the loop", flush=True)
"""

# What each case's process must end with: its exit status (Python dies of SIGINT after an uncaught
# KeyboardInterrupt) and a line its output or error output must hold.
EXPECTED = {
    "break": (0, "after the loop"),
    "raise": (1, "RuntimeError: the script's own error"),
    "keyboard_interrupt": (-signal.SIGINT, "KeyboardInterrupt"),
    "sigint": (-signal.SIGINT, "KeyboardInterrupt"),
    "sys_exit": (3, "leaving"),
    "live_iterator": (0, "after the loop"),
    "callable_raises": (1, "ValueError: bad element"),
}
# From leaving the loop to the process's end (the interpreter's own shutdown included). The goal is 1 s;
# this bound leaves room for a CI machine running other suites beside this one.
EXIT_WITHIN = 3.0


@pytest.mark.parametrize("workers", [1, 2, 4])
@pytest.mark.parametrize("fn", ["python", "builtin"])
@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_a_script_leaving_the_loop_exits_with_its_own_status_promptly(case, workers, fn):
    if case == "callable_raises" and fn == "builtin":
        pytest.skip("the case is a Python callable's exception")
    env = dict(os.environ, PYTHONFAULTHANDLER="1")
    child = subprocess.run([sys.executable, "-c", CHILD, case, str(workers), fn], capture_output=True, text=True,
                           timeout=60, env=env)
    ended = time.monotonic()
    status, line = EXPECTED[case]
    output = child.stdout + child.stderr
    assert child.returncode == status, output
    assert line in output, output
    for fatal in ("FATAL", "Fatal Python error", "terminate called", "Aborted", "Segmentation"):
        assert fatal not in output, output
    left = [float(l.split()[1]) for l in child.stdout.splitlines() if l.startswith("leaving ")]
    assert len(left) == 1, output
    assert ended - left[0] < EXIT_WITHIN, f"the process took {ended - left[0]:.2f} s to exit"
