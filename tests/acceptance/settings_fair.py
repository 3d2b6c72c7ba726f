"""settings_fast with a fair queue, ``tenants`` (docs/fairness.md), for
tests/acceptance/test_fair_queues.py."""

from tests.acceptance.settings_fast import *  # noqa: F403
from tests.acceptance.settings_fast import FAST_DBQUEUE

FAIR_DBQUEUE = {
    **FAST_DBQUEUE,
    "QUEUES": {**FAST_DBQUEUE["QUEUES"], "tenants": {"fair": True}},
}

DBQUEUE = FAIR_DBQUEUE
