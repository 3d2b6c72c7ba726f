"""The rest of the public API on a database that was never migrated (issue 35): ``replay_event``,
``signal_job``, ``schedule_job``, ``update_schedule``, ``unschedule_job``, ``wait_for_result``
and ``await_result`` say to run migrate (``NotMigrated``), as ``enqueue()`` does
(tests/integration/test_bad_input.py), instead of a raw ``ProgrammingError`` or psycopg's
``UndefinedTable``. Inside ``transaction.atomic()`` the message says whether the caller's
transaction was aborted: it is where the failed statement ran in it, and is not where the
function ran its statements in a savepoint of its own."""

import pytest
from asgiref.sync import async_to_sync
from django.db import DatabaseError, ProgrammingError, connections, transaction

from django_dbqueue import (
    NotMigrated,
    await_result,
    replay_event,
    schedule_job,
    signal_job,
    unschedule_job,
    update_schedule,
    wait_for_result,
)
from tests.integration.test_bad_input import MIGRATE, bare, shop_rows  # noqa: F401 - a fixture

pytestmark = pytest.mark.django_db(transaction=True)

ENTRY_POINTS = {
    "replay_event": lambda using: replay_event(1, using=using),
    "signal_job": lambda using: signal_job(1, "approve", {"ok": True}, using=using),
    "schedule_job": lambda using: schedule_job("nightly", "noop", every=60, using=using),
    "update_schedule": lambda using: update_schedule("nightly", payload={}, using=using),
    "unschedule_job": lambda using: unschedule_job("nightly", using=using),
    "unschedule_job(name, using)": lambda using: unschedule_job("nightly", using),
    "wait_for_result": lambda using: wait_for_result(1, timeout=5, using=using),
    # As async Django code calls it (an ASGI view): its ORM calls come back to this thread.
    "await_result": lambda using: async_to_sync(await_result)(1, timeout=5, using=using),
}


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_each_on_a_database_never_migrated_says_run_migrate(bare, entry):  # noqa: F811
    with pytest.raises(NotMigrated) as caught:
        ENTRY_POINTS[entry](bare)
    message = str(caught.value)
    assert message.startswith("database 'bare' has no dbqueue_job, dbqueue_dependency, "), message
    assert MIGRATE in message and "Nothing was written." in message
    assert "aborted" not in message
    assert isinstance(caught.value, ProgrammingError)
    assert shop_rows(bare) == 0  # the connection is usable at once


# Where the failed statement ran in the caller's transaction, and where in a savepoint of the
# function's own (rolled back, so the caller's transaction goes on).
ABORTS_THE_CALLERS = {
    "replay_event": True,
    "update_schedule": True,
    "unschedule_job": True,
    "signal_job": False,
    "schedule_job": False,
    "wait_for_result": False,  # a connection of its own
}


@pytest.mark.parametrize("entry", sorted(ABORTS_THE_CALLERS))
def test_inside_atomic_it_says_whether_the_callers_transaction_is_aborted(bare, entry):  # noqa: F811
    aborts = ABORTS_THE_CALLERS[entry]
    with transaction.atomic(using=bare):
        with connections[bare].cursor() as cursor:
            cursor.execute("INSERT INTO shop DEFAULT VALUES")
        with pytest.raises(NotMigrated) as caught:
            ENTRY_POINTS[entry](bare)
        message = str(caught.value)
        assert "has no dbqueue_job" in message and MIGRATE in message
        assert ("aborted the transaction open on this connection" in message) is aborts, message
        if aborts:
            with pytest.raises(DatabaseError, match="current transaction is aborted"):
                shop_rows(bare)
            transaction.set_rollback(True, using=bare)
        else:
            assert shop_rows(bare) == 1  # the caller's transaction goes on
    assert shop_rows(bare) == (0 if aborts else 1)
