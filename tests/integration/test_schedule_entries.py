"""Schedule entries stored in the database: the code API's validation, ticking, edits that take
effect from the next tick, disabling, timing changes without a burst, the races between an edit
and a worker's tick (both orders, held open with real sessions), and the admin page."""

import datetime
import io
import json
import threading

import pytest
from django.core.management import call_command
from django.db import connection, connections, transaction
from django.utils.html import escape

from django_dbqueue import scheduler as scheduler_module
from django_dbqueue.models import ScheduleEntry
from django_dbqueue.schedule_entries import (
    ScheduleError,
    schedule_job,
    unschedule_job,
    update_schedule,
)
from django_dbqueue.scheduler import Scheduler
from tests.utils import scalar, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

HOUR = 3600


@pytest.fixture(autouse=True)
def queues(settings):
    settings.DBQUEUE = {
        "QUEUES": {"default": {}, "emails": {}},
        "SCHEDULE": {"from-settings": {"every": 3600, "type": "noop"}},
    }


def one_tick_due(name):
    """Put the entry's last tick one second before the latest hour: that hour's tick is due
    (and the next one is an hour away, so no boundary passes during the test)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE dbqueue_schedule_entry SET last_tick = to_timestamp("
            "floor(extract(epoch FROM now()) / 3600) * 3600 - 1) WHERE name = %s "
            "RETURNING last_tick + interval '1 second'",
            [name],
        )
        return cursor.fetchone()[0]


def jobs(name):
    """``[(tick, payload)]`` of the jobs the entry made, oldest tick first."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT idempotency_key, payload::text FROM dbqueue_job "
            "WHERE idempotency_key LIKE %s ORDER BY idempotency_key",
            [f"dbqueue-schedule:{name}:%"],
        )
        return [
            (datetime.datetime.fromisoformat(key.split(":", 2)[2]), json.loads(payload))
            for key, payload in cursor.fetchall()
        ]


def last_tick(name):
    return scalar("SELECT last_tick FROM dbqueue_schedule_entry WHERE name = %s", [name])


@pytest.mark.parametrize(
    ("kwargs", "field", "fragment"),
    [
        ({"job_type": "nop", "every": 60}, "type", "names job type 'nop', which no @job"),
        ({"job_type": "nop", "every": 60}, "type", "did you mean 'noop'"),
        ({"cron": "61 * * * *"}, "cron", "'61 * * * *' is not a valid cron expression"),
        ({"cron": "0 0 30 2 *"}, "cron", "never comes due"),
        ({}, "cron", "needs exactly one of 'cron'"),
        ({"every": 60, "cron": "* * * * *"}, "cron", "needs exactly one of 'cron'"),
        ({"every": 0.5}, "every", "must be at least 1 second"),
        ({"every": 60, "timezone": "Mars/Olympus"}, "timezone", "not a known time zone"),
        ({"cron": "0 3 * * *", "timezone": "localtime"}, "timezone", "not an IANA time zone"),
        ({"cron": "0 3 * * *", "timezone": "posixrules"}, "timezone", "not an IANA time zone"),
        ({"cron": "0 3 * * *", "timezone": "Factory"}, "timezone", "not an IANA time zone"),
        ({"cron": "0 0 3 * * *"}, "cron", "'0 0 3 * * *' has 6 fields"),
        ({"cron": "*/5 * * * * * *"}, "cron", "'*/5 * * * * * *' has 7 fields"),
        ({"every": 60, "payload": {"d": datetime.date(2026, 1, 1)}}, "payload", '["d"]'),
        ({"every": 60, "payload": {"x": [float("nan")]}}, "payload", '["x"][0] is nan'),
        ({"every": 60, "queue": "nope"}, "queue", "'nope' is not in DBQUEUE['QUEUES']"),
        ({"every": 60, "priority": 1000}, "priority", "priority"),
        ({"every": 60, "catch_up": "some"}, "catch_up", "must be one of ['all', 'latest'"),
        ({"every": 60, "catch_up_window": 60}, "catch_up_window", "applies to catch_up 'all'"),
    ],
)
def test_the_api_refuses_a_bad_entry_naming_what_is_wrong(kwargs, field, fragment):
    kwargs = {"job_type": "noop", **kwargs}
    with pytest.raises(ScheduleError) as caught:
        schedule_job("nightly", kwargs.pop("job_type"), **kwargs)
    assert caught.value.field == field
    assert fragment in str(caught.value)
    assert str(caught.value).startswith("schedule entry 'nightly'")
    assert ScheduleEntry.objects.count() == 0  # nothing written


