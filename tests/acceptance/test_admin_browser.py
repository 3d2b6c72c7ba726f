"""The admin in a real browser, on the example shop: find a dead letter, requeue it, see it done.

Headless Chromium (Debian's ``chromium`` package, driven by Playwright from PyPI through
``executable_path``: no browser download) logs into ``example_project``'s admin as a staff user who
has only the view permissions and ``requeue_backgroundjob``, filters the dead letters by type,
requeues the charge that died while the card was declined, runs ``run_jobqueue --burst`` and
reloads the job's page until it says ``done``.

Everything runs the way an operator would meet it: a database of its own (created on the test
server, dropped at the end), ``manage.py migrate``, ``manage.py runserver``, invoices posted to the
shop's real ``POST /invoices/`` view, and real ``run_jobqueue`` processes with the fake payment
provider in ``decline``, ``timeout-once`` and ``ok`` mode. Nothing here uses pytest-django's test
database: its settings only tell where the PostgreSQL server is.

Without playwright or /usr/bin/chromium the test is skipped with the reason; with
``DBQUEUE_REQUIRE_BROWSER=1`` (meant for CI) it fails instead.

The screenshots in docs/operations.md and docs/tasks.md come from this test:
``DBQUEUE_UPDATE_SCREENSHOTS=1 pytest tests/acceptance/test_admin_browser.py`` writes them to
``docs/img/``; without it they go to the test's tmp_path, so CI does not touch the tree.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from django.conf import settings

pytestmark = [pytest.mark.acceptance]

REPO_ROOT = Path(__file__).resolve().parents[2]
MANAGE = REPO_ROOT / "example_project" / "manage.py"
DOCS_IMG = REPO_ROOT / "docs" / "img"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",  # CI runs as root, where Chromium's sandbox refuses to start
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
INSTALL_HINT = "install with apt-get install chromium and pip install playwright"

STAFF_USER = "operator"
STAFF_PASSWORD = "operator-password-for-the-browser-test"
# Exactly what the tour needs: seeing the lists, and requeueing. Not a superuser.
STAFF_PERMISSIONS = [
    "django_dbqueue.view_backgroundjob",
    "django_dbqueue.view_deadletter",
    "django_dbqueue.view_jobdelivery",
    "django_dbqueue.requeue_backgroundjob",
]


# -- requirements ---------------------------------------------------------------------------------


def _missing(reason):
    # DBQUEUE_REQUIRE_BROWSER=1 (for CI, where both are installed) makes a missing one a failure.
    if os.environ.get("DBQUEUE_REQUIRE_BROWSER") == "1":
        pytest.fail(f"{reason}: {INSTALL_HINT} (DBQUEUE_REQUIRE_BROWSER=1)")
    pytest.skip(f"{reason}: {INSTALL_HINT}")


@pytest.fixture
def sync_playwright():
    """Playwright's entry point; skips the test (before any set-up) when a requirement is missing."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("playwright is not installed")
    if not CHROMIUM.exists():
        _missing(f"{CHROMIUM} is missing")
    return sync_playwright


# -- the database ---------------------------------------------------------------------------------


def _server_params():
    """psycopg connection parameters of the configured PostgreSQL server (any database)."""
    conf = settings.DATABASES["default"]
    params = {
        "host": conf.get("HOST") or None,
        "port": conf.get("PORT") or None,
        "user": conf.get("USER") or None,
        "password": conf.get("PASSWORD") or None,
    }
    return {k: v for k, v in params.items() if v is not None}


def _database_url(name):
    """A django-environ DATABASE_URL for database ``name`` on the configured server."""
    conf = settings.DATABASES["default"]
    user = urllib.parse.quote(conf.get("USER") or "", safe="")
    password = conf.get("PASSWORD") or ""
    auth = f"{user}:{urllib.parse.quote(password, safe='')}" if password else user
    host = conf.get("HOST") or ""
    port = f":{conf['PORT']}" if conf.get("PORT") else ""
    if host.startswith("/"):  # a socket directory goes in the path (django-environ's syntax)
        return f"postgres://{auth}@{port}/{urllib.parse.quote(host, safe='')}/{name}"
    return f"postgres://{auth}@{host or 'localhost'}{port}/{name}"


