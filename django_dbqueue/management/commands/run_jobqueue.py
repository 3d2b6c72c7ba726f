import os
import shutil
import sys
import tempfile

from django.core.management.base import BaseCommand, CommandError
from django.db import connections

from django_dbqueue.conf import get_settings
from django_dbqueue.management.arguments import (
    MAX_CONCURRENCY,
    MAX_PROCESSES,
    listen_address,
    port_number,
    positive_seconds,
    queue_list,
    whole_number,
)
from django_dbqueue.management.preflight import queue_database


class Command(BaseCommand):
    help = "Run a django-dbqueue worker: claim jobs from the queue and run their handlers."

    def add_arguments(self, parser):
        parser.add_argument(
            "--queues",
            type=queue_list,
            help="Comma-separated queue names (default: all in DBQUEUE['QUEUES']).",
        )
        parser.add_argument(
            "--concurrency",
            type=whole_number(1, maximum=MAX_CONCURRENCY),
            help=f"Handler threads per process (1 to {MAX_CONCURRENCY}).",
        )
        parser.add_argument(
            "--processes",
            type=whole_number(1, maximum=MAX_PROCESSES),
            default=1,
            help="Worker processes (default 1).",
        )
        parser.add_argument(
            "--poll-interval",
            type=positive_seconds,
            help="Seconds between polls when idle.",
        )
        parser.add_argument(
            "--execution",
            choices=["thread", "process"],
            help="Run handlers in threads, or in child processes that are killed at a job's "
            "timeout (default: DBQUEUE['EXECUTION']).",
        )
        parser.add_argument("--burst", action="store_true", help="Run what is due now, then exit.")
        parser.add_argument(
            "--max-jobs",
            type=whole_number(1),
            help="Exit after claiming this many jobs.",
        )
        parser.add_argument(
            "--on-give-up",
            choices=["restart", "exit"],
            default="restart",
            help="When the worker gives up (handler threads stuck past HUNG_THREAD_LIMIT, a "
            "helper thread died): restart in place, same pid (default), or exit with code 3 for "
            "an external supervisor to restart. Under --processes the supervisor restarts it.",
        )
        parser.add_argument(
            "--metrics-port",
            type=port_number,
            help="Serve Prometheus metrics on this port (needs django-dbqueue[prometheus]).",
        )
        parser.add_argument(
            "--metrics-addr",
            type=listen_address,
            default="0.0.0.0",  # noqa: S104 - a metrics port is meant to be scraped
            help="Address the metrics port binds to (default 0.0.0.0).",
        )

    def handle(self, *args, **options):
        conf = get_settings()
        queues = options["queues"] or list(conf.QUEUES)
        using = queue_database()  # PostgreSQL and migrated, before any thread starts
        # The check's connection would sit idle for the worker's lifetime: a worker holds only
        # the connections it uses (docs/deployment.md, "Database connections").
        connections[using].close()
        worker_kwargs = {
            "queues": queues,
            "concurrency": options["concurrency"] or conf.CONCURRENCY,
            "poll_interval": options["poll_interval"],
            "burst": options["burst"],
            "max_jobs": options["max_jobs"],
            "execution": options["execution"] or conf.EXECUTION,
        }
        # The metrics port first: a missing prometheus-client or a port in use is a usage
        # error, reported before the banner says the worker is starting.
        metrics_dir = metrics_line = None
        if options["metrics_port"] is not None:
            metrics_dir, metrics_line = self._serve_metrics(options)
        settings_dict = connections[using].settings_dict
        where = f"{settings_dict.get('NAME')}@{settings_dict.get('HOST') or 'local socket'}"
        self.stdout.write(
            f"dbqueue starting: queues={','.join(queues)} concurrency={worker_kwargs['concurrency']} "
            f"processes={options['processes']} execution={worker_kwargs['execution']} "
            f"database={using} ({where})" + (" burst" if options["burst"] else "")
        )
        if metrics_line:
            self.stdout.write(metrics_line)
        out = lambda line: self.stdout.write(line)  # noqa: E731
        try:
            self._run(options, worker_kwargs, out)
        finally:
            if metrics_dir is not None:
                shutil.rmtree(metrics_dir, ignore_errors=True)

    def _serve_metrics(self, options):
        """Connect the counters and serve /metrics; returns ``(directory, line)``: a temporary
        multiprocess directory this command created (to remove at exit) or None, and the line
        that says where the metrics are."""
        from django_dbqueue import metrics  # imports no prometheus_client (metrics.py)

        if not metrics.available():
            raise CommandError(f"argument --metrics-port: {metrics.MISSING}")
        created = None
        if options["processes"] > 1 and not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            # prometheus_client picks its multiprocess mode when it is imported.
            if "prometheus_client" in sys.modules:
                raise CommandError(
                    "argument --metrics-port: with --processes, set PROMETHEUS_MULTIPROC_DIR to "
                    "an empty directory (prometheus_client was imported before this command)"
                )
            created = tempfile.mkdtemp(prefix="dbqueue-metrics-")
            os.environ["PROMETHEUS_MULTIPROC_DIR"] = created
        try:
            metrics.serve(options["metrics_port"], addr=options["metrics_addr"])
        except OSError as exc:
            if created is not None:
                shutil.rmtree(created, ignore_errors=True)
            raise CommandError(
                f"argument --metrics-port: cannot listen on "
                f"{options['metrics_addr']}:{options['metrics_port']} ({exc})"
            ) from exc
        metrics.install()  # the counters; forked --processes children inherit the receivers
        return created, (
            f"dbqueue metrics on http://{options['metrics_addr']}:{options['metrics_port']}/metrics"
        )

    def _run(self, options, worker_kwargs, out):
        if options["processes"] > 1:
            from django_dbqueue.supervisor import Supervisor

            code = Supervisor(options["processes"], worker_kwargs, out=out).run()
        else:
            from django_dbqueue import restart
            from django_dbqueue.worker import EXIT_GAVE_UP, Worker

            worker = Worker(**worker_kwargs, worker_id=restart.worker_id(), out=out)
            worker.install_signal_handlers()
            restart.resume(worker, out)
            finite = options["burst"] or options["max_jobs"]
            # Giving up, it stays in the worker registry as "restarting" (shutdown.py).
            worker.restarts_in_place = options["on_give_up"] == "restart" and not finite
            code = worker.run()
            self.stdout.write(
                f"dbqueue stopped: {worker.acks.succeeded} succeeded, {worker.acks.failed} retried, "
                f"{worker.acks.dead} dead"
            )
            if code == EXIT_GAVE_UP and options["on_give_up"] == "restart" and not finite:
                restart.in_place(worker, out)  # returns only if a stop was asked for meanwhile
                code = 0
        if code:
            raise SystemExit(code)