def test_a_stored_entry_may_not_take_a_settings_entry_name():
    with pytest.raises(ScheduleError, match="DBQUEUE\\['SCHEDULE'\\] has an entry of that name"):
        schedule_job("from-settings", "noop", every=60)


def test_a_stored_entry_ticks_once_per_tick_and_shows_in_the_status():
    entry = schedule_job("hourly", "echo", every=HOUR, payload={"v": 1}, queue="emails")
    assert entry.enabled and entry.last_enqueued is None
    out = io.StringIO()
    call_command("jobqueue_status", stdout=out)
    assert "schedule hourly (database): last tick never, next tick 20" in out.getvalue()
    tick = one_tick_due("hourly")
    counts = Scheduler().run_once()
    assert counts["enqueued"] == 1
    assert Scheduler().run_once()["enqueued"] == 0
    assert jobs("hourly") == [(tick, {"v": 1})]
    assert scalar("SELECT queue FROM dbqueue_job") == "emails"
    out = io.StringIO()
    call_command("jobqueue_status", "--json", stdout=out)
    rows = {row["name"]: row for row in json.loads(out.getvalue())["schedules"]}
    assert rows["hourly"]["source"] == "database"
    assert rows["hourly"]["last_tick"] == tick.isoformat()
    assert rows["from-settings"]["source"] == "settings"


def test_an_edit_takes_effect_from_the_next_tick():
    schedule_job("hourly", "echo", every=HOUR, payload={"v": 1}, misfire_grace=10 * HOUR)
    tick = one_tick_due("hourly")
    # The tick came due before the edit: the edit enqueues it, with the payload it had then.
    update_schedule("hourly", payload={"v": 2})
    assert jobs("hourly") == [(tick, {"v": 1})]
    assert last_tick("hourly") == tick  # the ticks' progress is kept: no restart
    with connection.cursor() as cursor:  # as if the hour before had not run yet
        cursor.execute(
            "UPDATE dbqueue_schedule_entry SET last_tick = %s",
            [tick - datetime.timedelta(seconds=HOUR + 1)],
        )
    Scheduler().run_once()
    hour_before = tick - datetime.timedelta(seconds=HOUR)
    assert jobs("hourly") == [(hour_before, {"v": 2}), (tick, {"v": 1})]


def test_disabling_stops_ticks_and_enabling_restarts_from_now():
    schedule_job("hourly", "noop", every=HOUR, catch_up="all", misfire_grace=10 * HOUR)
    update_schedule("hourly", enabled=False)
    with connection.cursor() as cursor:  # disabled for five hours
        cursor.execute(
            "UPDATE dbqueue_schedule_entry SET last_tick = now() - interval '5 hours 1 second'"
        )
    assert Scheduler().run_once()["enqueued"] == 0
    entry = update_schedule("hourly", enabled=True)
    assert jobs("hourly") == []  # the ticks of the disabled hours never run
    assert entry.last_tick >= scalar("SELECT now()") - datetime.timedelta(seconds=5)
    assert Scheduler().run_once()["enqueued"] == 0


def test_changing_the_timing_recomputes_the_next_tick_without_a_burst():
    # Every ten seconds, with a grace that would run every tick since the last one on time.
    schedule_job("often", "noop", every=HOUR, misfire_grace=10 * HOUR, catch_up="all")
    with connection.cursor() as cursor:  # its last tick was 40 minutes ago
        cursor.execute(
            "UPDATE dbqueue_schedule_entry SET last_tick = now() - interval '40 minutes'"
        )
    before = scalar("SELECT now()")
    update_schedule("often", every=10)
    Scheduler().run_once()
    # Without the restart, the 240 ticks of the last 40 minutes would all run now. (The edit
    # enqueued the old timing's hourly tick, if an hour began in those 40 minutes.)
    assert len([tick for tick, _ in jobs("often") if tick > before]) <= 1
    assert len([tick for tick, _ in jobs("often") if tick <= before]) <= 1
    update_schedule("often", cron="*/5 * * * *", timezone="Europe/Berlin")
    assert scalar("SELECT every FROM dbqueue_schedule_entry") is None
    assert len(jobs("often")) <= 3


