#!/usr/bin/env python
"""Every benchmark row, on an earlier commit and on this tree, in one invocation, as one table.

    python benchmarks/every_row.py --ref 7418734 [--rounds 2] [--quick] [--markdown FILE]

The rows: the drain of the real ``run_jobqueue`` (``drain_command.py``: jobs/s, against the
batch-100 psycopg loop, connections per worker process), the in-process drain, single-producer
enqueue and the idle wake-up p50/p99 (``bench.py``), 8-producer enqueue and the wake-up p50/p99
idle and under load (``fleet.py``), the drain of a small project's ``run_jobqueue`` by wall clock
while ``enqueue_many()`` fills its queue and after (``drain_project.py``, issue 37's second
harness: jobs/s, server and worker CPU per job, against the seed's batch-10 loop), and with 20
idle worker processes, as separate processes and as one group (``idle_fleet.py``): claims per
job, connections per worker process, CPU per idle minute and how long the trickle's jobs waited
to start.

Each script runs on both sides through ``against.py``'s worktree (``against.ref_tree``: the
ref's package with today's ``benchmarks/``, one venv, a database per side and script), the
sides alternating round by round (the ref first in odd rounds). Every script writes its figures
with ``--json``; a run's whole output goes to a log in ``--log-dir``.

The table gives, per row, each side's median and [min..max] over all its runs (``--rounds`` x
the script's own repeats), the ratio of the medians (this tree / ref) and a verdict: "slower
beyond spread" when every run of this tree is worse than every run of the ref (the two spreads
do not overlap), "faster" when every run is better, else "within spread". Rows that count
(connections, claims, CPU) say "more beyond spread" / "fewer" / "less". A side with a single
run has no spread: its verdict is "1 run". The exit status is 1 when a row is worse beyond the
spread or a run failed.

``--quick`` runs small sizes (about 3 minutes on 2 cores): for checking the script, not for
figures. The default sizes take about 20-25 minutes.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks import against  # noqa: E402 - after the path set-up above

# --------------------------------------------------------------------------------------------
# The rows, and how each is read from its script's --json
# --------------------------------------------------------------------------------------------
SLOWER, FASTER = "slower beyond spread", "faster"
MORE, FEWER, LESS = "more beyond spread", "fewer", "less"
WITHIN = "within spread"


@dataclass(frozen=True)
class Row:
    title: str
    unit: str
    higher_is_better: bool
    worse: str = SLOWER
    better: str = FASTER


def rate(title, unit):
    return Row(title, unit, True)


def ratio(title):
    return Row(title, "x", True)


def latency(title):
    return Row(title, "ms", False)


def count(title):
    return Row(title, "", False, MORE, FEWER)


def paired(a_list, b_list):
    """Ratios of runs paired within one repeat (both sides met the same machine)."""
    if len(a_list) != len(b_list):
        return []
    return [a / b for a, b in zip(a_list, b_list, strict=True) if b]


def drain_rows(data):
    """``drain_command.py --json``: per side, a list of runs."""
    command = [r["jobs_per_s"] for r in data["command"]]
    return {
        rate("drain, run_jobqueue", "jobs/s"): command,
        ratio("drain, run_jobqueue / batch-100 loop"): paired(
            command, [r["jobs_per_s"] for r in data["batch-100"]]
        ),
        count("connections per run_jobqueue process"): [r["connections"] for r in data["command"]],
    }


def bench_rows(data):
    """``bench.py --json``: the runs, each with a result per side; invalid runs are left out."""
    runs = [r for r in data["runs"] if "invalid" not in r]

    def of(workload, side, key):
        return [r[side][key] for r in runs if r["workload"] == workload]

    return {
        rate("drain, in-process burst Worker", "jobs/s"): of("drain", "ours", "value"),
        rate("enqueue, 1 producer", "tx/s"): of("enqueue", "ours", "value"),
        ratio("enqueue, 1 producer / django-bare"): paired(
            of("enqueue", "ours", "value"), of("enqueue", "django-bare", "value")
        ),
        latency("wake-up idle p50 (bench.py)"): of("wakeup", "ours", "p50"),
        latency("wake-up idle p99 (bench.py)"): of("wakeup", "ours", "p99"),
    }


def fleet_rows(data):
    """``fleet.py --json``: ``enqueue`` runs keyed by side, ``wakeup`` runs idle/loaded."""
    enqueue, wakeup = data.get("enqueue") or [], data.get("wakeup") or []
    producers = data["args"]["producers"]
    ours = [r["ours"]["tx_s"] for r in enqueue if "ours" in r]
    bare = [r["django-bare"]["tx_s"] for r in enqueue if "django-bare" in r]
    out = {
        rate(f"enqueue, {producers} producers", "tx/s"): ours,
        ratio(f"enqueue, {producers} producers / django-bare"): paired(ours, bare),
    }
    for label, what in (("idle", "idle"), ("loaded", "under load")):
        for q in ("p50", "p99"):
            out[latency(f"wake-up {what} {q} (fleet.py)")] = [r[label][f"{q}_ms"] for r in wakeup]
    return out


def idle_rows(data):
    """``idle_fleet.py --json``: one result per mode."""
    workers = data["args"]["workers"]
    out = {}
    for r in data["modes"]:
        how = "separate processes" if r["mode"] == "separate" else "one group"
        fleet = f"{workers} idle workers, {how}"
        out[count(f"claims per job, {fleet}")] = [r["claims_per_job"]]
        out[count(f"connections per worker process, {fleet}")] = [r["per_process"]]
        out[Row(f"CPU s per idle minute, {fleet}", "s", False, MORE, LESS)] = [
            r["cpu_per_idle_minute"]
        ]
        out[latency(f"trickle start p50, {fleet}")] = [r["wait_p50_ms"]]
        out[latency(f"trickle start p99, {fleet}")] = [r["wait_p99_ms"]]
    return out


def project_rows(data):
    """``drain_project.py --json``: issue 37's second harness, a project's ``run_jobqueue``
    running while ``enqueue_many()`` fills (variant ``during``) and started after the fill
    (``after``), by wall clock; the CPU per job of its server backends and of its own process
    during the fill; and the drain during the fill over the seed's batch-10 loop of the same
    repeat (issue 37's goal: at least 1)."""

    def of(variant, side, key):
        return [r[key] for r in data["runs"] if r["variant"] == variant and r["side"] == side]

    def cpu(title):
        return Row(title, "us", False, MORE, LESS)

    during = of("during", "command", "jobs_per_s")
    return {
        rate("drain, project's run_jobqueue while enqueue_many() fills", "jobs/s"): during,
        rate("drain, project's run_jobqueue started after the fill", "jobs/s"): of(
            "after", "command", "jobs_per_s"
        ),
        cpu("server CPU per job, run_jobqueue while enqueue_many() fills"): of(
            "during", "command", "server_us"
        ),
        cpu("worker CPU per job, run_jobqueue while enqueue_many() fills"): of(
            "during", "command", "client_us"
        ),
        ratio("drain while enqueue_many() fills / seed's batch-10 loop"): paired(
            during, of("during", "seed-10", "jobs_per_s")
        ),
    }


@dataclass
class Suite:
    name: str
    script: str
    default: str  # the script's arguments at the default sizes
    quick: str  # ... and with --quick
    rows: object  # callable: the script's JSON -> {Row: [values]}


SUITES = [
    Suite(
        "drain",
        "benchmarks/drain_command.py",
        "--jobs 20000 --repeat 2",
        "--jobs 3000 --repeat 1",
        drain_rows,
    ),
    Suite(
        "bench",
        "benchmarks/bench.py",
        "--only drain,enqueue,wakeup --jobs 20000 --enqueues 3000 --wakeups 200 --repeat 2",
        "--only drain,enqueue,wakeup --jobs 3000 --enqueues 300 --wakeups 20 --repeat 1",
        bench_rows,
    ),
    Suite(
        "fleet",
        "benchmarks/fleet.py",
        "--only enqueue,wakeup --sides ours,django-bare --producers 8 --seconds 5 --wakeups 200"
        " --repeat 2",
        "--only enqueue,wakeup --sides ours,django-bare --producers 4 --seconds 1 --wakeups 20"
        " --repeat 1",
        fleet_rows,
    ),
    Suite(
        "project",
        "benchmarks/drain_project.py",
        "--jobs 20000 --repeat 2 --sides command,seed-10 --variant during= --variant after=--start=after",
        "--jobs 3000 --repeat 1 --sides command,seed-10 --variant during= --variant after=--start=after",
        project_rows,
    ),
    Suite(
        "idle",
        "benchmarks/idle_fleet.py",
        "--workers 20 --jobs 200 --idle 10 --drain 0",
        "--workers 4 --jobs 20 --idle 2 --drain 0",
        idle_rows,
    ),
]


# --------------------------------------------------------------------------------------------
# The verdict and the table (pure: tests/unit/test_every_row.py)
# --------------------------------------------------------------------------------------------
def verdict(row, ref, this):
    """Whether ``this`` tree's runs are worse than the ref's beyond the spread of identical
    runs: every run of one side worse (or better) than every run of the other."""
    if not ref or not this:
        return "no figure"
    if len(ref) < 2 or len(this) < 2:
        return "1 run"
    if row.higher_is_better:
        worse, better = max(this) < min(ref), min(this) > max(ref)
    else:
        worse, better = min(this) > max(ref), max(this) < min(ref)
    return row.worse if worse else row.better if better else WITHIN


def fmt(value, unit):
    if unit in ("jobs/s", "tx/s"):
        return f"{value:,.0f}"
    if unit in ("ms", "s"):
        return f"{value:,.3f}"
    return f"{value:,.2f}"  # ratios, connections and claims per worker or job


def figure(values, unit):
    if not values:
        return "-"
    text = fmt(statistics.median(values), unit)
    if len(values) > 1:
        text += f" [{fmt(min(values), unit)}..{fmt(max(values), unit)}]"
    return text


def table(figures):
    """``figures``: {Row: {"ref": [...], "this": [...]}}, in row order -> rows of cells."""
    lines = []
    for row, sides in figures.items():
        ref, this = sides.get("ref", []), sides.get("this", [])
        ratio = (
            f"{statistics.median(this) / statistics.median(ref):.2f}x"
            if ref and this and statistics.median(ref)
            else "-"
        )
        lines.append(
            [
                row.title,
                row.unit,
                "higher" if row.higher_is_better else "lower",
                figure(ref, row.unit),
                figure(this, row.unit),
                ratio,
                verdict(row, ref, this),
            ]
        )
    return lines


HEADER = ["row", "unit", "better", "ref", "this tree", "ratio", "verdict"]


def text_table(lines):
    widths = [max(len(line[i]) for line in [HEADER, *lines]) for i in range(len(HEADER))]
    out = []
    for line in [HEADER, *lines]:
        cells = [
            cell.rjust(width) if i in (3, 4, 5) else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(line, widths, strict=True))
        ]
        out.append("  ".join(cells).rstrip())
    return "\n".join(out)


