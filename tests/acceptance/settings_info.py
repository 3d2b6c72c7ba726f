"""Test settings whose workers log django_dbqueue at INFO: the line a worker logs when it stops
counts its claims ("N claims (M empty)"), which the wake-up tests read."""

from tests.settings import *  # noqa: F403
from tests.settings import LOGGING as _BASE_LOGGING

LOGGING = {
    **_BASE_LOGGING,
    "loggers": {"django_dbqueue": {"handlers": ["console"], "level": "INFO"}},
}
