import json

from django.core.management.base import BaseCommand, CommandError

from django_dbqueue import flow, presence, scheduler, store
from django_dbqueue.conf import get_settings
from django_dbqueue.management import job_report
from django_dbqueue.management.arguments import positive_seconds, whole_number
from django_dbqueue.management.commands.jobqueue_queue import flow_lines
from django_dbqueue.management.preflight import queue_database


class Command(BaseCommand):
    help = (
        "Print the queue's health: counts per queue and state, the oldest due job's age, stuck "
        "and dead jobs, the live workers. Exits 1 when a --fail-on threshold is crossed, for cron and health probes. "
        "With --job ID, print one job instead: its state, attempts, last error and steps."
    )

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true", help="Print JSON instead of a table.")
        parser.add_argument(
            "--job",
            type=whole_number(1, "a job id (a whole number)"),
            metavar="ID",
            help="Print this job (state, attempts, run_after, worker, last error, its steps) "
            "instead of the queue's health.",
        )
        parser.add_argument(
            "--fail-on-dead",
            type=whole_number(0),
            metavar="N",
            help="Exit 1 when more than N jobs are dead (0: any dead job fails).",
        )
        parser.add_argument(
            "--fail-on-stuck",
            action="store_true",
            help="Exit 1 when any running job is past its lease (its worker died or hung).",
        )
        parser.add_argument(
            "--fail-on-oldest-pending",
            type=positive_seconds,
            metavar="SECONDS",
            help="Exit 1 when a due job has waited longer than SECONDS.",
        )

    def handle(self, *args, **options):
        conf = get_settings()
        using = queue_database()
        if options["job"] is not None:
            self._job(using, options)
            return
        per_queue = store.status(using, conf.QUEUES)
        totals = {
            key: sum(q[key] for q in per_queue.values())
            for key in ("pending", "scheduled", "waiting", "running", "stuck", "dead")
        }
        ages = [
            q["oldest_due_seconds"]
            for q in per_queue.values()
            if q["oldest_due_seconds"] is not None
        ]
        totals["oldest_due_seconds"] = max(ages) if ages else None

        failures = []
        if options["fail_on_dead"] is not None and totals["dead"] > options["fail_on_dead"]:
            failures.append(f"{totals['dead']} dead jobs (threshold {options['fail_on_dead']})")
        if options["fail_on_stuck"] and totals["stuck"]:
            failures.append(f"{totals['stuck']} stuck jobs (running past their lease)")
        limit = options["fail_on_oldest_pending"]
        if limit is not None and (totals["oldest_due_seconds"] or 0) > limit:
            failures.append(
                f"oldest due job waited {totals['oldest_due_seconds']:.0f}s (threshold {limit:g}s)"
            )

        schedule_rows = [
            {
                **row,
                "last_tick": row["last_tick"] and row["last_tick"].isoformat(),
                "next_tick": row["next_tick"] and row["next_tick"].isoformat(),
            }
            for row in scheduler.status(using)
        ]
        flows = flow.queue_flows(using)
        types = flow.type_flows(using)
        workers = presence.live_workers(using)
        if options["json"]:
            report = {
                "flow": {
                    "queues": {
                        q.name: {
                            "paused": q.paused,
                            "running": q.running,
                            "global_concurrency": q.global_concurrency,
                            "rate_limit": q.rate_limit,
                            "rate_reopens_at": q.rate_reopens_at and q.rate_reopens_at.isoformat(),
                        }
                        for q in flows
                    },
                    "types": {
                        name: {
                            "running": running,
                            "global_concurrency": conc,
                            "rate_limit": rate,
                            "rate_reopens_at": reopens and reopens.isoformat(),
                        }
                        for name, running, conc, rate, reopens in types
                    },
                },
                "queues": per_queue,
                "totals": totals,
                "schedules": schedule_rows,
                "workers": [worker.as_json() for worker in workers],
                "failures": failures,
            }
            self.stdout.write(json.dumps(report, indent=2, sort_keys=True))
        else:
            self._table(per_queue, totals)
            for q in flows:
                if q.paused or q.global_concurrency is not None or q.rate_limit is not None:
                    self.stdout.write("flow " + next(flow_lines([q])))
            for name, running, conc, rate, reopens in types:
                limit = "" if conc is None else f"/{conc}"
                line = f"flow type {name}: running {running}{limit}"
                if rate is not None:
                    line += f", rate {rate['limit']}/{rate['period']:g}s"
                if reopens is not None:
                    line += f", window reopens {reopens.isoformat()}"
                self.stdout.write(line)
            for row in schedule_rows:
                self.stdout.write(schedule_line(row))
            self._workers(workers, conf.HEARTBEAT_INTERVAL)
            for failure in failures:
                self.stderr.write(f"FAIL: {failure}")
            if not failures:
                self.stdout.write("OK")
        if failures:
            raise SystemExit(1)

    def _job(self, using, options):
        checks = [
            flag
            for flag, given in (
                ("--fail-on-dead", options["fail_on_dead"] is not None),
                ("--fail-on-stuck", options["fail_on_stuck"]),
                ("--fail-on-oldest-pending", options["fail_on_oldest_pending"] is not None),
            )
            if given
        ]
        if checks:
            raise CommandError(
                f"--job prints one job and checks no threshold; {', '.join(checks)} "
                f"{'checks' if len(checks) == 1 else 'check'} the whole queue without --job"
            )
        job_id = options["job"]
        found = job_report.read(
            using, job_id, result_chars=None if options["json"] else job_report.RESULT_CHARS + 1
        )
        if found is None:
            raise CommandError(
                f"--job {job_id}: no such job (it was never enqueued, or it finished and was "
                "deleted, by retention or by hand)"
            )
        if options["json"]:
            self.stdout.write(json.dumps(job_report.as_json(*found), indent=2, sort_keys=True))
        else:
            for line in job_report.lines(*found):
                self.stdout.write(line)

    def _table(self, per_queue, totals):
        header = (
            "queue",
            "pending",
            "scheduled",
            "waiting",
            "running",
            "stuck",
            "dead",
            "oldest due",
        )
        rows = [header]
        for name, q in [*sorted(per_queue.items()), ("TOTAL", totals)]:
            age = "-" if q["oldest_due_seconds"] is None else f"{q['oldest_due_seconds']:.0f}s"
            counts = [q[key] for key in ("pending", "scheduled", "waiting", "running", "stuck")]
            rows.append((name, *counts, q["dead"], age))
        widths = [max(len(str(row[i])) for row in rows) for i in range(len(header))]
        for row in rows:
            self.stdout.write(
                "  ".join(
                    str(v).rjust(w) if i else str(v).ljust(w)
                    for i, (v, w) in enumerate(zip(row, widths, strict=True))
                )
            )

    def _workers(self, workers, heartbeat_interval):
        if not workers:
            self.stdout.write(
                "workers: none has sent a heartbeat in the last "
                f"{presence.expire_after(heartbeat_interval):g}s"
            )
        for w in workers:
            group = "" if w.group_pid is None else f" in the --processes group of pid {w.group_pid}"
            self.stdout.write(
                f"worker {w.worker_id}: {w.status}, host {w.host} pid {w.pid}{group}, queues "
                f"{','.join(w.queues)}, concurrency {w.concurrency} ({w.execution}), "
                f"{w.running} running, heartbeat {w.heartbeat_age:.0f}s ago, started "
                f"{w.started_at.isoformat(timespec='seconds')}, version {w.version}"
            )


def schedule_line(row):
    """``schedule <name>: last tick <when or never>, next tick <when or none>`` (stored entries
    say so, and why they do not tick when disabled or invalid)."""
    if row["error"]:
        upcoming = f"none (ignored: {row['error']})"
    elif not row["enabled"]:
        upcoming = "none (disabled)"
    else:
        upcoming = row["next_tick"] or "none"
    stored = " (database)" if row["source"] == "database" else ""
    return (
        f"schedule {row['name']}{stored}: last tick {row['last_tick'] or 'never'}, "
        f"next tick {upcoming}"
    )
