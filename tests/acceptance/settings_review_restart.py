"""Worker settings of tests/acceptance/test_review_held_workers.py's restart test: those of
settings_fast, and a gate at import. The image a restart in place starts (``DBQUEUE_RESTARTED``
in its environment: restart.py) waits here, before Django sets up, until the file named by
``DBQUEUE_REVIEW_RESTART_GATE`` exists (at most 60 s): the test holds the window between the old
image's exit from the worker registry and the new image's first pass open at its exact point.
A first image passes straight through."""

import os
import time

from tests.acceptance.settings_fast import *  # noqa: F403

_gate = os.environ.get("DBQUEUE_REVIEW_RESTART_GATE")
if _gate and os.environ.get("DBQUEUE_RESTARTED"):
    _deadline = time.monotonic() + 60
    while not os.path.exists(_gate) and time.monotonic() < _deadline:
        time.sleep(0.02)
