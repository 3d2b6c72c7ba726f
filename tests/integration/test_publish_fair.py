"""A subscriber on a fair queue (docs/events.md, docs/fairness.md): publish() and
replay_event() give its job the fair key enqueue() would, so the job takes its turn in the
rotation instead of waiting behind another tenant's backlog (the issue 28 review)."""

import pytest

from django_dbqueue import enqueue, publish, registry, replay_event, store
from django_dbqueue.claiming import next_cursors
from django_dbqueue.conf import SHARED_FAIR_KEY
from django_dbqueue.registry import JobType
from tests.utils import scalar

pytestmark = pytest.mark.django_db(transaction=True)

EVENT = "tenant.changed"


@pytest.fixture
def fair_types(settings):
    settings.DBQUEUE = {
        "QUEUES": {"default": {}, "emails": {}, "tenants": {"fair": True}},
        "STATUS_INTERVAL": 0,
    }
    types = [
        JobType(name="pubfair-work", func=lambda ctx: None, queue="tenants",
                fair_key=lambda payload: payload.get("tenant")),
        JobType(name="pubfair-sub", func=lambda ctx: None, queue="tenants",
                fair_key=lambda payload: payload.get("tenant"), subscribes=(EVENT,)),
    ]  # fmt: skip
    for job_type in types:
        registry.register(job_type)
    yield
    for job_type in types:
        registry.unregister(job_type.name)


def fair_claim(limit, cursors):
    rows = store.claim(
        "default",
        worker_id="me",
        queues=["tenants"],
        limits=[limit],
        limit=limit,
        token=store.new_token(),
        threads=limit,
        fair=[True],
        cursors=cursors,
    )
    next_cursors(cursors, rows)
    return [row.id for row in rows]


def test_a_published_job_of_a_fair_subscriber_takes_its_turn_past_a_backlog(fair_types):
    for _ in range(30):
        enqueue("pubfair-work", {"tenant": "big"})
    [job] = publish(EVENT, {"tenant": "small"}).jobs
    assert scalar("SELECT fair_key FROM dbqueue_job WHERE id = %s", [job.id]) == "small"
    first = fair_claim(5, {})  # two keys: the backlog's and the event's
    assert job.id in first, first


def test_a_subscriber_without_a_key_takes_the_shared_key_and_a_replay_its_key(fair_types):
    [keyless] = publish(EVENT, {}).jobs
    assert scalar("SELECT fair_key FROM dbqueue_job WHERE id = %s", [keyless.id]) == (
        SHARED_FAIR_KEY
    )
    registry.unregister("pubfair-sub")  # published to nobody; replayed to the subscriber later
    event = publish(EVENT, {"tenant": "late"})
    assert event.jobs == ()
    registry.register(
        JobType(name="pubfair-sub", func=lambda ctx: None, queue="tenants",
                fair_key=lambda payload: payload.get("tenant"), subscribes=(EVENT,))
    )  # fmt: skip
    [replayed] = replay_event(event.id)
    assert scalar("SELECT fair_key FROM dbqueue_job WHERE id = %s", [replayed.id]) == "late"
