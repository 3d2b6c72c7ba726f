"""The admin through Django's test client: every action with and without its permission, on
eligible and ineligible rows; escaping of payloads and errors; the dead-letter and delivery views;
a job's recorded steps, bounded."""

import html
import json
import re

import pytest
from django.contrib import admin
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.urls import reverse
from django.utils import timezone

from django_dbqueue import enqueue, store
from django_dbqueue.deliveries import begin_delivery
from django_dbqueue.models import JobStep
from tests.utils import job_row, scalar, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

CHANGELIST = "admin:django_dbqueue_backgroundjob_changelist"
# What one "Delete finished jobs" costs, whatever the selection (see the test of that name).
# The page: the session, the user, the status table, the user's and groups' permissions, the
# list's count, the database's time, the grouped count. The delete: the same first six, the
# selection's count, one batch of ids, its DELETE.
PAGE_QUERIES, DELETE_QUERIES = 8, 9


def make_user(*perms):
    user = User.objects.create_user(
        "ops-" + "-".join(perms or ("none",)), password="pw", is_staff=True
    )
    codenames = ["view_backgroundjob", "view_deadletter", "view_jobdelivery", *perms]
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="django_dbqueue", codename__in=codenames)
    )
    return user


@pytest.fixture
def as_user(client):
    def login(*perms):
        client.force_login(make_user(*perms))
        return client

    return login


def set_state(job_id, state):
    with connection.cursor() as cursor:
        if state == "dead":
            cursor.execute(
                "UPDATE dbqueue_job SET state = 'dead', finished_at = now(), attempts = 1 WHERE id = %s",
                [job_id],
            )
        elif state == "running":
            cursor.execute(
                "UPDATE dbqueue_job SET state = 'running', leased_until = now() - interval '1 minute', attempts = 1 WHERE id = %s",
                [job_id],
            )


def post_action(client, action, ids, url=CHANGELIST):
    return client.post(
        reverse(url), {"action": action, "_selected_action": [str(i) for i in ids]}, follow=True
    )


def texts(response):
    return [str(m) for m in response.context["messages"]]


def test_requeue_needs_its_permission(as_user):
    job = enqueue("noop")
    set_state(job.id, "dead")
    client = as_user()  # view only
    response = client.get(reverse(CHANGELIST))
    assert response.status_code == 200
    assert "requeue" not in [
        a[0] for a in response.context["cl"].model_admin.get_action_choices(response.wsgi_request)
    ]
    post_action(client, "requeue", [job.id])
    assert job_row(job.id)["state"] == "dead"


def test_requeue_moves_dead_keeps_errors_and_refuses_others(as_user):
    dead = enqueue("noop")
    pending = enqueue("noop")
    set_state(dead.id, "dead")
    with connection.cursor() as cursor:
        cursor.execute(
            """UPDATE dbqueue_job SET errors = '[{"attempt": 1, "class": "E", "message": "m"}]' WHERE id = %s""",
            [dead.id],
        )
    response = post_action(as_user("requeue_backgroundjob"), "requeue", [dead.id, pending.id])
    assert texts(response) == [
        "Requeued 1 job(s).",
        "1 selected job(s) were left alone: only dead or cancelled jobs can be requeued.",
    ]
    row = job_row(dead.id)
    assert (row["state"], row["attempts"], row["finished_at"]) == ("pending", 0, None)
    # The history is kept, and a marker says where it starts again at attempt 1.
    first, marker = row["errors"]
    assert first == {"attempt": 1, "class": "E", "message": "m"}
    assert marker.pop("at")
    assert marker == {
        "attempt": 1,
        "class": "Requeued",
        "message": "requeued from dead after 1 attempt(s); attempts start again at 1",
        "traceback": "",
        "worker": None,
        "requeued": True,
    }


