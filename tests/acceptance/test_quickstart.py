"""The quickstart works as written: a fresh ``startproject`` built from docs/quickstart.md runs a job.

The test follows the page: ``startproject mysite``, ``startapp shop``, then every file of the page
exactly as printed (the settings block appended to ``mysite/settings.py``, the other blocks as
whole files). It changes one thing: the connection in ``DATABASES`` points at a database of its
own on the test server. Then it makes the migrations, migrates, checks, posts an invoice to the
real view through ``runserver``, and runs ``run_jobqueue --burst`` until the job is done and the
e-mail printed. Then step 7: the settings block that makes sending fail is appended, a worker runs
without ``--burst`` until the next invoice's job is dead, the page's log lines are in its log, the
page's shell sessions give the printed answers (Django's doctest), and ``jobqueue_requeue`` puts the
dead jobs back, which then succeed with the settings restored.

``DBQUEUE_QUICKSTART_PYTHON`` names the interpreter of a venv that has the built wheel installed
(``dev.py test`` sets it): the project then runs on that venv, never on this checkout.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import psycopg
import pytest
from django.conf import settings
from psycopg import sql

pytestmark = [pytest.mark.acceptance]

REPO_ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = REPO_ROOT / "docs" / "quickstart.md"
# A python block that starts with "# <path>" is that whole file; "# <path>: add at the end" is
# appended to the file startproject made.
FILE_BLOCK = re.compile(
    r"```python\n# (?P<path>[\w/]+\.py)(?P<append>: add at the end)?\n(?P<body>.*?)```", re.S
)
COMMANDS = [
    "django-admin startproject mysite",
    "python manage.py startapp shop",
    "python manage.py makemigrations shop",
    "python manage.py migrate",
    "python manage.py check",
    "python manage.py runserver",
    "python manage.py run_jobqueue --queues default,emails --burst",
]
CURL = re.compile(r"\$ curl -X POST (?P<fields>(?:-d \S+ )+)http://127\.0\.0\.1:8000(?P<path>/\S*)")
# Step 7: the block appended to watch a failure, the shell sessions, the log lines, the requeue.
FAILURE_BLOCK = re.compile(
    r"```python\n# mysite/settings\.py: add at the end to watch a failure\n(?P<body>.*?)```", re.S
)
SESSION = re.compile(r"```python\n(?P<body>>>> .*?)```", re.S)
LOG_LINE = re.compile(r"^dbqueue (?:retried|dead) job=.*$", re.M)
REQUEUE = re.compile(
    r"\$ python manage\.py jobqueue_requeue --ids (?P<ids>[\d ]+)\n(?P<answer>requeued .*)\n"
)
WORKER = ["run_jobqueue", "--queues", "default,emails"]  # step 6's worker without --burst
# The interpreter of the quickstart's project: a venv with the built wheel, or this test's own.
WHEEL_PYTHON = os.environ.get("DBQUEUE_QUICKSTART_PYTHON")
PYTHON = WHEEL_PYTHON or sys.executable
# Runs one of the page's shell sessions through doctest inside `manage.py shell -c`.
DOCTEST = """
import doctest, os, sys
text = open(os.environ["QUICKSTART_SESSION"]).read()
test = doctest.DocTestParser().get_doctest(text, {}, "quickstart", "quickstart.md", 0)
runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
runner.run(test)
sys.exit(1 if runner.failures else 0)
"""


def doc_files(text):
    files = [(m["path"], m["body"], bool(m["append"])) for m in FILE_BLOCK.finditer(text)]
    assert {path for path, _, _ in files} == {
        "mysite/settings.py",
        "shop/models.py",
        "shop/jobs.py",
        "shop/views.py",
        "mysite/urls.py",
    }, files
    return files


def server_params():
    conf = settings.DATABASES["default"]
    params = {"host": conf.get("HOST"), "port": conf.get("PORT"), "user": conf.get("USER")}
    params["password"] = conf.get("PASSWORD")
    return {k: str(v) for k, v in params.items() if v}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def project_database():
    conf = settings.DATABASES["default"]
    test_name = conf.get("TEST", {}).get("NAME") or f"test_{conf['NAME']}"
    name = f"{test_name}_quickstart"  # per checkout, like the test database it is named after
    ident = sql.Identifier(name)
    with psycopg.connect(dbname="postgres", autocommit=True, **server_params()) as conn:
        conn.execute(sql.SQL("drop database if exists {} with (force)").format(ident))
        conn.execute(sql.SQL("create database {}").format(ident))
    yield name
    with psycopg.connect(dbname="postgres", autocommit=True, **server_params()) as conn:
        conn.execute(sql.SQL("drop database if exists {} with (force)").format(ident))


def log_pattern(line):
    """The page's log line as a pattern: any delay where it shows one (they are random)."""
    delay = r"in \d+\.\ds"
    return delay.join(re.escape(part) for part in re.split(delay, line))