def test_unschedule_enqueues_what_was_due_then_deletes():
    schedule_job("hourly", "noop", every=HOUR)
    tick = one_tick_due("hourly")
    assert unschedule_job("hourly") is True
    assert [t for t, _ in jobs("hourly")] == [tick]
    assert unschedule_job("hourly") is False
    assert ScheduleEntry.objects.count() == 0


def test_an_invalid_stored_entry_is_skipped_and_logged_once(caplog):
    schedule_job("hourly", "noop", every=HOUR)
    with connection.cursor() as cursor:  # a raw UPDATE bypasses validation
        cursor.execute("UPDATE dbqueue_schedule_entry SET job_type = 'gone'")
    one_tick_due("hourly")
    scheduler = Scheduler()
    with caplog.at_level("ERROR", logger="django_dbqueue"):
        for _ in range(3):
            assert scheduler.run_once()["enqueued"] == 0
    errors = [r for r in caplog.records if "schedule entry 'hourly' ignored" in r.getMessage()]
    assert len(errors) == 1
    out = io.StringIO()
    call_command("jobqueue_status", stdout=out)
    assert "next tick none (ignored: schedule entry 'hourly' names job type 'gone'" in (
        out.getvalue()
    )


@pytest.mark.parametrize("field", ["cron", "timezone"])
def test_update_schedule_refuses_six_fields_and_non_iana_zones(field):
    schedule_job("nightly", "noop", cron="0 3 * * *", timezone="Europe/Berlin")
    value = {"cron": "0 0 3 * * *", "timezone": "localtime"}[field]
    with pytest.raises(ScheduleError) as caught:
        update_schedule("nightly", **{field: value})
    assert caught.value.field == field
    entry = ScheduleEntry.objects.get()
    assert (entry.cron, entry.timezone) == ("0 3 * * *", "Europe/Berlin")  # nothing written


def stored_with_six_fields(name, seconds_ago):
    """A stored entry written with six cron fields before they were refused (a raw UPDATE
    stands for it), its last tick ``seconds_ago`` seconds back."""
    schedule_job(name, "noop", cron="* * * * *")
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE dbqueue_schedule_entry SET cron = '* * * * * *', "
            "last_tick = now() - %s * interval '1 second' WHERE name = %s",
            [seconds_ago, name],
        )


def test_a_stored_six_field_entry_is_ignored_not_ticked_every_second(caplog):
    """Entries stored before the refusal: the worker ignores them (logged once, and the status
    says why) instead of making a job a second."""
    stored_with_six_fields("every-second", 20)
    with caplog.at_level("ERROR", logger="django_dbqueue"):
        scheduler = Scheduler()
        for _ in range(3):
            assert scheduler.run_once() == {"enqueued": 0, "skipped": 0}
    assert jobs("every-second") == []
    errors = [r for r in caplog.records if "entry 'every-second' ignored" in r.getMessage()]
    assert len(errors) == 1 and "has 6 fields" in errors[0].getMessage()
    out = io.StringIO()
    call_command("jobqueue_status", stdout=out)
    assert "schedule every-second (database): last tick never, next tick none (ignored: " in (
        out.getvalue()
    )


def test_fixing_a_stored_six_field_entry_enqueues_none_of_its_seconds():
    """An edit first enqueues what came due under the old definition: a six-field one would
    have enqueued a job for every second since its last tick. Its ticks restart at the edit."""
    stored_with_six_fields("every-second", 120)
    update_schedule("every-second", cron="0 3 * * *")
    assert jobs("every-second") == []
    assert ScheduleEntry.objects.get().cron == "0 3 * * *"


# -- races: an edit and a worker's tick on two sessions, held open at the exact point ----------


def test_a_worker_skips_an_entry_whose_edit_is_uncommitted_and_never_waits_for_it():
    """Order 1: the edit locks the row first. A worker's pass meanwhile neither waits for the
    edit (SKIP LOCKED) nor enqueues the tick the edit already enqueued (uncommitted)."""
    schedule_job("hourly", "echo", every=HOUR, payload={"v": 1})
    tick = one_tick_due("hourly")
    edited, commit = threading.Event(), threading.Event()

    def edit():
        try:
            with transaction.atomic():
                update_schedule("hourly", payload={"v": 2})
                edited.set()
                commit.wait(30)
        finally:
            connections.close_all()

    editor = threading.Thread(target=edit)
    editor.start()
    try:
        assert edited.wait(30)
        result = {}

        def tick_once():
            try:
                result["counts"] = Scheduler().run_once()
            finally:
                connections.close_all()

        worker = threading.Thread(target=tick_once)
        worker.start()
        worker.join(10)
        assert not worker.is_alive(), "the worker's pass waited for the uncommitted edit"
        assert result["counts"] == {"enqueued": 0, "skipped": 0}
    finally:
        commit.set()
        editor.join(30)
    assert Scheduler().run_once()["enqueued"] == 0
    assert jobs("hourly") == [(tick, {"v": 1})]
    assert last_tick("hourly") == tick


