"""The claim loop's wake-up flag (notifications.Wakeup) against signals on the loop's own thread.

A worker's SIGTERM handler calls ``stop()``, which sets the flag, on the thread that may be inside
``clear()`` at that moment. A non-reentrant lock there once made the worker hang at SIGTERM.
"""

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import signal, time
    from django_dbqueue.notifications import Wakeup

    w = Wakeup()
    hits = []
    def handler(signum, frame):
        hits.append(1)
        w.set()
    signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, 0.001, 0.001)
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        w.set()
        w.clear()
    signal.setitimer(signal.ITIMER_REAL, 0, 0)
    w.close()
    print("signals", len(hits))
    """
)


def test_set_from_a_signal_handler_during_clear_never_hangs():
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.split()[-1]) > 100  # the handler did interrupt the loop, often
