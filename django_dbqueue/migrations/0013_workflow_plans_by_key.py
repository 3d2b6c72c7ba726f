# The workflow trigger and dbqueue_release_late() (migration 0009) find the jobs they change by
# primary key at every table size. PL/pgSQL plans its statements once per session, and under a
# worker Session's generic plan mode (connections.Session) a plan is kept until the table is
# next analyzed: where those statements matched a literal state, a plan made while the
# statistics saw few jobs in it could read a partial index of all of them
# (dbqueue_job_waiting_idx, or dbqueue_job_finished_idx for 'dead' and 'cancelled') for every
# dependent it changed. Every state test of theirs that could select such an index is now a
# constant variable, a parameter to the planner, so a generic plan cannot match those indexes'
# predicates and goes from the edges (dbqueue_dependency) to the primary key, as
# store.completion.COMPLETE_JOBS does for its own dependents (tests/integration/test_plans.py). The tests
# under a NOT (``NOT (e.run_on_failure AND p.state IN (...))``) and ``<> 'done'`` imply no
# index predicate and stay. Same functions, same results; the reverse puts 0009's text back.

import importlib
import re

from django.db import migrations

_WORKFLOWS = importlib.import_module("django_dbqueue.migrations.0009_workflows")

# Every state test of a WHERE clause in these functions starts with AND; the SET clauses and
# the CASEs (``SET state = 'cancelled'``, ``ELSE 'waiting'``) write a state and stay literal.
_STATE_TEST = re.compile(r"AND ((?:d\.)?state) = '(waiting|cancelled)'")
_FAILED_TEST = "AND p3.state IN ('dead', 'cancelled')"  # the requeue's "still failed" test


def _by_variable(text, expected, declare_after, failed=0):
    found = _STATE_TEST.findall(text)
    assert len(found) == expected, f"0009's state tests moved ({found}): update this"
    assert text.count(_FAILED_TEST) == failed, f"{_FAILED_TEST!r} moved: update this"
    assert text.count(declare_after) == 1, f"{declare_after!r} moved: update this"
    states = {state for _, state in found} | ({"dead", "cancelled"} if failed else set())
    variables = "".join(
        f"    s_{state} CONSTANT text := '{state}';\n"
        for state in ("waiting", "dead", "cancelled")
        if state in states
    )
    text = _STATE_TEST.sub(r"AND \1 = s_\2", text).replace(declare_after, declare_after + variables)
    text = text.replace(_FAILED_TEST, "AND p3.state IN (s_dead, s_cancelled)")
    return text.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)


# The trigger itself (CREATE TRIGGER) is unchanged: only the function it calls is replaced.
_SETTLE_FUNCTION = _WORKFLOWS.SETTLE_DEPENDENTS[
    : _WORKFLOWS.SETTLE_DEPENDENTS.index("CREATE TRIGGER")
]
_RELEASE_LATE = _WORKFLOWS.RELEASE_LATE.replace(
    "STRICT AS $fn$\nBEGIN", "STRICT AS $fn$\nDECLARE\nBEGIN", 1
)

SETTLE_BY_KEY = _by_variable(_SETTLE_FUNCTION, 5, "DECLARE\n    woken text[];\n", failed=1)
RELEASE_LATE_BY_KEY = _by_variable(_RELEASE_LATE, 2, "DECLARE\n")
SETTLE_AS_IN_0009 = _SETTLE_FUNCTION.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)
RELEASE_LATE_AS_IN_0009 = _WORKFLOWS.RELEASE_LATE.replace(
    "CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1
)


class Migration(migrations.Migration):
    dependencies = [
        ("django_dbqueue", "0012_cancel_running"),
    ]

    operations = [
        migrations.RunSQL(
            sql=SETTLE_BY_KEY + RELEASE_LATE_BY_KEY,
            reverse_sql=SETTLE_AS_IN_0009 + RELEASE_LATE_AS_IN_0009,
        ),
    ]
