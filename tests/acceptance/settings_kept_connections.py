"""Fast settings with persistent handler connections and no Django health checks: the worker's
own check between jobs is all that stands between a connection killed while idle and the next
job's attempt."""

from tests.acceptance.settings_fast import *  # noqa: F403
from tests.acceptance.settings_fast import DATABASES

DATABASES["default"]["CONN_MAX_AGE"] = None
DATABASES["default"]["CONN_HEALTH_CHECKS"] = False