def test_run_now_and_cancel(as_user):
    later = enqueue("noop", delay=3600)
    due = enqueue("noop")
    client = as_user("run_now_backgroundjob", "cancel_backgroundjob")
    response = post_action(client, "run_now", [later.id, due.id])
    assert texts(response)[0] == "Made due now 1 job(s)."
    assert scalar("SELECT run_after <= now() FROM dbqueue_job WHERE id = %s", [later.id])
    set_state(due.id, "running")
    dead = enqueue("noop")
    set_state(dead.id, "dead")
    response = post_action(client, "cancel", [later.id, due.id, dead.id])
    assert texts(response) == [
        "Cancelled 1 job(s).",
        "Cancelling 1 running job(s): each ends cancelled when its handler stops (at once for a "
        "handler that checks ctx.cancelled).",
        "1 selected job(s) were left alone: they had finished already (done, dead or cancelled).",
    ]
    # The running job is marked, in the user's name, and runs on until its worker ends it.
    later_row, due_row = job_row(later.id), job_row(due.id)
    assert (later_row["state"], later_row["cancelled_by"]) == (
        "cancelled",
        "admin:ops-run_now_backgroundjob-cancel_backgroundjob",
    )
    assert (due_row["state"], due_row["cancelled_by"]) == (
        "running",
        "admin:ops-run_now_backgroundjob-cancel_backgroundjob",
    )
    assert due_row["cancel_requested_at"] is not None
    assert job_row(dead.id)["state"] == "dead"


def test_run_now_and_cancel_without_permission_do_nothing(as_user):
    later = enqueue("noop", delay=3600)
    client = as_user("requeue_backgroundjob")
    for action in ("run_now", "cancel"):
        post_action(client, action, [later.id])
    row = job_row(later.id)
    assert row["state"] == "pending" and row["run_after"] > row["created_at"]


def test_filters_search_and_stuck(as_user):
    stuck = enqueue("noop", idempotency_key="invoice-email:77")
    set_state(stuck.id, "running")
    other = enqueue("email")
    client = as_user()
    ids = lambda r: [o.id for o in r.context["cl"].result_list]  # noqa: E731
    assert ids(client.get(reverse(CHANGELIST), {"stuck": "yes"})) == [stuck.id]
    assert ids(client.get(reverse(CHANGELIST), {"queue": "emails"})) == [other.id]
    assert ids(client.get(reverse(CHANGELIST), {"type": "email"})) == [other.id]
    assert ids(client.get(reverse(CHANGELIST), {"state__exact": "running"})) == [stuck.id]
    assert ids(client.get(reverse(CHANGELIST), {"q": "invoice-email:77"})) == [stuck.id]
    assert ids(client.get(reverse(CHANGELIST), {"q": str(other.id)})) == [other.id]
    page = client.get(reverse(CHANGELIST)).content.decode()
    assert 'id="dbqueue-status"' in page


