"""The shipped monitoring files (django_dbqueue/contrib/monitoring): the Prometheus alerting rules
and the Grafana dashboard are well formed, ship in the wheel, and every expression in them names
only metrics that a real exporter (``run_jobqueue --metrics-port``) emits.

The rules are loaded by Prometheus's own ``promtool check rules`` (Debian's ``prometheus``
package, which .ci/run installs; the test says why it skips where it is missing), and checked
here too: their YAML structure as Prometheus loads it, and the metric names of each expression
against a scrape of a real worker that ran jobs that succeeded, failed and died, with a queue
paused."""

import fnmatch
import json
import os
import re
import shutil
import subprocess
import tomllib
import urllib.request
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from django_dbqueue import enqueue, flow
from django_dbqueue.contrib.monitoring import ALERTS, DASHBOARD
from tests.acceptance.helpers import wait_all_in_state
from tests.acceptance.test_metrics import FAST, free_port
from tests.utils import wait_until

REPO = Path(__file__).resolve().parents[2]
DURATION = re.compile(r"^(\d+(ms|s|m|h|d|w|y))+$")
# PromQL words that are not metric names: aggregations, functions, keywords.
NOT_METRICS = {
    "sum", "max", "min", "avg", "count", "rate", "increase", "delta", "irate", "abs",
    "histogram_quantile", "by", "without", "on", "ignoring", "group_left", "group_right",
    "and", "or", "unless", "bool", "offset", "absent", "time", "label_values",
}  # fmt: skip
SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "gauge": ("",),
}


def metric_names(expr):
    """The metric names an expression reads: its identifiers once strings, label matchers,
    ranges and ``by (...)``-style label lists are removed, and calls are left out."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    expr = re.sub(r"\{[^}]*\}", "", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", expr):
        following = expr[match.end() :].lstrip()
        if not following.startswith("(") and match.group() not in NOT_METRICS:
            names.add(match.group())
    return names


def load_rules():
    return yaml.safe_load(ALERTS.read_text())


def load_dashboard():
    return json.loads(DASHBOARD.read_text())


def dashboard_expressions(board):
    exprs = [t["expr"] for p in board["panels"] for t in p["targets"]]
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            exprs.append(variable["definition"].replace("label_values(", "").split(",")[0])
    return exprs


def test_the_metric_name_reader():
    assert metric_names(
        'histogram_quantile(0.95, sum by (le, type) (rate(x_bucket{queue=~"$q"}[5m])))'
    ) == {"x_bucket"}
    assert metric_names('max by (queue) (a{state="due"}) > 0 and on () max(b) == 0') == {"a", "b"}


def test_the_rules_are_what_prometheus_loads():
    rules = load_rules()
    assert set(rules) == {"groups"}
    (group,) = rules["groups"]
    assert group["name"] and set(group) == {"name", "rules"}
    names = [rule["alert"] for rule in group["rules"]]
    assert len(names) == len(set(names))
    assert {
        "DBQueueDeadLettersRising",
        "DBQueueOldestDueJobTooOld",
        "DBQueueWorkerHeartbeatStale",
        "DBQueueNoLiveWorker",
        "DBQueuePausedTooLong",
    } <= set(names)
    for rule in group["rules"]:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule
        assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", rule["alert"])
        assert isinstance(rule["expr"], str) and rule["expr"].strip()
        assert rule["expr"].count("(") == rule["expr"].count(")")
        assert "for" not in rule or DURATION.match(rule["for"]), rule["for"]
        assert rule["labels"]["severity"] in {"warning", "critical"}
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
        assert metric_names(rule["expr"]), rule["alert"]


def test_promtool_loads_the_rules():
    promtool = shutil.which("promtool")
    if promtool is None:
        if os.environ.get("DBQUEUE_REQUIRE_PROMTOOL"):
            pytest.fail("DBQUEUE_REQUIRE_PROMTOOL is set but promtool is not on PATH")
        pytest.skip("promtool is missing: apt-get install prometheus (.ci/run installs it)")
    checked = subprocess.run(
        [promtool, "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    rules = len(load_rules()["groups"][0]["rules"])
    assert f"SUCCESS: {rules} rules found" in checked.stdout, checked.stdout


def test_the_dashboard_is_a_grafana_dashboard():
    board = load_dashboard()
    assert board["title"] and board["uid"] and board["schemaVersion"] >= 36
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in board["templating"]["list"]}
    assert variables == {"datasource", "queue", "type"}
    for panel in board["panels"]:
        assert panel["type"] in {"timeseries", "stat"} and panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}"
        assert set(panel["gridPos"]) == {"x", "y", "w", "h"}
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(refs) == len(set(refs))
        for target in panel["targets"]:
            assert target["expr"].count("(") == target["expr"].count(")")
            assert metric_names(target["expr"]), panel["title"]


def test_the_files_ship_in_the_wheel():
    patterns = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"
    ]["django_dbqueue"]
    package = REPO / "django_dbqueue"
    for path in (ALERTS, DASHBOARD):
        relative = str(path.relative_to(package))
        assert any(fnmatch.fnmatch(relative, pattern) for pattern in patterns), relative


def emitted(port):
    """Every sample name the exporter on ``port`` serves or declares (a family declared with
    no sample yet, such as the cancelled counter before any cancel, counts by its type)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return None
    names = set()
    for family in text_string_to_metric_families(text):
        names.update(family.name + suffix for suffix in SUFFIXES.get(family.type, ("",)))
        names.update(sample.name for sample in family.samples)
    return names


