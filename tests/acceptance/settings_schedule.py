"""settings_fast plus a one-second schedule, for the leaderless-scheduler acceptance test."""

from tests.acceptance.settings_fast import *  # noqa: F403
from tests.acceptance.settings_fast import FAST_DBQUEUE

DBQUEUE = {
    **FAST_DBQUEUE,
    "SCHEDULE_INTERVAL": 0.25,
    "SCHEDULE": {
        "every-second": {"every": 1, "type": "noop"},
        "hourly": {"every": 3600, "type": "noop", "catch_up": 2, "misfire_grace": 30},
        "hourly-all": {
            "every": 3600,
            "type": "noop",
            "catch_up": "all",
            "catch_up_window": 5 * 3600,
            "misfire_grace": 30,
        },
    },
}