def test_detail_escapes_payload_and_errors(as_user):
    job = enqueue("noop", {"html": "<script>alert(1)</script>"})
    with connection.cursor() as cursor:
        cursor.execute(
            """UPDATE dbqueue_job SET errors = jsonb_build_array(jsonb_build_object(
                 'attempt', 1, 'class', '<b>Err</b>', 'message', '<img src=x onerror=alert(2)>',
                 'traceback', 'Traceback <tb>', 'at', now(), 'worker', 'w')) WHERE id = %s""",
            [job.id],
        )
    page = (
        as_user()
        .get(reverse("admin:django_dbqueue_backgroundjob_change", args=[job.id]))
        .content.decode()
    )
    assert (
        "<script>alert(1)</script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    )
    assert "<img src=x" not in page and "&lt;img src=x onerror=alert(2)&gt;" in page
    assert "&lt;b&gt;Err&lt;/b&gt;" in page and "Traceback &lt;tb&gt;" in page


def test_dead_letter_view_lists_only_dead_and_requeues(as_user):
    dead = enqueue("noop")
    set_state(dead.id, "dead")
    enqueue("noop")
    client = as_user("requeue_backgroundjob")
    url = "admin:django_dbqueue_deadletter_changelist"
    response = client.get(reverse(url))
    assert [o.id for o in response.context["cl"].result_list] == [dead.id]
    post_action(client, "requeue", [dead.id], url=url)
    assert job_row(dead.id)["state"] == "pending"


def test_delivery_admin_settles_unconfirmed_only_with_permission(as_user):
    unknown = begin_delivery("sms:unknown")
    sent = begin_delivery("sms:sent")
    sent.sent("ref-1")
    url = "admin:django_dbqueue_jobdelivery_changelist"
    client = as_user()
    unconfirmed = client.get(reverse(url), {"unconfirmed": "yes"})
    assert [d.key for d in unconfirmed.context["cl"].result_list] == ["sms:unknown"]
    ids = [d.id for d in unconfirmed.context["cl"].result_list]
    post_action(client, "mark_failed", ids, url=url)  # no permission: nothing happens
    assert begin_delivery("sms:unknown").state == "recorded"
    client = as_user("settle_jobdelivery")
    from django_dbqueue.models import JobDelivery

    all_ids = list(JobDelivery.objects.values_list("id", flat=True))
    response = post_action(client, "mark_failed", all_ids, url=url)
    assert texts(response)[0] == "Marked 1 delivery record(s) failed."
    assert "left alone" in texts(response)[1]
    assert JobDelivery.objects.get(key="sms:unknown").state == "failed"
    assert JobDelivery.objects.get(key="sms:sent").state == "sent"
    assert unknown.key == "sms:unknown"


def test_changelist_query_count_does_not_grow_with_rows(as_user, django_assert_max_num_queries):
    client = as_user()
    with connection.cursor() as cursor:
        cursor.execute(
            """INSERT INTO dbqueue_job (type, queue, payload, state, priority, run_after, attempts,
               max_attempts, lease_seconds, errors, created_at, finished_at)
               SELECT 'noop', 'default', '{}', 'done', 0, now(), 1, 10, 60, '[]', now(), now()
               FROM generate_series(1, 20000)"""
        )
    with django_assert_max_num_queries(12):
        response = client.get(reverse(CHANGELIST))
    assert response.context["cl"].result_count == 10001  # capped, not a full count
    assert store.status("default") == {}


def test_status_summary_reads_partial_indexes_not_the_whole_table():
    """The summary on every changelist page must not scan finished history."""
    import json as jsonlib

    from django_dbqueue.store import operations

    with connection.cursor() as cursor:
        cursor.execute(
            """INSERT INTO dbqueue_job (type, queue, payload, state, priority, run_after, attempts,
               max_attempts, lease_seconds, errors, created_at, finished_at)
               SELECT 'noop', 'default', '{}', 'done', 0, now(), 1, 10, 60, '[]', now(), now()
               FROM generate_series(1, 100000)"""
        )
        cursor.execute("ANALYZE dbqueue_job")
        cursor.execute("EXPLAIN (FORMAT JSON) " + operations.STATUS_COUNTS)
        plan = cursor.fetchone()[0]
    plan = jsonlib.loads(plan) if isinstance(plan, str) else plan

    def nodes(node):
        yield node
        for child in node.get("Plans", []):
            yield from nodes(child)

    scans = [
        n["Node Type"] for n in nodes(plan[0]["Plan"]) if n.get("Relation Name") == "dbqueue_job"
    ]
    assert scans and "Seq Scan" not in scans, scans


def test_changelists_offer_no_facet_counts(as_user):
    client = as_user()
    response = client.get(reverse(CHANGELIST), {"_facets": "True"})
    assert response.status_code == 200
    assert not response.context["cl"].add_facets


def finish(job_id, state):
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE dbqueue_job SET state = %s, finished_at = now(), attempts = 1 WHERE id = %s",
            [state, job_id],
        )


def offered_actions(client, url=CHANGELIST):
    response = client.get(reverse(url))
    request = response.wsgi_request
    choices = response.context["cl"].model_admin.get_action_choices(request)
    return [name for name, _ in choices if name]


def test_delete_selected_is_replaced_by_delete_finished(as_user, admin_client):
    assert "delete_selected" not in offered_actions(admin_client)
    assert "delete_finished" in offered_actions(admin_client)
    dead_letters = "admin:django_dbqueue_deadletter_changelist"
    assert offered_actions(admin_client, dead_letters) == ["requeue", "delete_finished"]
    assert "delete_finished" not in offered_actions(as_user("requeue_backgroundjob"))
    # Delivery records are not deleted in the admin at all.
    deliveries = "admin:django_dbqueue_jobdelivery_changelist"
    assert "delete_selected" not in offered_actions(admin_client, deliveries)