def test_an_edit_waits_for_a_worker_ticking_the_entry_and_keeps_its_progress(monkeypatch):
    """Order 2: the worker locks the row first and is held inside its tick (enqueued, not yet
    committed). The edit waits for it, then reads the tick's progress: nothing is enqueued twice,
    ``last_tick`` does not go back, and the new payload applies from the next tick."""
    schedule_job("hourly", "echo", every=HOUR, payload={"v": 1})
    tick = one_tick_due("hourly")
    inside, release = threading.Event(), threading.Event()
    original = scheduler_module.enqueue_due

    def held(*args):
        result = original(*args)
        if threading.current_thread().name == "ticking-worker":
            inside.set()
            release.wait(30)
        return result

    monkeypatch.setattr(scheduler_module, "enqueue_due", held)

    def tick_once():
        try:
            Scheduler().run_once()
        finally:
            connections.close_all()

    errors = []

    def edit():
        try:
            update_schedule("hourly", payload={"v": 2})
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    worker = threading.Thread(target=tick_once, name="ticking-worker")
    worker.start()
    editor = None
    try:
        assert inside.wait(30)
        editor = threading.Thread(target=edit, name="editor")
        editor.start()
        # The edit's session waits on the worker's row lock (not merely slow):
        wait_until(
            lambda: (
                scalar(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND query LIKE '%%FROM dbqueue_schedule_entry AS e WHERE e.id%%FOR UPDATE%%'"
                )
                == 1
            ),
            timeout=10,
            message="the edit waiting for the worker's lock",
        )
        assert editor.is_alive()
    finally:
        release.set()
        worker.join(30)
        if editor is not None:
            editor.join(30)
    assert not errors, errors
    assert jobs("hourly") == [(tick, {"v": 1})]
    assert last_tick("hourly") >= tick  # not written back from before the worker's tick
    assert scalar("SELECT last_enqueued FROM dbqueue_schedule_entry") == tick
    assert scalar("SELECT payload->>'v' FROM dbqueue_schedule_entry") == "2"


# -- the admin page (the browser test walks it too: tests/acceptance/test_admin_browser.py) ----

ADD_URL = "/admin/django_dbqueue/scheduleentry/add/"
LIST_URL = "/admin/django_dbqueue/scheduleentry/"


def admin_client(client, *codenames):
    from django.contrib.auth.models import Permission, User

    user = User.objects.create_user("ops", password="pw", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="django_dbqueue", codename__in=codenames)
    )
    client.force_login(user)
    return client


def form(**overrides):
    data = {
        "name": "nightly",
        "enabled": "on",
        "job_type": "echo",
        "payload": '{"kind": "daily"}',
        "queue": "",
        "priority": "",
        "cron": "0 3 * * *",
        "every": "",
        "timezone": "Europe/Berlin",
        "catch_up": "latest",
        "catch_up_window": "",
        "misfire_grace": "60",
    }
    data.update(overrides)
    return data


@pytest.mark.parametrize(
    ("overrides", "field", "fragment"),
    [
        ({"job_type": "ecno"}, "job_type", "which no @job registers; did you mean 'echo'"),
        ({"cron": "0 3 * *"}, "cron", "is not a valid cron expression"),
        ({"timezone": "Europe/Berlinn"}, "timezone", "is not a known time zone"),
        ({"timezone": "localtime"}, "timezone", "is not an IANA time zone name"),
        ({"timezone": "Factory"}, "timezone", "is not an IANA time zone name"),
        ({"cron": "0 0 3 * * *"}, "cron", "has 6 fields"),
        ({"payload": '{"ratio": NaN}'}, "payload", '["ratio"] is nan'),
        ({"payload": "{not json"}, "payload", "Enter a valid JSON"),
        ({"name": "from-settings"}, "name", "DBQUEUE['SCHEDULE'] has an entry"),
    ],
)
def test_the_admin_form_names_what_is_wrong_on_its_field(client, overrides, field, fragment):
    client = admin_client(client, "add_scheduleentry", "view_scheduleentry")
    response = client.post(ADD_URL, form(**overrides))
    assert response.status_code == 200  # the form again, with the error
    errors = response.context["adminform"].form.errors
    assert field in errors, errors
    assert fragment in " ".join(errors[field])
    assert escape(fragment) in response.content.decode()  # shown on the page
    assert ScheduleEntry.objects.count() == 0