def markdown_table(lines):
    out = ["| " + " | ".join(HEADER) + " |", "|" + "|".join(["---"] * len(HEADER)) + "|"]
    out += ["| " + " | ".join(line) + " |" for line in lines]
    return "\n".join(out)


def worse_rows(lines):
    return [line[0] for line in lines if line[-1] in (SLOWER, MORE)]


# --------------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------------
def git(*args):
    out = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=False)
    return out.stdout.strip()


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ref", required=True, help="the earlier commit, tag or branch")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each script per side")
    parser.add_argument("--quick", action="store_true", help="small sizes: checks the script")
    parser.add_argument(
        "--only",
        default=",".join(s.name for s in SUITES),
        help="scripts: drain,bench,fleet,project,idle",
    )
    parser.add_argument("--markdown", metavar="FILE", help="also write the table as markdown")
    parser.add_argument("--json", metavar="FILE", help="also write every figure as JSON")
    parser.add_argument("--log-dir", help="each run's output and JSON (default: a new temp dir)")
    parser.add_argument(
        "--database", default="dbqueue_every_row", help="prefix of the databases (one per side)"
    )
    args = parser.parse_args(argv)
    names = {s.name for s in SUITES}
    args.only = [n.strip() for n in args.only.split(",") if n.strip()]
    if not args.only or set(args.only) - names:
        parser.error(f"--only: choose among {sorted(names)}")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    args.commit = against.resolve(args.ref)
    if args.commit is None:
        parser.error(f"--ref {args.ref!r} is not a commit of this repository")
    return args