def test_delete_finished_confirms_then_deletes_only_finished_jobs(as_user):
    jobs = {state: enqueue("noop").id for state in ("done", "dead", "cancelled")}
    for state, job_id in jobs.items():
        finish(job_id, state)
    pending = enqueue("noop").id
    running = enqueue("noop").id
    set_state(running, "running")
    delivery = begin_delivery("sms:done-job")
    with connection.cursor() as cursor:
        cursor.execute("UPDATE dbqueue_delivery SET job_id = %s", [jobs["done"]])
    client = as_user("delete_backgroundjob")
    selected = [*jobs.values(), pending, running]

    confirm = post_action(client, "delete_finished", selected)
    assert confirm.templates[0].name == DELETE_CONFIRMATION
    assert confirm.context["by_state"] == [("done", 1), ("dead", 1), ("cancelled", 1)]
    assert (confirm.context["deletable"], confirm.context["refused"]) == (3, 2)
    assert texts(confirm) == [
        "2 selected job(s) were left alone: only finished jobs (done, dead or cancelled) can be "
        "deleted; cancel a pending job first, and let a running one finish."
    ]
    assert all(job_row(i) for i in selected), "the confirmation page deletes nothing"

    response = submit(client, confirm)  # the page's own form, as a browser sends it
    assert texts(response) == [
        "Successfully deleted 3 background jobs.",
        "2 selected job(s) were left alone: only finished jobs can be deleted, and only those "
        "finished when the confirmation page was shown (a job requeued since, or pending or "
        "running, stays).",
    ]
    assert [job_row(i) for i in jobs.values()] == [None, None, None]
    assert job_row(pending)["state"] == "pending" and job_row(running)["state"] == "running"
    # The delivery record keeps the deleted job's id, as it does when retention prunes the job.
    assert (
        scalar("SELECT job_id FROM dbqueue_delivery WHERE key = %s", [delivery.key])
        == (jobs["done"])
    )


def test_delete_finished_leaves_a_job_requeued_after_the_confirmation(as_user):
    dead = enqueue("noop").id
    finish(dead, "dead")
    client = as_user("delete_backgroundjob")
    confirm = post_action(client, "delete_finished", [dead])  # the confirmation page
    store.requeue("default", [dead])
    response = submit(client, confirm)
    assert "1 selected job(s) were left alone" in texts(response)[0]
    assert job_row(dead)["state"] == "pending"


DELETE_CONFIRMATION = "admin/django_dbqueue/delete_finished_confirmation.html"


def confirmation_form(response):
    """The fields of the confirmation page's form, as a browser posts them."""
    fields = {}
    content = response.content.decode()
    for name, value in re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', content):
        if name != "csrfmiddlewaretoken":
            fields.setdefault(html.unescape(name), []).append(html.unescape(value))
    return fields


def submit(client, confirmation, *, follow=True):
    """Post the confirmation page's form back to the page it came from (the list's URL with
    its filters: a form without an action posts to its page's URL)."""
    url = confirmation.wsgi_request.get_full_path()
    return client.post(url, confirmation_form(confirmation), follow=follow)


def select_all(client, url, page_ids):
    """The list's form with "Select all N" clicked: the page's boxes and select_across."""
    return client.post(
        url,
        {
            "action": "delete_finished",
            "index": "0",
            "select_across": "1",
            "_selected_action": [str(i) for i in page_ids],
        },
        follow=True,
    )


