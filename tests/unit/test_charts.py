"""The dashboard's pure parts: percentiles from histogram bins, worker ids, the SVG charts."""

import pytest

from django_dbqueue import charts, dashboard
from django_dbqueue.rollup import WAIT_BOUNDS


def test_percentile_interpolates_inside_the_bin():
    index = WAIT_BOUNDS.index(1.0)  # bin index + 1 is [1.0, 2.5)
    assert dashboard.percentile({index + 1: 10}, 0.5) == pytest.approx(1.75)
    assert dashboard.percentile({0: 50, index + 1: 50}, 0.5) == pytest.approx(0.01)
    assert dashboard.percentile({0: 50, index + 1: 50}, 0.95) == pytest.approx(1.0 + 1.5 * 0.9)
    assert dashboard.percentile({len(WAIT_BOUNDS): 3}, 0.95) == WAIT_BOUNDS[-1]  # open bin
    assert dashboard.percentile({}, 0.5) is None


def test_worker_ids_split_into_host_and_pid():
    assert dashboard.split_worker_id("web-1.example:4242:abc123") == ("web-1.example", "4242")
    assert dashboard.split_worker_id("custom-id") == ("custom-id", "")


@pytest.mark.parametrize(("value", "hours"), [("6", 6), ("24", 24), ("2", 1), ("x", 1), (None, 1)])
def test_hours_outside_the_choices_fall_back_to_one(value, hours):
    assert dashboard.parse_hours(value) == hours


def test_nice_ceiling_and_labels():
    assert [charts.nice_ceiling(v) for v in (0, 0.3, 7, 11, 2400)] == [1, 0.5, 10, 20, 2500]
    assert [charts.number(v) for v in (None, 0.25, 12, 1500, 3e6)] == [
        "-",
        "0.25",
        "12",
        "1.5k",
        "3M",
    ]


def test_charts_are_labelled_and_escape_their_text():
    svg = charts.stacked_bars(
        "c1", "Jobs <done>", [("done", [1, 2]), ("<b>", [0, 3])], ["10:00", "10:01"], unit="jobs"
    )
    assert 'role="img"' in svg and 'aria-labelledby="c1-title c1-desc"' in svg
    assert '<title id="c1-title">Jobs &lt;done&gt;</title>' in svg
    assert "<b>" not in svg and "&lt;b&gt;" in svg
    assert svg.count("<rect") == 3  # zero-height bars are left out
    line = charts.lines("c2", "t", [("p50", [None, 2.0, None])], ["a", "b", "c"], unit="s")
    assert line.count("<circle") == 1 and 'd="M' in line
    bars = charts.horizontal_bars("c3", "t", [], names=["dead"], unit="jobs")
    assert "No failures in this window." in bars