@pytest.mark.acceptance
@pytest.mark.django_db(transaction=True)
def test_every_expression_names_only_metrics_a_real_exporter_emits(settings, start_worker):
    from tests.acceptance.settings_fast import FAST_DBQUEUE

    settings.DBQUEUE = FAST_DBQUEUE
    port = free_port()
    start_worker("--metrics-port", str(port), "--metrics-addr", "127.0.0.1", settings=FAST)
    wait_until(lambda: emitted(port), timeout=20, message="the metrics port")
    jobs = [enqueue("noop").id, enqueue("fail").id]
    wait_all_in_state(jobs[:1], "done", timeout=30)
    wait_all_in_state(jobs[1:], "dead", timeout=30)
    flow.pause_queue("emails", by="test")
    names = wait_until(
        lambda: (
            (n := emitted(port))
            and {"dbqueue_jobs_dead_total", "dbqueue_jobs_failed_total"} <= n
            and n
        ),
        timeout=30,
        message="a scrape after the jobs ended",
    )
    expressions = [rule["expr"] for rule in load_rules()["groups"][0]["rules"]]
    expressions += dashboard_expressions(load_dashboard())
    read = set().union(*(metric_names(expr) for expr in expressions))
    assert read - names == set(), f"not emitted: {sorted(read - names)}"
    # The gauges the rules alert on are all read by some rule, and served.
    assert {
        "dbqueue_jobs_dead_total",
        "dbqueue_queue_oldest_due_seconds",
        "dbqueue_worker_heartbeat_age_seconds",
        "dbqueue_queue_paused_seconds",
    } <= read & names


@pytest.mark.django_db(transaction=True)
def test_the_paused_gauge_is_the_seconds_since_the_pause(settings):
    from django.db import connection

    from django_dbqueue.metrics import TableCollector

    settings.DBQUEUE = {"QUEUES": {"default": {}, "emails": {}}}
    flow.pause_queue("emails", by="test")
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE dbqueue_queue SET changed_at = now() - interval '2 hours' WHERE name = 'emails'"
        )
    collector = TableCollector(cache=0)
    try:
        (family,) = [f for f in collector.collect() if f.name == "dbqueue_queue_paused_seconds"]
    finally:
        collector.close()
    values = {sample.labels["queue"]: sample.value for sample in family.samples}
    assert values["default"] == 0.0
    assert 7200 <= values["emails"] < 7300
    flow.resume_queue("emails", by="test")
