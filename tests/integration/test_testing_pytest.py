"""django_dbqueue.testing with pytest-django: the ``dbqueue`` and ``dbqueue_inline`` fixtures of the
package's pytest plugin (the ``pytest11`` entry point), in the test's transaction and in
autocommit; and the plugin does nothing to a project that does not use pytest-django."""

import datetime
import os
import subprocess
import sys
import textwrap

import django
import pytest

from django_dbqueue import enqueue, publish
from django_dbqueue.testing import pytest_plugin
from tests.utils import job_row, scalar

pytestmark = pytest.mark.django_db


def test_the_fixture_in_the_test_transaction(dbqueue):
    job = enqueue("fail-then-succeed", {"succeed_on": 2})
    [found] = dbqueue.assert_enqueued("fail-then-succeed", {"succeed_on": 2})
    assert found.id == job.id
    assert dbqueue.run_jobs().counts == {"retried": 1}
    ran = dbqueue.run_jobs(advance=datetime.timedelta(minutes=10))
    assert [(run.id, run.outcome, run.result) for run in ran] == [(job.id, "done", {"attempt": 2})]
    dbqueue.refute_enqueued("fail-then-succeed")
    assert dbqueue.enqueued_jobs("fail-then-succeed", state="done")[0].attempts == 2
    assert dbqueue.perform_job("echo", {"x": 1}) == {"x": 1}


def test_publish_and_its_subscribers(dbqueue):
    publish("test.invoice.paid", {"invoice": 9})
    dbqueue.assert_enqueued("email-on-paid", {"invoice": 9}, queue="default")
    dbqueue.assert_enqueued(payload={"invoice": 9}, count=3)
    assert dbqueue.run_jobs(types=["email-on-paid"]).counts == {"done": 1}
    dbqueue.assert_enqueued(payload={"invoice": 9}, count=2)


@pytest.mark.django_db(transaction=True)
def test_the_fixture_in_autocommit(dbqueue):
    job = enqueue("echo", {"n": 1})
    assert dbqueue.run_jobs().counts == {"done": 1}
    assert scalar("SELECT state FROM dbqueue_job WHERE id = %s", [job.id]) == "done"


def test_the_inline_fixture(dbqueue_inline, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        job = enqueue("echo", {"n": 1})
    assert job_row(job.id)["state"] == "done"
    assert [run.id for run in dbqueue_inline.mode.runs] == [job.id]


def test_a_test_that_leaves_jobs_running_is_told_which(db):
    # What the fixtures do at teardown (the fixture itself would fail this test).
    helpers = pytest_plugin.DBQueueHelpers()
    pytest_plugin._finish(helpers)  # nothing left: passes
    job = enqueue("echo", {})
    with django.db.connection.cursor() as cursor:
        cursor.execute(
            "UPDATE dbqueue_job SET state = 'running', attempts = 1, lease_token = 1,"
            " worker_id = 'dbqueue-testing:1:abc', leased_until = now() + interval '1 minute',"
            " started_at = now() WHERE id = %s",
            [job.id],
        )
    with pytest.raises(pytest.fail.Exception) as failed:
        pytest_plugin._finish(helpers)
    assert str(failed.value) == (
        "the test left jobs running that django_dbqueue.testing claimed: "
        f"#{job.id} echo in 'default' (running) payload={{}}"
    )


# The plugin is loaded (its module imports the package, which reads no setting at import), and
# none of the helpers is imported until a test asks for a fixture.
PLAIN_PROJECT_TEST = """
import sys

def test_the_plugin_is_loaded_and_imports_no_helper(pytestconfig):
    assert pytestconfig.pluginmanager.get_plugin("django_dbqueue") is not None
    assert "pytest_django" not in sys.modules
    assert "django_dbqueue.testing.runner" not in sys.modules
    assert "django_dbqueue.worker" not in sys.modules
    from django.conf import settings
    assert not settings.configured
"""


@pytest.mark.django_db(False)
def test_a_project_without_pytest_django_is_not_affected(tmp_path):
    (tmp_path / "test_plain.py").write_text(textwrap.dedent(PLAIN_PROJECT_TEST))
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:django",
            "-p",
            "no:cacheprovider",
            "-q",
            "--rootdir",
            str(tmp_path),
            "-c",
            os.devnull,
            str(tmp_path / "test_plain.py"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout
