"""Fair queues and serial keys (docs/fairness.md#serial-keys): a key whose due jobs all wait for
their serial turn takes no place in the fair claim's walk, and a job with no fair key, or the
shared key '', is not held up behind a serial key's blocked backlog.

Against a real PostgreSQL, with committed claims standing in for other workers, and a real
(in-process) worker for the idle worker's view. Found by the review of issue 28.
"""

import pytest

from django_dbqueue import enqueue, registry, store
from django_dbqueue.claiming import next_cursors
from django_dbqueue.registry import JobType
from tests.utils import scalar, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

FAIR = {"QUEUES": {"default": {}, "emails": {}, "tenants": {"fair": True}}, "STATUS_INTERVAL": 0}


@pytest.fixture
def fair_settings(settings):
    settings.DBQUEUE = dict(FAIR)
    registry.register(
        JobType(
            name="serial-fair",
            func=lambda ctx: None,
            queue="tenants",
            fair_key=lambda payload: payload.get("tenant"),
        )
    )
    yield settings
    registry.unregister("serial-fair")


class Claimer:
    """One worker's committed claims of the fair queue, its cursor carried along, with as many
    free threads as it asks jobs for (so a serial key's job may be taken)."""

    def __init__(self, worker):
        self.worker = worker
        self.cursors = {}

    def claim(self, limit, queues=("tenants",), fair=(True,)):
        rows = store.claim(
            "default",
            worker_id=self.worker,
            queues=list(queues),
            limits=[limit] * len(queues),
            limit=limit,
            token=store.new_token(),
            threads=limit,
            fair=list(fair),
            cursors=self.cursors,
        )
        next_cursors(self.cursors, rows)
        return rows


def state(job_id):
    return scalar("SELECT state FROM dbqueue_job WHERE id = %s", [job_id])


def test_a_fair_claim_passes_over_keys_whose_jobs_wait_for_their_serial_turn(fair_settings):
    """Tenants a and b each have a job running (a serial key per tenant, the usual pairing of a
    fair key) and one more pending behind it; tenant c has one due job and nothing running.
    A worker with two free threads: a plain claim passes over the blocked serial jobs and takes
    c's; so does the fair claim, whose walk counts only keys with a job that may start."""
    a = [enqueue("serial-fair", {"tenant": "a"}, serial_key="a").id for _ in range(2)]
    b = [enqueue("serial-fair", {"tenant": "b"}, serial_key="b").id for _ in range(2)]
    c = enqueue("serial-fair", {"tenant": "c"}).id
    # Another worker took a's and b's first jobs (committed): they run for a long time.
    taken = Claimer("other").claim(2)
    assert sorted(row.id for row in taken) == [a[0], b[0]]

    me = Claimer("me")
    first = [row.id for row in me.claim(2)]
    assert first == [c], f"the first fair claim of 2 free slots took {first}, not c's job #{c}"
    assert me.cursors == {"tenants": "c"}
    # The blocked keys' next jobs are theirs once the running ones end.
    assert [row.id for row in me.claim(2)] == []
    for job_id in (a[0], b[0]):
        token = scalar("SELECT lease_token FROM dbqueue_job WHERE id = %s", [job_id])
        assert store.complete("default", [(job_id, token, None)]) == {job_id}
    assert sorted(row.id for row in me.claim(2)) == [a[1], b[1]]


def test_the_walk_with_every_key_blocked_claims_nothing_and_keeps_its_cursor(fair_settings):
    """Five tenants, each with a running job and a blocked one: the walk visits every key once
    (one rotation), claims nothing, and leaves the cursor where it was."""
    for tenant in "vwxyz":
        for _ in range(2):
            enqueue("serial-fair", {"tenant": tenant}, serial_key=tenant)
    assert len(Claimer("other").claim(5)) == 5
    me = Claimer("me")
    me.cursors = {"tenants": "x"}
    assert me.claim(2) == []
    assert me.cursors == {"tenants": "x"}
    late = enqueue("serial-fair", {"tenant": "w"}).id  # a job of w with no serial key
    assert [row.id for row in me.claim(2)] == [late]


def sql_enqueue(payload):
    return scalar(
        "SELECT dbqueue_enqueue('serial-fair', %(payload)s::jsonb, queue => 'tenants')",
        {"payload": payload},
    )


def test_a_keyless_job_is_not_stuck_behind_a_serial_keys_blocked_backlog(fair_settings):
    """A fair queue holds a serial key's backlog (its first job running elsewhere, 10 waiting
    their turn) and one job with no fair key at all (from dbqueue_enqueue()). A plain claim
    passes over the blocked jobs and takes it: so does the fair claim, whose look for keyless
    jobs passes over the jobs that wait for their serial turn as a plain claim does."""
    serial = [enqueue("serial-fair", {"tenant": "s"}, serial_key="s").id for _ in range(11)]
    assert [row.id for row in Claimer("other").claim(1)] == [serial[0]]
    keyless = sql_enqueue('{"tenant": "sql"}')
    assert scalar("SELECT fair_key FROM dbqueue_job WHERE id = %s", [keyless]) is None
    claims = [[row.id for row in Claimer("me").claim(5)]]
    assert claims == [[keyless]], f"the fair claim of 5 took {claims}, not #{keyless}"


def test_a_shared_key_job_is_not_stuck_behind_a_serial_keys_blocked_backlog(fair_settings):
    """The same with a job of the shared key '' (enqueue() gives it to a fair queue's job
    without a key), the serial backlog's jobs without a fair key of their own (so also ''):
    the shared key's walk visit reads past the blocked jobs to the one that may start."""
    serial = [enqueue("serial-fair", {}, serial_key="s").id for _ in range(11)]
    assert [row.id for row in Claimer("other").claim(1)] == [serial[0]]
    shared = enqueue("serial-fair", {}).id
    assert scalar("SELECT fair_key FROM dbqueue_job WHERE id = %s", [shared]) == ""
    assert [row.id for row in Claimer("me").claim(5)] == [shared]


@pytest.mark.parametrize("fair", [True, False], ids=["fair", "plain"])
def test_a_real_worker_runs_a_free_tenants_job_while_other_tenants_serial_jobs_run(
    settings, start_worker, fair
):
    """Tenants a..f each have a job running on another worker (claimed and committed; a long
    lease, so the sweeper leaves them) and one more waiting behind it on its serial key; tenant
    g has one due job. An idle worker with one thread serves the queue: g's job runs at once,
    on a fair queue as on a plain one."""
    from tests.integration.conftest import FAST

    settings.DBQUEUE = {**FAST, "QUEUES": {"default": {}, "emails": {}, "tenants": {"fair": fair}}}
    registry.register(
        JobType(
            name="serial-fair-long",
            func=lambda ctx: None,
            queue="tenants",
            lease=300,
            fair_key=lambda payload: payload["tenant"],
        )
    )
    try:
        for tenant in "abcdef":
            for _ in range(2):
                enqueue("serial-fair-long", {"tenant": tenant}, serial_key=tenant)
        other = Claimer("other")
        taken = other.claim(6, fair=(fair,))
        assert len(taken) == 6 and all(row.attempt == 1 for row in taken)
        g = enqueue("serial-fair-long", {"tenant": "g"}).id
        start_worker(queues=["tenants"], concurrency=1)
        wait_until(
            lambda: state(g) == "done",
            timeout=5,
            message=f"tenant g's job #{g} to run on the idle worker",
        )
    finally:
        registry.unregister("serial-fair-long")