def run_all(args, suites, logdir):
    """Every suite on both sides, ``args.rounds`` times; returns ({row: {side: values}},
    failures)."""
    figures, failures = {}, []
    with against.ref_tree(args.commit) as tree:
        # The ref's databases are named after its commit: one migrated by another ref's newer
        # migrations would keep their functions and triggers, which this ref's code never had.
        sides = [("ref", tree, f"_ref_{args.commit[:7]}"), ("this", REPO, "")]
        for round_ in range(args.rounds):
            for suite in suites:
                for side, root, suffix in sides if round_ % 2 == 0 else sides[::-1]:
                    stem = logdir / f"{suite.name}-{side}-{round_ + 1}"
                    json_path = stem.with_suffix(".json")
                    json_path.unlink(missing_ok=True)
                    script_args = (suite.quick if args.quick else suite.default).split()
                    script_args += ["--json", str(json_path)]
                    started = time.monotonic()
                    rc = against.run_side(
                        f"round {round_ + 1}, {side}",
                        root,
                        suite.script,
                        script_args,
                        f"{args.database}_{suite.name}{suffix}",
                        log=stem.with_suffix(".log"),
                    )
                    took = time.monotonic() - started
                    status = "ok" if rc == 0 else f"exit {rc}"
                    try:
                        rows = suite.rows(json.loads(json_path.read_text()))
                    except (OSError, ValueError, KeyError, TypeError) as exc:
                        rows, status = {}, f"{status}; no figures ({exc!r})"
                    if rc != 0 or not any(rows.values()):
                        failures.append(f"{stem.name}: {status} (see {stem}.log)")
                    for row, values in rows.items():
                        figures.setdefault(row, {}).setdefault(side, []).extend(values)
                    print(
                        f"[round {round_ + 1}/{args.rounds}] {suite.name:6} {side:4} "
                        f"{took:6.0f} s  {status}",
                        flush=True,
                    )
    return figures, failures