def _admin_connection():
    import psycopg

    errors = []
    for dbname in ("postgres", "template1", settings.DATABASES["default"]["NAME"]):
        try:
            return psycopg.connect(dbname=dbname, autocommit=True, **_server_params())
        except psycopg.OperationalError as exc:
            errors.append(f"{dbname}: {exc}")
    pytest.fail("cannot reach the PostgreSQL server of DATABASE_URL: " + "; ".join(errors))


@pytest.fixture
def shop_database():
    """A fresh database for the example project on the test server; dropped afterwards."""
    from psycopg import sql

    name = f"dbqueue_browser_{os.getpid()}"
    with _admin_connection() as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield name
    finally:
        with _admin_connection() as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


class Shop:
    """The example project on ``database``: manage.py commands, SQL look-ups, processes."""

    def __init__(self, database, log_dir):
        self.database = database
        self.log_dir = log_dir
        self.url = _database_url(database)
        self.processes = []

    def env(self, **extra):
        env = dict(os.environ)
        env.pop("DJANGO_SETTINGS_MODULE", None)  # pytest-django's; manage.py sets the shop's
        env.update(
            DATABASE_URL=self.url,
            PYTHONUNBUFFERED="1",
            DEBUG="1",  # runserver serves the admin's CSS
            SHOP_FAKE_PROVIDER_MODE="ok",
            LOG_LEVEL="INFO",
        )
        env.update(extra)
        return env

    def manage(self, *args, timeout=60, **env):
        """Run ``manage.py *args`` to completion; fail the test with its output if it fails."""
        result = subprocess.run(
            [sys.executable, str(MANAGE), *args],
            cwd=REPO_ROOT,
            env=self.env(**env),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        assert result.returncode == 0, (
            f"manage.py {' '.join(args)} exited {result.returncode}\n"
            f"--- stdout ---\n{result.stdout}\n--- stderr ---\n{result.stderr}"
        )
        return result

    def start(self, name, *args, **env):
        """Start ``manage.py *args`` in its own process group; killed at teardown."""
        out = self.log_dir / f"{name}.log"
        with open(out, "wb") as log:
            process = subprocess.Popen(
                [sys.executable, str(MANAGE), *args],
                cwd=REPO_ROOT,
                env=self.env(**env),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        process.log_path = out
        process.label = name
        self.processes.append(process)
        return process

    def output(self, process):
        return f"--- {process.label} (exit {process.poll()}) ---\n" + process.log_path.read_text(
            errors="replace"
        )

    def stop(self, process, timeout=20):
        """SIGTERM (a worker's graceful stop) and wait for exit 0."""
        if process.poll() is None:
            os.kill(process.pid, signal.SIGTERM)
        try:
            code = process.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"{process.label} ignored SIGTERM\n{self.output(process)}"
            ) from None
        assert code == 0, self.output(process)

    def kill_all(self):
        for process in self.processes:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)

    def query(self, statement, params=()):
        import psycopg

        with psycopg.connect(dbname=self.database, autocommit=True, **_server_params()) as conn:
            return conn.execute(statement, params).fetchall()

    def wait_for(self, what, check, *, timeout=30.0, processes=()):
        """Poll ``check()`` until it is truthy; fail (with the processes' output) at the deadline."""
        deadline = time.monotonic() + timeout
        while True:
            value = check()
            if value:
                return value
            for process in processes:
                if process.poll() is not None:
                    raise AssertionError(
                        f"{process.label} exited while waiting for {what}\n{self.output(process)}"
                    )
            if time.monotonic() >= deadline:
                logs = "\n".join(self.output(p) for p in processes)
                raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{logs}")
            time.sleep(0.05)

    def job(self, job_id):
        rows = self.query(
            "SELECT state, attempts, jsonb_array_length(errors) FROM dbqueue_job WHERE id = %s",
            (job_id,),
        )
        return rows[0] if rows else None

    def delivery_state(self, key):
        rows = self.query("SELECT state FROM dbqueue_delivery WHERE key = %s", (key,))
        return rows[0][0] if rows else None


