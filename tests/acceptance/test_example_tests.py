"""The example shop's own tests (example_project/shop/tests.py, written with
django_dbqueue.testing) pass under Django's test runner, in a test database of their own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import environ
import pytest

pytestmark = [pytest.mark.acceptance]

EXAMPLE = Path(__file__).resolve().parents[2] / "example_project"
SERVER_URL = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
# Django's runner makes "test_" + this name, and drops it when done.
NAME = f"{os.environ.get('DBQUEUE_TEST_DATABASE', 'test_dbqueue')}_example"


def test_the_example_shops_tests_pass():
    config = environ.Env.db_url_config(SERVER_URL)
    url = SERVER_URL.rsplit("/", 1)[0] + f"/{NAME}"
    assert environ.Env.db_url_config(url)["HOST"] == config["HOST"]
    env = {**os.environ, "DATABASE_URL": url, "LOG_LEVEL": "ERROR"}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    result = subprocess.run(
        [sys.executable, "manage.py", "test", "shop", "--noinput", "-v", "2"],
        cwd=EXAMPLE,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "Ran 7 tests" in output and "OK" in output, output