def main(argv=None):
    args = parse_args(argv)
    suites = [s for s in SUITES if s.name in args.only]
    logdir = Path(args.log_dir or tempfile.mkdtemp(prefix="dbqueue-every-row-")).resolve()
    logdir.mkdir(parents=True, exist_ok=True)
    head = git("rev-parse", "--short", "HEAD") + (
        " (dirty)" if git("status", "--porcelain") else ""
    )
    started_at = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    load_start = [round(x, 2) for x in os.getloadavg()]
    print(
        f"ref {args.commit[:10]} against this tree {head}; rounds {args.rounds}"
        f"{', quick sizes' if args.quick else ''}; logs and JSON in {logdir}",
        flush=True,
    )
    t0 = time.monotonic()
    figures, failures = run_all(args, suites, logdir)
    minutes = (time.monotonic() - t0) / 60
    load_end = [round(x, 2) for x in os.getloadavg()]
    lines = table(figures)
    command = "python benchmarks/every_row.py " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    facts = (
        f"ref {args.commit[:10]} vs this tree {head}, {started_at}, {minutes:.1f} min; "
        f"{os.cpu_count()} CPUs, load average {load_start} at the start, {load_end} at the end"
    )
    rule = (
        "ref, this tree: the median [min..max] over every run of that side (the rounds times the "
        "script's own repeats); ratio: this tree / ref, of the medians; verdict: worse (or "
        "better) beyond spread when every run of this tree is worse (better) than every run of "
        "the ref, so that the spreads of identical runs do not overlap."
    )
    print()
    print(facts)
    print(text_table(lines))
    print(rule)
    sizes = "\n".join(f"- `{s.script} {s.quick if args.quick else s.default}`" for s in suites)
    if args.markdown:
        Path(args.markdown).write_text(
            f"`{command}`\n\n{facts}.\n\n{markdown_table(lines)}\n\n{rule}\n\n"
            f"Each side ran, {args.rounds} time(s):\n\n{sizes}\n"
        )
        print(f"wrote {args.markdown}")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "ref": args.commit,
                    "this": head,
                    "figures": {row.title: sides for row, sides in figures.items()},
                },
                indent=2,
            )
            + "\n"
        )
        print(f"wrote {args.json}")
    for failure in failures:
        print(f"FAILED {failure}")
    worse = worse_rows(lines)
    if worse:
        print("worse beyond the spread: " + "; ".join(worse))
    return 1 if failures or worse else 0


if __name__ == "__main__":
    sys.exit(main())