def wait_until(what, predicate, timeout=120):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.2)


def start(args, cwd, env, log_path):
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            [PYTHON, *args], cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT
        )


def stop(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)  # a worker finishes or hands back its jobs, exits 0
        proc.wait(timeout=60)


def test_the_quickstart_project_runs_a_job(tmp_path, project_database):
    text = QUICKSTART.read_text()
    for command in COMMANDS:
        assert f"$ {command}\n" in text, f"the quickstart no longer says `{command}`"
    curl = CURL.search(text)
    assert curl, "the quickstart's curl command has changed"
    fields = dict(pair.split("=", 1) for pair in re.findall(r"-d (\S+)", curl["fields"]))

    env = dict(os.environ)
    env.pop("DJANGO_SETTINGS_MODULE", None)  # pytest's; manage.py must use mysite.settings
    env["PYTHONUNBUFFERED"] = "1"
    if WHEEL_PYTHON:
        env.pop("PYTHONPATH", None)  # the wheel's package, and nothing from this checkout
    else:
        env["PYTHONPATH"] = str(REPO_ROOT)  # this checkout's package
    project = tmp_path / "mysite"

    def run(*args, timeout=120, extra_env=None):
        proc = subprocess.run(
            [PYTHON, *args],
            cwd=project if project.exists() else tmp_path,
            env={**env, **(extra_env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        assert proc.returncode == 0, (
            f"{args} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
        )
        return proc.stdout + proc.stderr

    where = run("-c", "import django_dbqueue; print(django_dbqueue.__file__)").strip()
    checkout = REPO_ROOT / "django_dbqueue"
    if WHEEL_PYTHON:  # installed in that venv, not imported from this checkout
        assert Path(where).is_relative_to(Path(WHEEL_PYTHON).parents[1]), where
        assert "site-packages" in Path(where).parts and not Path(where).is_relative_to(checkout)
    else:
        assert Path(where).is_relative_to(checkout), where

    run("-m", "django", "startproject", "mysite")  # django-admin startproject mysite
    run("manage.py", "startapp", "shop")
    for path, body, append in doc_files(text):
        target = project / path
        if append:
            target.write_text(target.read_text() + "\n" + body)
        else:
            target.write_text(body)
    # The one change to the page: the connection of the test server, to a database of its own.
    connection = {"NAME": project_database, **{k.upper(): v for k, v in server_params().items()}}
    settings_py = project / "mysite" / "settings.py"
    with open(settings_py, "a") as handle:
        handle.write(f"\nDATABASES['default'].update({connection!r})\n")

    run("manage.py", "makemigrations", "shop")
    migrated = run("manage.py", "migrate")
    assert "dbqueue.W003" not in migrated  # it would say "run migrate" while migrate runs
    checked = run("manage.py", "check")
    assert "System check identified no issues" in checked

    def job_row(job_id):
        with psycopg.connect(dbname=project_database, **server_params()) as conn:
            return conn.execute(
                "select state, attempts from dbqueue_job where id = %s", [job_id]
            ).fetchone()

    port = free_port()
    server = start(
        ["manage.py", "runserver", "--noreload", f"127.0.0.1:{port}"],
        project,
        env,
        tmp_path / "runserver.log",
    )
    workers = []
    try:

        def post_invoice():
            body = urllib.parse.urlencode(fields).encode()
            url = f"http://127.0.0.1:{port}{curl['path']}"
            with urllib.request.urlopen(url, data=body, timeout=30) as response:
                assert response.status == 201
                return json.loads(response.read())

        def listening():
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    return True
            except OSError:
                assert server.poll() is None, (tmp_path / "runserver.log").read_text()
                return False

        wait_until("runserver listens", listening, timeout=60)
        answer = post_invoice()

        # Step 6: a worker in burst mode sends the e-mail.
        worker_output = run("manage.py", "run_jobqueue", "--queues", "default,emails", "--burst")
        assert f"Subject: Invoice {answer['invoice_id']}" in worker_output
        assert f"To: {fields['email']}" in worker_output
        assert "1 succeeded, 0 retried, 0 dead" in worker_output
        assert job_row(answer["job_id"])[0] == "done"
        with psycopg.connect(dbname=project_database, **server_params()) as conn:
            emailed = conn.execute(
                "select emailed_at is not null from shop_invoice where id = %s",
                [answer["invoice_id"]],
            ).fetchone()
        assert emailed == (True,)

        # Step 7: sending fails, on Django 5.2 (EMAIL_*) and 6.1 (MAILERS) alike.
        step7 = text[text.index("## 7. Watch a failure") : text.index("## Next")]
        failure = FAILURE_BLOCK.search(step7)
        assert failure, "step 7 no longer has the settings block that makes sending fail"
        with socket.socket() as probe:  # the page's premise: nothing listens on its SMTP port
            assert probe.connect_ex(("127.0.0.1", 2525)) != 0, "something listens on 2525"
        as_set_up = settings_py.read_text()
        settings_py.write_text(as_set_up + "\n" + failure["body"])
        worker_log = tmp_path / "worker-failing.log"
        workers.append(start(["manage.py", *WORKER], project, env, worker_log))
        failing = post_invoice()
        assert failing["job_id"] == 2  # the page's samples name job 2
        wait_until("job 2 is dead", lambda: job_row(2) == ("dead", 8))

        sessions = [m["body"] for m in SESSION.finditer(step7)]
        assert len(sessions) == 2, sessions
        for n, session in enumerate(sessions):
            session_file = tmp_path / f"session-{n}.txt"
            session_file.write_text(session)
            out = run(
                "manage.py",
                "shell",
                "-c",
                DOCTEST,
                extra_env={"QUICKSTART_SESSION": str(session_file)},
            )
            assert "Failed example" not in out, out
        wait_until("job 3 is dead", lambda: job_row(3) == ("dead", 2))
        stop(workers.pop())
        logged = worker_log.read_text()
        for line in LOG_LINE.findall(step7):
            pattern = log_pattern(line)
            assert re.search(pattern, logged), f"the worker never logged: {line}\n{logged}"

        # Back to the console backend, a worker again, and the dead jobs requeued.
        settings_py.write_text(as_set_up)
        worker_log = tmp_path / "worker-requeued.log"
        workers.append(start(["manage.py", *WORKER], project, env, worker_log))
        requeue = REQUEUE.search(step7)
        assert requeue, "step 7 no longer requeues the dead jobs"
        ids = requeue["ids"].split()
        out = run("manage.py", "jobqueue_requeue", "--ids", *ids)
        assert out.strip() == requeue["answer"], out
        for job_id in ids:
            wait_until(f"job {job_id} is done", lambda j=job_id: job_row(int(j))[0] == "done")
        stop(workers.pop())
        assert "Subject: Invoice" in worker_log.read_text()
    finally:
        for proc in [server, *workers]:
            stop(proc)
