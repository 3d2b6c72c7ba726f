"""Enqueue from plain SQL (docs/sql.md) with a real ``run_jobqueue`` process: a job put in the
queue by ``dbqueue_enqueue()`` on a raw psycopg connection, as a service in another language
holds one, or by a database trigger, is run by the worker, woken at the commit (its poll made
too slow to matter); a rolled-back enqueue leaves nothing for it to run."""

import psycopg
import pytest
from django.db import connection

from tests.acceptance.helpers import effects, rows, wait_for_listeners
from tests.acceptance.test_wakeup import listen_started, seconds_until_done, wait_idle
from tests.utils import job_row

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]


def raw_connection():
    settings = connection.settings_dict
    return psycopg.connect(
        dbname=settings["NAME"],
        user=settings["USER"] or None,
        password=settings["PASSWORD"] or None,
        host=settings["HOST"] or None,
        port=settings["PORT"] or None,
    )


@pytest.fixture
def idle_worker(start_worker):
    """One worker whose poll is 30 s: a job done within 2 s was woken by a notification."""
    start_worker("--poll-interval", "30")
    [listener] = wait_for_listeners(1)
    wait_idle(listen_started(listener))


def test_a_job_enqueued_from_a_raw_connection_runs_woken_at_the_commit(idle_worker):
    with raw_connection() as raw:  # a transaction, as psycopg opens one by default
        (job_id,) = raw.execute(
            "SELECT dbqueue.dbqueue_enqueue('record', %s::jsonb, priority => 5)",
            ['{"from": "sql"}'],
        ).fetchone()
        # Uncommitted, the job is invisible to the worker and to this test's own session.
        assert rows("SELECT count(*) FROM dbqueue_job WHERE id = %s", [job_id]) == [(0,)]
        raw.commit()
        assert seconds_until_done(job_id, timeout=2.0) < 2.0  # a poll would take 30 s
    assert [e[0] for e in effects([job_id])] == [job_id]
    assert job_row(job_id)["payload"] == {"from": "sql"}


def test_a_rolled_back_enqueue_leaves_nothing_and_the_next_one_runs(idle_worker):
    with raw_connection() as raw:
        (lost,) = raw.execute("SELECT dbqueue.dbqueue_enqueue('record', '{}')").fetchone()
        raw.rollback()
        (kept,) = raw.execute("SELECT dbqueue.dbqueue_enqueue('record', '{}')").fetchone()
        raw.commit()
    assert seconds_until_done(kept, timeout=2.0) < 2.0
    assert rows("SELECT count(*) FROM dbqueue_job WHERE id = %s", [lost]) == [(0,)]
    assert [e[0] for e in effects()] == [kept]  # the worker never ran the rolled-back one


def test_a_trigger_enqueues_a_job_the_worker_runs_when_a_row_is_inserted(idle_worker):
    with raw_connection() as raw:
        raw.execute("CREATE TABLE sql_enqueue_signup (id bigserial PRIMARY KEY, email text)")
        raw.execute(
            """
            CREATE FUNCTION sql_enqueue_signup_job() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                PERFORM dbqueue.dbqueue_enqueue('record', jsonb_build_object('signup', NEW.id));
                RETURN NEW;
            END $$
            """
        )
        raw.execute(
            "CREATE TRIGGER sql_enqueue_signup_job AFTER INSERT ON sql_enqueue_signup "
            "FOR EACH ROW EXECUTE FUNCTION sql_enqueue_signup_job()"
        )
        raw.commit()
        try:
            (signup,) = raw.execute(
                "INSERT INTO sql_enqueue_signup (email) VALUES ('a@example.com') RETURNING id"
            ).fetchone()
            raw.commit()
            [(job_id,)] = rows(
                "SELECT id FROM dbqueue_job WHERE payload = jsonb_build_object('signup', %s::int)",
                [signup],
            )
            assert seconds_until_done(job_id, timeout=2.0) < 2.0
            assert [e[0] for e in effects([job_id])] == [job_id]
        finally:
            raw.rollback()
            raw.execute("DROP TABLE sql_enqueue_signup")
            raw.execute("DROP FUNCTION sql_enqueue_signup_job()")
            raw.commit()
