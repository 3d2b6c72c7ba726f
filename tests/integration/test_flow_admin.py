"""Pause and resume from the admin (behind the queue model's change permission), the command
and the status command; the queue page shows slots in use, limits and rate windows."""

import json

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import CommandError, call_command
from django.urls import reverse

from django_dbqueue import enqueue_many, store
from tests.utils import scalar

pytestmark = pytest.mark.django_db(transaction=True)

QUEUES = "admin:django_dbqueue_queuestate_changelist"
LIMITED = {
    "QUEUES": {
        "default": {"global_concurrency": 3, "rate_limit": {"limit": 2, "period": 60}},
        "emails": {},
    }
}


def login(client, *perms):
    user = User.objects.create_user("ops-" + "-".join(perms or ("none",)), is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(
            content_type__app_label="django_dbqueue",
            codename__in=["view_queuestate", *perms],
        )
    )
    client.force_login(user)
    return client


def paused(name):
    return scalar("SELECT paused FROM dbqueue_queue WHERE name = %s", [name])


def post(client, action, names):
    return client.post(reverse(QUEUES), {"action": action, "_selected_action": names}, follow=True)


def test_queue_page_lists_configured_queues_with_slots_limit_and_rate_window(client, settings):
    settings.DBQUEUE = LIMITED
    enqueue_many([("noop", {})] * 3)
    flow = {k: LIMITED["QUEUES"]["default"][k] for k in ("global_concurrency", "rate_limit")}
    params = {
        "q_conc": [flow["global_concurrency"]],
        "q_rate_n": [2],
        "q_rate_period": [60.0],
        "q_rate_key": [None],
        "t_names": [],
        "t_conc": [],
        "t_rate_n": [],
        "t_rate_period": [],
        "t_rate_key": [],
    }
    store.claim(
        "default", worker_id="w", queues=["default"], limits=[5], limit=5, token=1, flow=params
    )
    page = login(client).get(reverse(QUEUES)).content.decode()
    assert "2 / 3" in page  # running / limit
    assert "2 / 60s" in page  # the rate limit
    assert "emails" in page and "0 / ∞" in page
    assert page.count("active") >= 2


def test_pause_and_resume_need_the_change_permission(client):
    viewer = login(client)
    viewer.get(reverse(QUEUES))  # creates the rows
    post(viewer, "pause", ["default"])
    assert paused("default") is False
    operator = login(client, "change_queuestate")
    response = post(operator, "pause", ["default"])
    assert paused("default") is True
    assert "Paused default." in [str(m) for m in response.context["messages"]]
    assert scalar("SELECT changed_by FROM dbqueue_queue WHERE name = 'default'").startswith(
        "admin:ops-"
    )
    post(operator, "resume", ["default"])
    assert paused("default") is False


def test_command_pauses_resumes_lists_and_refuses_unknown_queues(capsys, settings):
    settings.DBQUEUE = LIMITED
    call_command("jobqueue_queue", "pause", "emails", "--by", "ops")
    assert paused("emails") is True
    call_command("jobqueue_queue", "list")
    out = capsys.readouterr().out
    assert "emails  PAUSED  running 0" in out and "by ops" in out
    assert "default  active  running 0/3  rate 2/60s" in out
    call_command("jobqueue_queue", "resume", "emails")
    assert paused("emails") is False
    with pytest.raises(CommandError, match="'nope' is not in DBQUEUE"):
        call_command("jobqueue_queue", "pause", "nope")
    with pytest.raises(CommandError, match="needs a queue name"):
        call_command("jobqueue_queue", "pause")


def test_status_shows_paused_queues_and_limits(capsys, settings):
    settings.DBQUEUE = LIMITED
    call_command("jobqueue_queue", "pause", "emails", "--by", "ops")
    call_command("jobqueue_status")
    out = capsys.readouterr().out
    assert "flow emails  PAUSED" in out and "flow default  active  running 0/3" in out
    call_command("jobqueue_status", "--json")
    report = json.loads(capsys.readouterr().out)
    assert report["flow"]["queues"]["emails"]["paused"] is True
    assert report["flow"]["queues"]["default"]["global_concurrency"] == 3


def test_a_queue_page_never_saves_its_pause_flag_back(admin_client):
    from django_dbqueue import pause_queue
    from django_dbqueue.models import QueueState

    admin_client.get("/admin/django_dbqueue/queuestate/")  # creates a row per configured queue
    pk = QueueState.objects.get(name="default").pk
    page = admin_client.get(f"/admin/django_dbqueue/queuestate/{pk}/change/")
    assert page.status_code == 200  # viewable
    pause_queue("default", by="someone else")
    posted = admin_client.post(f"/admin/django_dbqueue/queuestate/{pk}/change/", {})
    assert posted.status_code == 403  # no Save: it would write back the flag it read
    assert QueueState.objects.get(name="default").paused