def test_the_admin_adds_edits_disables_and_deletes_through_the_api(client):
    client = admin_client(
        client,
        "add_scheduleentry",
        "change_scheduleentry",
        "delete_scheduleentry",
        "view_scheduleentry",
    )
    response = client.post(ADD_URL, form(), follow=True)
    assert response.status_code == 200
    entry = ScheduleEntry.objects.get()
    assert (entry.cron, entry.timezone, entry.payload) == (
        "0 3 * * *",
        "Europe/Berlin",
        {"kind": "daily"},
    )
    change_url = f"{LIST_URL}{entry.pk}/change/"
    client.post(change_url, form(payload='{"kind": "weekly"}', enabled=""), follow=True)
    entry.refresh_from_db()
    assert entry.payload == {"kind": "weekly"} and not entry.enabled
    response = client.post(
        LIST_URL, {"action": "enable", "_selected_action": [entry.pk]}, follow=True
    )
    assert "Enabled 1 schedule entry" in response.content.decode()
    entry.refresh_from_db()
    assert entry.enabled
    page = client.get(LIST_URL).content.decode()
    assert "Entries from settings (read-only" in page and "from-settings" in page
    client.post(f"{LIST_URL}{entry.pk}/delete/", {"post": "yes"}, follow=True)
    assert ScheduleEntry.objects.count() == 0


def test_the_admin_respects_the_schedule_permissions(client):
    entry = schedule_job("nightly", "noop", cron="0 3 * * *")
    client = admin_client(client, "view_scheduleentry")
    page = client.get(LIST_URL)
    assert page.status_code == 200 and "nightly" in page.content.decode()
    assert client.post(ADD_URL, form(name="other")).status_code == 403
    change_url = f"{LIST_URL}{entry.pk}/change/"
    client.post(change_url, form(cron="0 4 * * *"))
    assert client.post(f"{LIST_URL}{entry.pk}/delete/", {"post": "yes"}).status_code == 403
    response = client.post(LIST_URL, {"action": "disable", "_selected_action": [entry.pk]})
    entry.refresh_from_db()
    assert entry.cron == "0 3 * * *" and entry.enabled  # nothing changed
    assert ScheduleEntry.objects.count() == 1
    assert response.status_code in (200, 302)


def test_a_worker_killed_while_it_holds_the_entry_loses_nothing_and_doubles_nothing(monkeypatch):
    """A worker dies (its backend is terminated, as after kill -9) inside its tick: enqueued,
    not committed. Its transaction rolls back and frees the row; the next pass enqueues the tick
    once."""
    schedule_job("hourly", "noop", every=HOUR)
    tick = one_tick_due("hourly")
    inside, release = threading.Event(), threading.Event()
    backend = {}
    original = scheduler_module.enqueue_due

    def held(*args):
        result = original(*args)
        if threading.current_thread().name == "doomed-worker":
            backend["pid"] = connection.connection.info.backend_pid
            inside.set()
            release.wait(30)
        return result

    monkeypatch.setattr(scheduler_module, "enqueue_due", held)

    def tick_once():
        try:
            Scheduler().run_once()  # its failure is logged, as in a worker
        finally:
            connections.close_all()

    doomed = threading.Thread(target=tick_once, name="doomed-worker")
    doomed.start()
    try:
        assert inside.wait(30)
        # While it holds the row, another worker's pass skips the entry.
        assert Scheduler().run_once()["enqueued"] == 0
        assert scalar("SELECT pg_terminate_backend(%s)", [backend["pid"]])
    finally:
        release.set()
        doomed.join(30)
    assert jobs("hourly") == []  # rolled back with the dead worker's transaction
    assert Scheduler().run_once()["enqueued"] == 1
    assert [t for t, _ in jobs("hourly")] == [tick]
    assert Scheduler().run_once()["enqueued"] == 0
