"""``run_jobqueue --metrics-port``: a real worker process scraped over HTTP, checked against the
table; with ``--processes`` the parent serves the sum of its children's counters."""

import io
import socket
import urllib.request

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from prometheus_client.parser import text_string_to_metric_families

from django_dbqueue import enqueue
from tests.acceptance.helpers import enqueue_jobs, rows, wait_all_in_state
from tests.utils import wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

FAST = "tests.acceptance.settings_fast"


@pytest.fixture(autouse=True)
def fast_dbqueue(settings):
    from tests.acceptance.settings_fast import FAST_DBQUEUE

    settings.DBQUEUE = FAST_DBQUEUE


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def scrape(port):
    """``{(name, frozenset(labels)): value}``, or ``None`` while the port is not up yet."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return None
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples, name, **labels):
    return samples.get((name, frozenset(labels.items())), 0.0)


def table_count(condition):
    return rows(f"SELECT count(*) FROM dbqueue_job WHERE queue = 'default' AND {condition}")[0][0]


@pytest.mark.parametrize("processes", ["1", "2"])
def test_a_scrape_reports_the_workers_counts_and_the_table(start_worker, processes):
    port = free_port()
    worker = start_worker(
        "--processes",
        processes,
        "--metrics-port",
        str(port),
        "--metrics-addr",
        "127.0.0.1",
        settings=FAST,
    )
    wait_until(lambda: scrape(port), timeout=20, message="the metrics port")
    ids = enqueue_jobs("noop", 40)
    dead = enqueue("discard")
    enqueue("noop", {}, delay=3600)
    wait_all_in_state(ids, "done", timeout=30)
    wait_all_in_state([dead.id], "dead", timeout=30)
    noop = {"type": "noop", "queue": "default"}
    # Counters arrive after each acknowledgement; the table's gauges are cached per
    # METRICS_CACHE (10 s by default), so wait for a scrape that has seen the final state.
    samples = wait_until(
        lambda: (
            (s := scrape(port))
            and value(s, "dbqueue_jobs_succeeded_total", **noop) == 40
            and value(s, "dbqueue_queue_jobs", queue="default", state="dead") == 1
            and s
        ),
        timeout=30,
        interval=0.5,
        message="a scrape with every job counted",
    )
    assert value(samples, "dbqueue_jobs_started_total", **noop) == 40
    assert value(samples, "dbqueue_job_wait_seconds_count", **noop) == 40
    assert value(samples, "dbqueue_job_duration_seconds_count", **noop, outcome="succeeded") == 40
    assert value(samples, "dbqueue_jobs_dead_total", type="discard", queue="default") == 1
    assert value(samples, "dbqueue_queue_jobs", queue="default", state="scheduled") == table_count(
        "state = 'pending' AND run_after > now()"
    )
    assert value(samples, "dbqueue_queue_jobs", queue="default", state="dead") == table_count(
        "state = 'dead'"
    )
    assert value(samples, "dbqueue_queue_jobs", queue="default", state="due") == 0
    assert value(samples, "dbqueue_table_up") == 1
    # The registry: every worker process of the command, live, serving both queues on this host.
    host = socket.gethostname()
    for queue in ("default", "emails"):
        assert value(samples, "dbqueue_workers", queue=queue, host=host) == int(processes)
    registered = [worker_id for (worker_id,) in rows("SELECT worker_id FROM dbqueue_worker")]
    assert len(registered) == int(processes)
    for worker_id in registered:
        assert 0 <= value(samples, "dbqueue_worker_heartbeat_age_seconds", worker=worker_id) < 5
    worker.assert_alive()


@pytest.mark.parametrize(
    ("port", "fragment"),
    [("0", "must be a port from 1 to 65535, got 0"), ("70000", "got 70000"), ("x", "got 'x'")],
)
def test_a_bad_metrics_port_is_a_usage_error(port, fragment):
    with pytest.raises(CommandError, match=fragment):
        call_command("run_jobqueue", "--burst", "--metrics-port", port)


def test_a_metrics_port_in_use_is_refused_before_any_job_runs():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        job = enqueue("noop")
        with pytest.raises(CommandError, match=f"cannot listen on 127.0.0.1:{port}"):
            call_command(
                "run_jobqueue",
                "--burst",
                "--metrics-port",
                str(port),
                "--metrics-addr",
                "127.0.0.1",
            )
    assert rows("SELECT state FROM dbqueue_job WHERE id = %s", [job.id]) == [("pending",)]


def test_metrics_port_without_prometheus_client_fails_before_the_banner(monkeypatch):
    # As without the [prometheus] extra (metrics.available() looks for the package).
    from django_dbqueue import metrics

    monkeypatch.setattr(metrics, "available", lambda: False)
    out = io.StringIO()
    with pytest.raises(CommandError, match="pip install 'django-dbqueue\\[prometheus\\]'"):
        call_command("run_jobqueue", "--burst", "--metrics-port", str(free_port()), stdout=out)
    assert out.getvalue() == ""  # no "dbqueue starting" before the error


def test_an_undecodable_metrics_addr_is_a_usage_error_not_a_traceback():
    """A byte that is not UTF-8 reaches argv as a lone surrogate; it used to travel to the
    socket and end in a UnicodeEncodeError's traceback."""
    from tests.integration.test_bad_input import run_command

    job = enqueue("noop")
    result = run_command(
        "run_jobqueue", "--burst", "--metrics-port", str(free_port()), "--metrics-addr", b"\xff"
    )
    stderr = result.stderr.decode("utf-8", "replace")
    assert result.returncode == 2, stderr
    assert "usage:" in stderr and "argument --metrics-addr:" in stderr, stderr
    assert "contains a lone surrogate ('\\udcff' at index 0), which is not valid UTF-8" in stderr
    assert "Traceback" not in stderr
    assert rows("SELECT state FROM dbqueue_job WHERE id = %s", [job.id]) == [("pending",)]


@pytest.mark.parametrize(
    ("addr", "fragment"),
    [
        ("", "argument --metrics-addr: must be a host name or an IP address, got ''"),
        ("127.0.0.1\x00", "'127.0.0.1\\x00' contains a NUL character"),
        ("a" * 64 + ".example", "'aaaaaaaaaaaaaaaaaaa"),
        # Python's idna codec words it differently from 3.12 on; both name the label.
        ("a" * 64 + ".example", "is not a host name or an IP address ("),
        ("a" * 64 + ".example", "label empty or too long"),
    ],
)
def test_a_bad_metrics_addr_is_a_usage_error(addr, fragment):
    with pytest.raises(CommandError) as caught:
        call_command(
            "run_jobqueue", "--burst", "--metrics-port", str(free_port()), "--metrics-addr", addr
        )
    assert fragment in str(caught.value)