@pytest.fixture
def shop(shop_database, tmp_path):
    shop = Shop(shop_database, tmp_path)
    try:
        yield shop
    finally:
        shop.kill_all()


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _http(url, data=None, timeout=5.0):
    body = None if data is None else json.dumps(data).encode()
    request = urllib.request.Request(
        url, data=body, headers={"Content-Type": "application/json"} if body else {}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return response.status, response.read()


def _wait_until_serving(shop, server, base_url, timeout=30.0):
    def answers():
        try:
            return _http(base_url + "/admin/login/", timeout=1.0)[0] == 200
        except (OSError, urllib.error.URLError):
            return False

    shop.wait_for("runserver to answer", answers, timeout=timeout, processes=[server])


def _post_invoice(base_url, email, amount):
    status, body = _http(
        base_url + "/invoices/", {"email": email, "name": email.split("@")[0], "amount": amount}
    )
    assert status == 201, body
    return json.loads(body)


# -- the screenshots --------------------------------------------------------------------------


@pytest.fixture
def screenshot(tmp_path):
    """``screenshot(page, "name")``: docs/img/name.png with DBQUEUE_UPDATE_SCREENSHOTS=1."""
    update = os.environ.get("DBQUEUE_UPDATE_SCREENSHOTS") == "1"
    directory = DOCS_IMG if update else tmp_path / "img"
    directory.mkdir(parents=True, exist_ok=True)

    def take(page, name, *, element=None):
        path = directory / f"{name}.png"
        (element or page).screenshot(path=str(path))
        assert path.stat().st_size > 10_000, f"{path} looks empty"
        return path

    return take


# -- the test ---------------------------------------------------------------------------------


def test_operator_requeues_a_dead_letter_in_the_admin(sync_playwright, shop, screenshot):
    # The shop's database, and a staff user who may look and requeue, nothing else.
    shop.manage("migrate", "--verbosity", "0")
    shop.manage(
        "shell",
        "--command",
        "from django.contrib.auth.models import Permission, User\n"
        f"user = User.objects.create_user({STAFF_USER!r}, password={STAFF_PASSWORD!r}, "
        "is_staff=True)\n"
        f"wanted = {STAFF_PERMISSIONS!r}\n"
        "perms = [Permission.objects.get(content_type__app_label=p.split('.')[0], "
        "codename=p.split('.')[1]) for p in wanted]\n"
        "user.user_permissions.set(perms)\n"
        "assert not user.is_superuser\n"
        # An e-mail job whose invoice is gone: its handler discards it (DiscardJob).
        "from django_dbqueue import enqueue\n"
        "print(enqueue('send-invoice-email', {'invoice_id': 999999}).id)\n",
    )

    port = _free_port()
    base_url = f"http://127.0.0.1:{port}"
    server = shop.start("runserver", "runserver", f"127.0.0.1:{port}", "--noreload")
    _wait_until_serving(shop, server, base_url)

    # Night one: the provider declines every card. Ada's charge spends its 5 attempts and dies;
    # her e-mail goes out; the orphan e-mail job is discarded to the dead letters at once.
    ada = _post_invoice(base_url, "ada@example.com", "42.00")
    worker = shop.start(
        "worker-decline",
        "run_jobqueue",
        "--queues",
        "emails,payments",
        "--poll-interval",
        "0.1",
        SHOP_FAKE_PROVIDER_MODE="decline",
    )
    charge_id = ada["charge_job_id"]
    shop.wait_for(
        "Ada's charge to die after 5 declined attempts",
        lambda: shop.job(charge_id) == ("dead", 5, 5),
        processes=[worker],
    )
    shop.wait_for(
        "the e-mail jobs to finish",
        lambda: (
            shop.query(
                "SELECT count(*) FROM dbqueue_job WHERE type = 'send-invoice-email' "
                "AND state IN ('done', 'dead')"
            )[0][0]
            == 2
        ),
        processes=[worker],
    )
    shop.stop(worker)
    assert shop.delivery_state(f"charge:{ada['invoice_id']}") == "failed"

    # Night two: the provider charges Grace, then its answer is lost. The retry does not charge
    # again: the delivery stays recorded, outcome unknown, for a person to confirm.
    grace = _post_invoice(base_url, "grace@example.com", "17.50")
    worker = shop.start(
        "worker-timeout",
        "run_jobqueue",
        "--queues",
        "emails,payments",
        "--poll-interval",
        "0.1",
        SHOP_FAKE_PROVIDER_MODE="timeout-once",
    )
    shop.wait_for(
        "Grace's charge to finish with its outcome unconfirmed",
        lambda: (
            shop.job(grace["charge_job_id"]) == ("done", 2, 1)
            and shop.job(grace["job_id"])[0] == "done"
        ),
        processes=[worker],
    )
    shop.stop(worker)
    assert shop.delivery_state(f"charge:{grace['invoice_id']}") == "recorded"

    # This morning's orders, not run yet: the backlog in the status summary.
    linus = _post_invoice(base_url, "linus@example.com", "99.00")

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(
                viewport={"width": 1440, "height": 900}, color_scheme="light"
            )
            # The admin's app list on the left stays collapsed: the lists get the width.
            context.add_init_script(
                "window.localStorage.setItem('django.admin.navSidebarIsOpen', 'false')"
            )
            page = context.new_page()
            page.set_default_timeout(10_000)
            _tour(page, shop, base_url, charge_id, ada, grace, linus, screenshot)
        finally:
            browser.close()


def _tour(page, shop, base_url, charge_id, ada, grace, linus, screenshot):
    from playwright.sync_api import expect

    admin = base_url + "/admin/"

    # Log in.
    page.goto(admin)
    page.fill("#id_username", STAFF_USER)
    page.fill("#id_password", STAFF_PASSWORD)
    page.click("input[type=submit]")
    expect(page.locator("#user-tools")).to_contain_text(STAFF_USER)

    # The job list, with the status summary on top.
    page.goto(admin + "django_dbqueue/backgroundjob/")
    summary = page.locator("#dbqueue-status")
    expect(summary).to_be_visible()
    payments = summary.locator("tr", has=page.locator("td", has_text=re.compile(r"^payments$")))
    # pending (due) 1 (Linus's charge), dead 1 (Ada's charge); columns by their headers
    headers = summary.locator("thead th").evaluate_all("els => els.map(e => e.textContent.trim())")
    expect(payments.locator("td").nth(headers.index("pending (due)"))).to_have_text("1")
    expect(payments.locator("td").nth(headers.index("dead"))).to_have_text("1")
    # Its actions are the ones the user's permissions allow: requeue, not run-now or cancel.
    actions = page.locator("select[name=action] option").evaluate_all(
        "els => els.map(e => e.value)"
    )
    assert set(actions) - {""} == {"requeue"}, actions
    screenshot(page, "admin-jobs-changelist")

    # The dead letters, filtered by type.
    page.goto(admin + "django_dbqueue/deadletter/")
    rows = page.locator("#result_list tbody tr")
    expect(rows).to_have_count(2)  # Ada's charge and the orphan e-mail
    page.locator("#changelist-filter").get_by_role("link", name="charge-invoice").click()
    expect(page).to_have_url(re.compile(r"[?&]type=charge-invoice"))
    expect(rows).to_have_count(1)
    row = rows.first
    expect(row.locator("th, td").nth(1)).to_have_text(str(charge_id))
    expect(row).to_contain_text("DeliveryFailed")
    expect(row).to_contain_text("5/5")
    screenshot(page, "admin-dead-letters")

    # The dead letter itself: payload, and the error of every attempt.
    row.get_by_role("link", name=str(charge_id)).click()
    expect(page.locator("h1")).to_contain_text("dead letter")
    payload = page.locator(".field-payload_pretty")
    expect(payload).to_contain_text(f'"invoice_id": {ada["invoice_id"]}')
    errors = page.locator(".field-errors_pretty")
    for attempt in range(1, 6):
        expect(errors).to_contain_text(
            f"attempt {attempt} — django_dbqueue.deliveries.DeliveryFailed"
        )
    expect(errors).to_contain_text("card of ada@example.com declined")
    screenshot(page, "admin-dead-letter-detail", element=page.locator("fieldset", has=errors))

    # Back to the filtered list; select it; requeue.
    page.go_back()
    expect(rows).to_have_count(1)
    row.locator("input.action-select").check()
    page.select_option("select[name=action]", "requeue")
    page.click("button[name=index]")
    success = page.locator("ul.messagelist li.success")
    expect(success).to_have_text("Requeued 1 job(s).")
    expect(page.locator("#result_list")).to_have_count(0)  # no dead charge left
    screenshot(page, "admin-requeued")
    assert shop.job(charge_id)[:2] == ("pending", 0)

    # The job's own page: pending now, its errors kept.
    job_url = admin + f"django_dbqueue/backgroundjob/{charge_id}/change/"
    page.goto(job_url)
    state = page.locator(".field-state .readonly")
    expect(state).to_have_text("pending")

    # The card works again: one burst worker drains the payments queue and exits.
    shop.manage("run_jobqueue", "--burst", "--queues", "payments", SHOP_FAKE_PROVIDER_MODE="ok")
    assert shop.job(charge_id)[0] == "done"
    assert shop.job(linus["charge_job_id"])[0] == "done"  # the morning's charge went too

    page.reload()
    expect(state).to_have_text("done")
    expect(page.locator(".field-attempts .readonly")).to_have_text("1")
    expect(page.locator(".field-errors_pretty")).to_contain_text("attempt 5 —")  # history kept
    screenshot(page, "admin-job-done")
    assert shop.delivery_state(f"charge:{ada['invoice_id']}") == "sent"
    paid = shop.query(
        "SELECT paid_at IS NOT NULL FROM shop_invoice WHERE id = %s", (ada["invoice_id"],)
    )
    assert paid == [(True,)]

    # The delivery whose outcome nobody knows: Grace's charge, and only it.
    page.goto(admin + "django_dbqueue/jobdelivery/")
    page.locator("#changelist-filter").get_by_role(
        "link", name="unconfirmed (outcome unknown)"
    ).click()
    expect(page).to_have_url(re.compile(r"[?&]unconfirmed=yes"))
    deliveries = page.locator("#result_list tbody tr")
    expect(deliveries).to_have_count(1)
    expect(deliveries.first).to_contain_text(f"charge:{grace['invoice_id']}")
    expect(deliveries.first).to_contain_text("recorded (outcome unknown)")
    screenshot(page, "admin-unconfirmed-deliveries")

    # The queue dashboard, from the job list's "Queue dashboard" link: the night's jobs in charts.
    page.goto(admin + "django_dbqueue/backgroundjob/")
    page.locator(".object-tools").get_by_role("link", name="Queue dashboard").click()
    expect(page.locator("h1")).to_have_text("Queue dashboard")
    page.get_by_role("link", name="24 h").click()
    expect(page).to_have_url(re.compile(r"[?&]hours=24"))
    expect(page.locator("svg.dbq-chart")).to_have_count(4)
    assert page.locator("#dbq-finished rect").count() > 0  # bars of the jobs that finished
    expect(page.locator("#dbq-failures")).to_contain_text("charge-invoice")  # Ada's dead charge
    expect(page.locator("#dbq-finished-title")).to_have_text(
        "Jobs finished per minute by state, last 24 h"
    )
    expect(page.locator("#dbq-now")).to_contain_text("payments")
    screenshot(page, "admin-dashboard")
    page.emulate_media(color_scheme="dark")  # the admin's dark theme follows the browser's
    screenshot(page, "admin-dashboard-dark")


# -- the workers page -----------------------------------------------------------------------------

WATCHER_USER = "watcher"
WATCHER_PERMISSIONS = ["django_dbqueue.view_workerrecord", "django_dbqueue.view_backgroundjob"]


def _create_staff(shop, username, permissions):
    shop.manage(
        "shell",
        "--command",
        "from django.contrib.auth.models import Permission, User\n"
        f"user = User.objects.create_user({username!r}, password={STAFF_PASSWORD!r}, "
        "is_staff=True)\n"
        f"perms = [Permission.objects.get(content_type__app_label=p.split('.')[0], "
        f"codename=p.split('.')[1]) for p in {permissions!r}]\n"
        "user.user_permissions.set(perms)\n",
    )


def _log_in(page, base_url, username):
    from playwright.sync_api import expect

    page.goto(base_url + "/admin/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", STAFF_PASSWORD)
    page.click("input[type=submit]")
    expect(page.locator("#user-tools")).to_contain_text(username)


def test_operator_sees_the_live_workers_in_the_admin(sync_playwright, shop, screenshot):
    from playwright.sync_api import expect

    shop.manage("migrate", "--verbosity", "0")
    _create_staff(shop, WATCHER_USER, WATCHER_PERMISSIONS)
    _create_staff(shop, "jobs-only", ["django_dbqueue.view_backgroundjob"])
    port = _free_port()
    base_url = f"http://127.0.0.1:{port}"
    server = shop.start("runserver", "runserver", f"127.0.0.1:{port}", "--noreload")
    # A worker on two queues, and a --processes group of two on the third.
    single = shop.start(
        "worker-single", "run_jobqueue", "--queues", "emails,payments", "--concurrency", "4"
    )
    group = shop.start(
        "worker-group",
        "run_jobqueue",
        "--queues",
        "default",
        "--processes",
        "2",
        "--concurrency",
        "2",
        "--execution",
        "process",
    )
    _wait_until_serving(shop, server, base_url)
    workers = shop.wait_for(
        "three workers in the registry",
        lambda: (
            (
                rows := shop.query(
                    "SELECT pid, group_pid FROM dbqueue_worker WHERE expires_at > now() ORDER BY pid"
                )
            )
            and len(rows) == 3
            and rows
        ),
        processes=[single, group],
    )
    children = [pid for pid, parent in workers if parent == group.pid]
    assert len(children) == 2 and (single.pid, None) in workers

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(
                viewport={"width": 1440, "height": 640}, color_scheme="light"
            )
            context.add_init_script(
                "window.localStorage.setItem('django.admin.navSidebarIsOpen', 'false')"
            )
            page = context.new_page()
            page.set_default_timeout(10_000)
            _log_in(page, base_url, WATCHER_USER)
            page.goto(base_url + "/admin/django_dbqueue/workerrecord/")
            expect(page.locator("h1")).to_have_text("Workers")
            rows = page.locator("#result_list tbody tr")
            expect(rows).to_have_count(3)
            headers = page.locator("#result_list thead th").evaluate_all(
                "els => els.map(e => e.textContent.trim())"
            )

            def cell(row, header):
                return row.locator("th, td").nth(headers.index(header))

            mine = rows.filter(has=page.locator("td.field-pid", has_text=str(single.pid)))
            expect(cell(mine, "Queues")).to_have_text("emails, payments")
            expect(cell(mine, "Concurrency")).to_have_text("4")
            expect(cell(mine, "Execution")).to_have_text("thread")
            expect(cell(mine, "Group of pid")).to_have_text("-")
            expect(cell(mine, "State")).to_have_text("running")
            expect(cell(mine, "Running jobs")).to_have_text("0")
            expect(cell(mine, "Heartbeat")).to_contain_text("s ago")
            for pid in children:
                child = rows.filter(has=page.locator("td.field-pid", has_text=str(pid)))
                expect(cell(child, "Execution")).to_have_text("process")
                expect(cell(child, "Group of pid")).to_have_text(str(group.pid))
                expect(cell(child, "Queues")).to_have_text("default")
            # Read-only: nothing to add, no actions, no delete.
            expect(page.locator(".object-tools a.addlink")).to_have_count(0)
            expect(page.locator("select[name=action]")).to_have_count(0)
            screenshot(page, "admin-workers")

            # A worker stopped with SIGTERM leaves the page at once.
            shop.stop(single)
            page.reload()
            expect(rows).to_have_count(2)
            expect(page.locator("#result_list")).not_to_contain_text(str(single.pid))

            # Without the view permission on workers: no page.
            context.clear_cookies()
            _log_in(page, base_url, "jobs-only")
            response = page.goto(base_url + "/admin/django_dbqueue/workerrecord/")
            assert response.status == 403
        finally:
            browser.close()
    shop.stop(group)
    assert shop.query("SELECT count(*) FROM dbqueue_worker") == [(0,)]


# -- schedules ------------------------------------------------------------------------------------

SCHEDULE_USER = "scheduler"
# Seeing, adding and changing schedule entries; not deleting them.
SCHEDULE_PERMISSIONS = [
    "django_dbqueue.view_scheduleentry",
    "django_dbqueue.add_scheduleentry",
    "django_dbqueue.change_scheduleentry",
]


def test_operator_creates_edits_and_disables_a_schedule_entry(sync_playwright, shop, screenshot):
    shop.manage("migrate", "--verbosity", "0")
    shop.manage(
        "shell",
        "--command",
        "from django.contrib.auth.models import Permission, User\n"
        f"user = User.objects.create_user({SCHEDULE_USER!r}, password={STAFF_PASSWORD!r}, "
        "is_staff=True)\n"
        f"wanted = {SCHEDULE_PERMISSIONS!r}\n"
        "user.user_permissions.set([Permission.objects.get(content_type__app_label="
        "p.split('.')[0], codename=p.split('.')[1]) for p in wanted])\n",
    )
    port = _free_port()
    base_url = f"http://127.0.0.1:{port}"
    server = shop.start("runserver", "runserver", f"127.0.0.1:{port}", "--noreload")
    _wait_until_serving(shop, server, base_url)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(
                viewport={"width": 1440, "height": 900}, color_scheme="light"
            )
            context.add_init_script(
                "window.localStorage.setItem('django.admin.navSidebarIsOpen', 'false')"
            )
            page = context.new_page()
            page.set_default_timeout(10_000)
            _schedule_tour(page, shop, base_url, screenshot)
        finally:
            browser.close()


def _schedule_entry(shop):
    rows = shop.query(
        "SELECT name, cron, timezone, payload::text, enabled FROM dbqueue_schedule_entry"
    )
    return rows[0] if rows else None


def _schedule_tour(page, shop, base_url, screenshot):
    from playwright.sync_api import expect

    admin = base_url + "/admin/"
    page.goto(admin)
    page.fill("#id_username", SCHEDULE_USER)
    page.fill("#id_password", STAFF_PASSWORD)
    page.click("input[type=submit]")
    expect(page.locator("#user-tools")).to_contain_text(SCHEDULE_USER)

    # The schedule page: the settings entries read-only on top, the stored ones below.
    page.goto(admin + "django_dbqueue/scheduleentry/")
    expect(page.locator("#dbqueue-settings-schedules")).to_contain_text("Entries from settings")
    page.locator(".object-tools").get_by_role("link", name=re.compile("Add schedule entry")).click()

    # A typo in the job type and a four-field cron: each error on its field, nothing saved.
    page.fill("#id_name", "nightly-reminder")
    page.fill("#id_job_type", "send-invoice-emial")
    page.fill("#id_payload", '{"invoice_id": 1}')
    page.fill("#id_cron", "0 3 * *")
    page.fill("#id_timezone", "Europe/Berlin")
    page.click("input[name=_save]")
    expect(page.locator(".field-job_type .errorlist")).to_contain_text(
        "did you mean 'send-invoice-email'"
    )
    expect(page.locator(".field-cron .errorlist")).to_contain_text("is not a valid cron expression")
    screenshot(page, "admin-schedule-errors")
    assert _schedule_entry(shop) is None

    # Fixed, it saves; the list shows its next tick in the project's zone, UTC (03:00 in Berlin
    # is 02:00 UTC in winter, 01:00 in summer).
    page.fill("#id_job_type", "send-invoice-email")
    page.fill("#id_cron", "0 3 * * *")
    page.click("input[name=_save]")
    expect(page.locator("ul.messagelist li.success")).to_contain_text("was added successfully")
    row = page.locator("#result_list tbody tr", has_text="nightly-reminder")
    expect(row).to_contain_text("cron 0 3 * * * (Europe/Berlin)")
    expect(row.locator("td.field-last_tick_display")).to_have_text("never")
    expect(row.locator("td.field-next_tick_display")).to_have_text(re.compile(r"\b[12] a\.m\."))
    assert _schedule_entry(shop) == (
        "nightly-reminder",
        "0 3 * * *",
        "Europe/Berlin",
        '{"invoice_id": 1}',
        True,
    )

    # Edit: half past four instead; the next tick is recomputed.
    row.get_by_role("link", name="nightly-reminder").click()
    page.fill("#id_cron", "30 4 * * *")
    page.click("input[name=_save]")
    expect(page.locator("ul.messagelist li.success")).to_contain_text("was changed successfully")
    expect(row.locator("td.field-next_tick_display")).to_have_text(re.compile(r"\b[23]:30 a\.m\."))
    assert _schedule_entry(shop)[1] == "30 4 * * *"
    screenshot(page, "admin-schedules")

    # Disable it with the list's action (no delete: this user may not).
    row.locator("input.action-select").check()
    actions = page.locator("select[name=action] option").evaluate_all(
        "els => els.map(e => e.value)"
    )
    assert set(actions) - {""} == {"enable", "disable"}, actions
    page.select_option("select[name=action]", "disable")
    page.click("button[name=index]")
    expect(page.locator("ul.messagelist li.success")).to_have_text(
        "Disabled 1 schedule entry(ies)."
    )
    expect(row.locator("td.field-next_tick_display")).to_have_text("disabled")
    assert _schedule_entry(shop)[4] is False


# -- names you recognise --------------------------------------------------------------------------

RECEIPT_TASK = "shop.tasks.send_receipt"
MISSING_TASK = "no.such.module.task"  # names no module: shown as text, never imported


def _insert_job(shop, job_type, queue, payload):
    """A pending row as the enqueue stores it (for ``django.tasks``, as DBQueueBackend does)."""
    return shop.query(
        "INSERT INTO dbqueue_job (type, queue, payload, state, priority, run_after, attempts, "
        "max_attempts, lease_seconds, errors, created_at) "
        "VALUES (%s, %s, %s, 'pending', 0, now() + interval '1 hour', 0, 5, 60, '[]', now()) "
        "RETURNING id",
        (job_type, queue, json.dumps(payload)),
    )[0][0]


def _task_payload(path):
    # What DBQueueBackend.enqueue() stores (django_dbqueue/_django_tasks.py).
    return {"task": path, "backend": "default", "args": [42], "kwargs": {"copy": True}}


def test_operator_sees_and_filters_jobs_by_task_name(sync_playwright, shop, screenshot):
    """The type column and filter name a ``django.tasks`` job by its task's path, as text."""
    from playwright.sync_api import expect

    shop.manage("migrate", "--verbosity", "0")
    _create_staff(shop, "jobs-only", ["django_dbqueue.view_backgroundjob"])
    receipt = _insert_job(shop, "django.tasks", "default", _task_payload(RECEIPT_TASK))
    missing = _insert_job(shop, "django.tasks", "default", _task_payload(MISSING_TASK))
    plain = _insert_job(shop, "send-invoice-email", "emails", {"invoice_id": 1})
    port = _free_port()
    base_url = f"http://127.0.0.1:{port}"
    server = shop.start("runserver", "runserver", f"127.0.0.1:{port}", "--noreload")
    _wait_until_serving(shop, server, base_url)
    changelist = base_url + "/admin/django_dbqueue/backgroundjob/"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(
                viewport={"width": 1100, "height": 420}, color_scheme="light"
            )
            context.add_init_script(
                "window.localStorage.setItem('django.admin.navSidebarIsOpen', 'false')"
            )
            page = context.new_page()
            page.set_default_timeout(10_000)
            _log_in(page, base_url, "jobs-only")

            response = page.goto(changelist)
            assert response.status == 200
            rows = page.locator("#result_list tbody tr")
            expect(rows).to_have_count(3)

            def type_cell(job_id):
                row = rows.filter(
                    has=page.locator(
                        "th.field-id, td.field-id", has_text=re.compile(rf"^{job_id}$")
                    )
                )
                return row.locator("td.field-type_display")

            expect(type_cell(receipt)).to_have_text(f"{RECEIPT_TASK} (django.tasks)")
            expect(type_cell(missing)).to_have_text(f"{MISSING_TASK} (django.tasks)")
            expect(type_cell(plain)).to_have_text("send-invoice-email")
            expect(page.locator(".errornote, .errorlist")).to_have_count(0)
            screenshot(page, "admin-task-names", element=page.locator("#changelist"))

            # Filtered to one task's path (a path no process knows filters too, as text).
            for path, job_id in ((MISSING_TASK, missing), (RECEIPT_TASK, receipt)):
                query = urllib.parse.urlencode({"type": f"task:{path}"})
                response = page.goto(f"{changelist}?{query}")
                assert response.status == 200
                expect(rows).to_have_count(1)
                expect(type_cell(job_id)).to_have_text(f"{path} (django.tasks)")
                expect(page.locator("#result_list")).not_to_contain_text("send-invoice-email")

            # Through the filter's UI: the plain type always; a task's path when the web process
            # knows that task (the shop defines none, so its choice may be absent).
            page.goto(changelist)
            filters = page.locator("#changelist-filter")
            filters.get_by_role("link", name="send-invoice-email", exact=True).click()
            expect(rows).to_have_count(1)
            expect(type_cell(plain)).to_have_text("send-invoice-email")
            page.goto(changelist)
            choice = filters.get_by_role("link", name=RECEIPT_TASK, exact=True)
            if choice.count():
                choice.click()
                expect(rows).to_have_count(1)
                expect(type_cell(receipt)).to_have_text(f"{RECEIPT_TASK} (django.tasks)")
        finally:
            browser.close()
    # Showing the rows imported nothing and logged no error.
    log = shop.output(server)
    assert "Traceback" not in log and "ModuleNotFoundError" not in log, log