def finished_jobs(count, state="done"):
    """``count`` jobs in ``state``, written in one statement; returns their ids."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO dbqueue_job (type, queue, payload, state, priority, run_after, "
            "attempts, max_attempts, lease_seconds, errors, created_at, finished_at) "
            "SELECT 'noop', 'default', '{}'::jsonb, %s, 0, now(), 1, 3, 60, '[]'::jsonb, "
            "now() - interval '1 hour', now() - interval '1 minute' "
            "FROM generate_series(1, %s) RETURNING id",
            [state, count],
        )
        return [row[0] for row in cursor.fetchall()]


def test_delete_finished_over_a_select_all_deletes_what_the_filter_selects(as_user):
    """Select all, under a filter: the page counts the filtered rows (not the page's boxes),
    and the delete takes them all, leaving the rest of the table alone."""
    done = finished_jobs(75)
    dead = finished_jobs(4, "dead")
    pending = enqueue("noop").id
    client = as_user("delete_backgroundjob")
    url = reverse(CHANGELIST) + "?state__exact=done"
    confirm = select_all(client, url, done[-50:])
    assert confirm.templates[0].name == DELETE_CONFIRMATION
    assert confirm.context["by_state"] == [("done", 75)] and confirm.context["refused"] == 0
    response = submit(client, confirm)
    assert texts(response) == ["Successfully deleted 75 background jobs."]
    assert scalar("SELECT count(*) FROM dbqueue_job WHERE state = 'done'") == 0
    assert [job_row(i)["state"] for i in (*dead, pending)] == ["dead"] * 4 + ["pending"]


def test_a_job_that_finishes_after_the_confirmation_page_is_left_alone(as_user):
    done = finished_jobs(3)
    late = enqueue("noop").id  # pending when the page is shown: not counted
    client = as_user("delete_backgroundjob")
    confirm = select_all(client, reverse(CHANGELIST), [late, *done])
    assert (confirm.context["deletable"], confirm.context["refused"]) == (3, 1)
    finish(late, "done")  # finished after the page was shown
    response = submit(client, confirm)
    assert texts(response)[0] == "Successfully deleted 3 background jobs."
    assert "1 selected job(s) were left alone" in texts(response)[1]
    assert job_row(late)["state"] == "done"


def test_a_confirmation_without_its_time_deletes_nothing(as_user):
    done = finished_jobs(2)
    client = as_user("delete_backgroundjob")
    for when in ({}, {"finished_before": "yesterday"}, {"finished_before": "2026-01-01T00:00"}):
        response = client.post(
            reverse(CHANGELIST),
            {"action": "delete_finished", "post": "yes", "_selected_action": done, **when},
            follow=True,
        )
        assert texts(response) == [
            "Nothing was deleted: the confirmation did not say when it was shown. Choose "
            "“Delete finished jobs” again."
        ]
    assert [job_row(i)["state"] for i in done] == ["done", "done"]


def test_dead_letters_select_all_and_delete(as_user):
    dead = finished_jobs(30, "dead")
    done = finished_jobs(2)
    client = as_user("delete_deadletter", "view_deadletter")
    url = reverse("admin:django_dbqueue_deadletter_changelist")
    confirm = select_all(client, url, dead[-10:])
    assert confirm.context["by_state"] == [("dead", 30)]
    response = submit(client, confirm)
    assert texts(response) == ["Successfully deleted 30 dead letters."]
    assert [job_row(i)["state"] for i in done] == ["done", "done"]


def test_delete_finished_costs_the_same_queries_and_page_for_any_selection(as_user):
    """No per-row object collection: a select-all of 3 jobs and one of 300 cost the same
    statements, and the same page, to confirm and to delete (pinned: a change that collects
    the rows, or logs a LogEntry for each, fails here). Django's own delete_selected listed
    every row on the page, with a hidden input each, and logged every row."""
    from django.db import connections
    from django.test.utils import CaptureQueriesContext

    client = as_user("delete_backgroundjob")
    client.get(reverse(CHANGELIST))  # the session and the user are loaded once
    cost = {}
    for rows in (3, 300):
        done = finished_jobs(rows)
        with CaptureQueriesContext(connections["default"]) as page_queries:
            confirm = select_all(client, reverse(CHANGELIST), done[-3:])
        with CaptureQueriesContext(connections["default"]) as delete_queries:
            submit(client, confirm, follow=False)
        assert scalar("SELECT count(*) FROM dbqueue_job") == 0
        cost[rows] = (len(page_queries), len(delete_queries), len(confirm.content))
        client.get(reverse(CHANGELIST))  # shows (and so clears) the delete's message
        assert not [q for q in delete_queries if "django_admin_log" in q["sql"]]
    (page_3, delete_3, size_3), (page_300, delete_300, size_300) = cost[3], cost[300]
    assert (page_3, delete_3) == (page_300, delete_300) == (PAGE_QUERIES, DELETE_QUERIES), cost
    assert abs(size_300 - size_3) < 40, cost  # a few digits more, not a row each


def test_delete_finished_needs_the_delete_permission(as_user):
    done = enqueue("noop").id
    finish(done, "done")
    client = as_user("requeue_backgroundjob")
    for data in ({}, {"post": "yes"}):
        client.post(
            reverse(CHANGELIST),
            {"action": "delete_finished", "_selected_action": [done], **data},
        )
    assert job_row(done)["state"] == "done"


def test_a_jobs_own_delete_page_refuses_unfinished_jobs(as_user):
    running = enqueue("noop").id
    set_state(running, "running")
    done = enqueue("noop").id
    finish(done, "done")
    client = as_user("delete_backgroundjob")

    def delete_url(job_id):
        return reverse("admin:django_dbqueue_backgroundjob_delete", args=[job_id])

    assert client.get(delete_url(running)).status_code == 403
    assert client.post(delete_url(running), {"post": "yes"}).status_code == 403
    assert job_row(running)["state"] == "running"
    assert client.get(delete_url(done)).status_code == 200
    client.post(delete_url(done), {"post": "yes"})
    assert job_row(done) is None


def test_delivery_records_cannot_be_deleted_in_the_admin(admin_client):
    record = begin_delivery("sms:keep")
    record_id = scalar("SELECT id FROM dbqueue_delivery WHERE key = %s", [record.key])
    url = reverse("admin:django_dbqueue_jobdelivery_delete", args=[record_id])
    assert admin_client.post(url, {"post": "yes"}).status_code == 403
    assert scalar("SELECT count(*) FROM dbqueue_delivery WHERE key = %s", [record.key]) == 1


def test_change_page_shows_the_workflow_with_states_and_links(as_user):
    from django_dbqueue import group

    first, second, callback = group(("noop", {}), ("echo", {}), then=("noop", {}))
    store.cancel("default", [second.id])
    client = as_user()
    page = client.get(
        reverse("admin:django_dbqueue_backgroundjob_change", args=[callback.id])
    ).content.decode()
    change = "/admin/django_dbqueue/backgroundjob/{}/change/"
    assert "Waits on" in page and "Waited on by" not in page
    assert f'<a href="{change.format(first.id)}">#{first.id} noop</a> — pending' in page
    assert f'<a href="{change.format(second.id)}">#{second.id} echo</a> — cancelled' in page
    assert page.index(f"#{first.id} noop") < page.index(f"#{second.id} echo")
    page = client.get(
        reverse("admin:django_dbqueue_backgroundjob_change", args=[first.id])
    ).content.decode()
    assert "Waited on by" in page and f"#{callback.id} noop</a> — cancelled" in page
    alone = enqueue("noop")
    page = client.get(
        reverse("admin:django_dbqueue_backgroundjob_change", args=[alone.id])
    ).content.decode()
    assert "not part of a workflow" in page
    summary = client.get(reverse(CHANGELIST)).content.decode()
    # default: first pending and alone due; the cancelled member's dependents are cancelled.
    assert "<th>scheduled</th><th>waiting</th>" in summary
    assert "<td>default</td><td>2</td><td>0</td><td>0</td>" in summary
    group(("noop", {}), then=("noop", {}))
    summary = client.get(reverse(CHANGELIST)).content.decode()
    assert "<td>default</td><td>3</td><td>0</td><td>1</td>" in summary


JOB_PAGE = "admin:django_dbqueue_backgroundjob_change"
STEP_ROW = re.compile(
    r"<tr><td>(.*?)</td><td>(.*?)</td><td>(.*?)</td><td><code[^>]*>(.*?)</code></td></tr>", re.S
)


def step_rows(page):
    """``[(step, attempt, finished at, result)]`` of the page's Steps table, unescaped."""
    table = page[page.index('<table class="dbqueue-steps">') :]
    table = table[: table.index("</table>")]
    return [tuple(html.unescape(cell) for cell in row) for row in STEP_ROW.findall(table)]


def add_steps(job_id, count, name="item"):
    """``count`` recorded steps ``name`` #1..#count, result ``{"n": occurrence}``, attempt 1."""
    with connection.cursor() as cursor:
        cursor.execute(
            """INSERT INTO dbqueue_step (job_id, name, occurrence, result, attempt, finished_at)
               SELECT %s, %s, g, jsonb_build_object('n', g), 1, now()
               FROM generate_series(1, %s) AS g""",
            [job_id, name, count],
        )


def finished_at(job_id):
    return {
        (name, n): timezone.localtime(at).strftime("%Y-%m-%d %H:%M:%S")
        for name, n, _, at, _ in store.list_steps("default", job_id)
    }


def test_change_page_shows_the_steps_a_run_recorded(as_user, start_worker):
    # ship fails on attempt 1: the steps before it were recorded by attempt 1, the rest by 2.
    five = enqueue("five-steps", {"fail_in": "ship"}).id
    loop = enqueue("loop-steps", {"items": [5, 6, 7]}).id
    start_worker()
    for job_id in (five, loop):
        wait_until(lambda j=job_id: job_row(j)["state"] == "done", message=f"job {job_id} done")
    client = as_user()  # view only
    page = client.get(reverse(JOB_PAGE, args=[five])).content.decode()
    assert ">Steps and waits</h" in page and "Recorded steps" in page
    when = finished_at(five)
    assert step_rows(page) == [
        (name, str(attempt), when[(name, 1)], json.dumps({"step": name, "attempt": attempt}))
        for name, attempt in [
            ("reserve", 1),
            ("charge", 1),
            ("wait-warehouse", 1),
            ("ship", 2),
            ("email", 2),
        ]
    ]
    assert "more:" not in page
    # The n-th call of a name in a run is "name #n".
    rows = step_rows(client.get(reverse(JOB_PAGE, args=[loop])).content.decode())
    assert [(row[0], row[3]) for row in rows] == [
        ("item", "10"),
        ("item #2", "12"),
        ("item #3", "14"),
    ]
    # A job without steps says so; steps are never a page of their own (no add, no change).
    alone = enqueue("noop").id
    page = client.get(reverse(JOB_PAGE, args=[alone])).content.decode()
    assert "none recorded" in page and "dbqueue-steps" not in page
    assert not admin.site.is_registered(JobStep)


def test_steps_are_escaped_and_long_results_cut(as_user):
    job_id = enqueue("noop").id
    with connection.cursor() as cursor:
        cursor.execute(
            """INSERT INTO dbqueue_step (job_id, name, occurrence, result, attempt) VALUES
               (%s, '<b>bold</b>', 1, '"<script>alert(1)</script>"', 1),
               (%s, 'long', 1, to_jsonb(repeat('x', 5000)), 1),
               (%s, 'nothing', 1, NULL, 1)""",
            [job_id, job_id, job_id],
        )
    page = as_user().get(reverse(JOB_PAGE, args=[job_id])).content.decode()
    assert "<b>bold</b>" not in page and "<script>alert(1)" not in page
    assert "&lt;b&gt;bold&lt;/b&gt;" in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    rows = {row[0]: row[3] for row in step_rows(page)}
    assert rows["long"] == '"' + "x" * 196 + "..."  # 200 characters, cut with "..."
    assert rows["nothing"] == "null"


def test_change_page_shows_the_first_200_steps_and_counts_the_rest(
    as_user, django_assert_max_num_queries
):
    job_id = enqueue("noop").id
    add_steps(job_id, 10_000)
    client = as_user()
    with django_assert_max_num_queries(10):  # as many as for a job without steps
        page = client.get(reverse(JOB_PAGE, args=[job_id])).content.decode()
    rows = step_rows(page)
    assert len(rows) == 200
    assert [rows[0][0], rows[1][0], rows[-1][0]] == ["item", "item #2", "item #200"]
    assert rows[-1][3] == '{"n": 200}'
    assert "and 9,800 more: the first 200 of 10,000 are shown, in the order they finished" in page


def test_the_dead_letter_page_shows_the_steps_too(as_user):
    job_id = enqueue("noop").id
    add_steps(job_id, 3, name="fetch")
    set_state(job_id, "dead")
    page = (
        as_user()
        .get(reverse("admin:django_dbqueue_deadletter_change", args=[job_id]))
        .content.decode()
    )
    assert [row[0] for row in step_rows(page)] == ["fetch", "fetch #2", "fetch #3"]


def test_steps_need_the_jobs_view_permission(client):
    job_id = enqueue("noop").id
    add_steps(job_id, 2, name="secret-step")
    set_state(job_id, "dead")
    user = User.objects.create_user("no-jobs", password="pw", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(
            content_type__app_label="django_dbqueue", codename="view_jobdelivery"
        )
    )
    client.force_login(user)
    for page in (JOB_PAGE, "admin:django_dbqueue_deadletter_change"):
        response = client.get(reverse(page, args=[job_id]))
        assert response.status_code == 403, page
        assert "secret-step" not in response.content.decode()
    client.logout()
    response = client.get(reverse(JOB_PAGE, args=[job_id]))
    assert response.status_code == 302 and "/login/" in response["Location"]
