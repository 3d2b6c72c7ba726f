"""Database probes the acceptance tests wait on: job states, effect rows, backend sessions."""

from __future__ import annotations

from collections import Counter

from django.db import connection

from django_dbqueue import enqueue_many
from tests.utils import wait_until


def rows(sql, params=()):
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def enqueue_jobs(job_type, count, payload=None, *, chunk=1000):
    """Enqueue ``count`` jobs with ``enqueue_many`` (one statement and commit per chunk)."""
    ids = []
    for start in range(0, count, chunk):
        size = min(chunk, count - start)
        ids += [job.id for job in enqueue_many([(job_type, payload or {})] * size)]
    return ids


def states(job_ids):
    """``Counter`` of the states of ``job_ids``."""
    return Counter(
        dict(
            rows(
                "SELECT state, count(*) FROM dbqueue_job WHERE id = ANY(%s) GROUP BY state",
                [list(job_ids)],
            )
        )
    )


def count_in_state(job_ids, state):
    return states(job_ids)[state]


def wait_all_in_state(job_ids, state, *, timeout, interval=0.05):
    job_ids = list(job_ids)
    wait_until(
        lambda: count_in_state(job_ids, state) == len(job_ids),
        timeout=timeout,
        interval=interval,
        message=f"{len(job_ids)} jobs to be {state} (now {dict(states(job_ids))})",
    )


def effects(job_ids=None):
    """``[(job_id, attempt, worker, pid), ...]`` of the effect rows (of ``job_ids``)."""
    if job_ids is None:
        return rows("SELECT job_id, attempt, worker, pid FROM testapp_effect ORDER BY id")
    return rows(
        "SELECT job_id, attempt, worker, pid FROM testapp_effect WHERE job_id = ANY(%s) "
        "ORDER BY id",
        [list(job_ids)],
    )


def effect_count(job_ids):
    return rows("SELECT count(*) FROM testapp_effect WHERE job_id = ANY(%s)", [list(job_ids)])[0][0]


def database_name():
    return connection.settings_dict["NAME"]


def listener_pids():
    """Backend pids of sessions LISTENing in the test database: a worker's own session, which
    LISTENs and claims (named by its application_name), or a listener connection of its own
    (a group's, or beside LISTEN_DATABASE: named "dbqueue listener (LISTEN ...)")."""
    return {
        pid
        for (pid,) in rows(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid() "
            "AND (query LIKE 'LISTEN %%' OR application_name LIKE 'dbqueue %% (LISTEN %%')",
            [database_name()],
        )
    }


def wait_for_listeners(count, *, timeout=20.0):
    """Wait until ``count`` worker listeners are connected; returns their backend pids."""
    return wait_until(
        lambda: (pids := listener_pids()) and len(pids) == count and pids,
        timeout=timeout,
        interval=0.05,
        message=f"{count} LISTEN sessions in the test database",
    )


def terminate_backends():
    """Kill every other session on the test database; returns the pids terminated."""
    return {
        pid
        for pid, ok in rows(
            "SELECT pid, pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()",
            [database_name()],
        )
        if ok
    }
