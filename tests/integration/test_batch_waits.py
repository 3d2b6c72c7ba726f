"""Durable sleeps and waits are refused in a batch handler (docs/batches.md) before anything is
recorded: a wait ends the run, and the call runs the other jobs of the batch too. Recorded
first, the sleep had ended by the retry and the handler went past it (the issue 28 review)."""

import pytest

from django_dbqueue import enqueue_many, registry
from django_dbqueue.registry import JobType
from tests.integration.conftest import FAST
from tests.utils import scalar, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("wait", ["sleep", "signal"])
def test_a_wait_in_a_batch_handler_is_refused_on_every_attempt_and_records_nothing(
    settings, start_worker, wait
):
    settings.DBQUEUE = {**FAST, "QUEUES": {"default": {}, "emails": {}, "bulk": {}}}
    past_the_wait = []

    def handler(batch):
        job = batch.jobs[0]
        if wait == "sleep":
            job.sleep("pause", seconds=0.01)
        else:
            job.wait_for_signal("go", timeout=0.01)
        past_the_wait.append([j.attempt for j in batch.jobs])

    name = f"batch-refuses-{wait}"
    registry.register(JobType(name=name, func=handler, queue="bulk", batch_size=3, max_attempts=2))
    try:
        ids = [j.id for j in enqueue_many([(name, {"n": i}) for i in range(3)])]
        start_worker(queues=["bulk"], concurrency=1)
        wait_until(
            lambda: scalar(
                "SELECT count(*) = 0 FROM dbqueue_job WHERE id = ANY(%s) AND state <> 'dead'",
                [ids],
            ),
            timeout=20,
            message="the batch's jobs to be dead after their two attempts",
        )
    finally:
        registry.unregister(name)
    assert past_the_wait == [], f"the handler went past the wait: {past_the_wait}"
    assert scalar("SELECT count(*) FROM dbqueue_step WHERE job_id = ANY(%s)", [ids]) == 0
    for job_id in ids:
        assert scalar("SELECT attempts FROM dbqueue_job WHERE id = %s", [job_id]) == 2
        last = scalar("SELECT errors -> -1 ->> 'message' FROM dbqueue_job WHERE id = %s", [job_id])
        assert "not available in a batch handler" in last, last
