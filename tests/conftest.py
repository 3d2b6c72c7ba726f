"""Shared pytest configuration.

Only generic set-up lives here; database fixtures come from pytest-django (``db``,
``transactional_db``, ``django_db_blocker``, ...). Add suite-specific fixtures in the
conftest.py of tests/unit, tests/integration or tests/acceptance.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

# A 2-core CI machine running PostgreSQL beside the tests makes per-example timing
# meaningless: no deadline. Under CI, also print the blob that reproduces a failure.
settings.register_profile("dev", deadline=None)
settings.register_profile(
    "ci",
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(
    os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev")
)
