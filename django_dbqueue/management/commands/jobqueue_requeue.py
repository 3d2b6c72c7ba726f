import sys

from django.core.management.base import BaseCommand, CommandError

from django_dbqueue import store, wakeup
from django_dbqueue.conf import get_settings
from django_dbqueue.management.arguments import job_type_name, queue_name, whole_number
from django_dbqueue.management.preflight import queue_database
from django_dbqueue.models import BackgroundJob

BATCH = 1000


class Command(BaseCommand):
    help = (
        "Put dead (or cancelled) jobs back to pending with their attempts reset; errors are kept."
    )

    def add_arguments(self, parser):
        which = parser.add_mutually_exclusive_group(required=True)
        which.add_argument(
            "--dead", action="store_true", help="Every dead job (narrow with --type/--queue)."
        )
        which.add_argument(
            "--ids",
            nargs="+",
            type=whole_number(1, "a job id (a whole number)"),
            metavar="ID",
            help="These jobs (dead or cancelled).",
        )
        parser.add_argument(
            "--type", type=job_type_name, help="Only jobs of this type (with --dead)."
        )
        parser.add_argument(
            "--queue", type=queue_name, help="Only jobs in this queue (with --dead)."
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="Say what would be requeued; change nothing."
        )

    def handle(self, *args, **options):
        conf = get_settings()
        queue_database()
        if options["ids"] and (options["type"] or options["queue"]):
            raise CommandError(
                "--type and --queue narrow --dead; with --ids, list the jobs you mean"
            )
        if options["queue"] is not None and options["queue"] not in conf.QUEUES:
            raise CommandError(
                f"--queue {options['queue']!r} is not in DBQUEUE['QUEUES'] ({', '.join(conf.QUEUES)})"
            )
        if options["ids"]:
            self._by_ids(conf, sorted(set(options["ids"])), options["dry_run"])
        else:
            self._dead(conf, options["type"], options["queue"], options["dry_run"])
        wakeup.flush()  # batches requeued within 5 ms of each other: send the last wake-up too

    def _by_ids(self, conf, ids, dry_run):
        if dry_run:
            eligible = list(
                BackgroundJob.objects.using(conf.DATABASE)
                .filter(id__in=ids, state__in=["dead", "cancelled"])
                .values_list("id", flat=True)
            )
            self.stdout.write(
                f"dry run: would requeue {len(eligible)} of {len(ids)} job(s): {eligible}"
            )
            return
        moved = store.requeue(conf.DATABASE, ids)
        wakeup.jobs_ready(conf.DATABASE, moved.values())
        self.stdout.write(f"requeued {len(moved)} of {len(ids)} job(s)")
        left = sorted(set(ids) - set(moved))
        blocked = store.requeue_blocked(conf.DATABASE, left) if left else []
        for job_id, key, holder, state in blocked:
            self.stderr.write(
                f"left alone: job {job_id}: its unique key {key!r} is held by job {holder} "
                f"({state}); requeue it once that job has finished"
            )
        left = sorted(set(left) - {row[0] for row in blocked})
        if left:
            self.stderr.write(f"left alone (not dead or cancelled, or no such job): {left}")

    def _dead(self, conf, job_type, queue, dry_run):
        total = store.count_dead(conf.DATABASE, job_type=job_type, queue=queue)
        what = (
            "dead job(s)"
            + (f" of type {job_type!r}" if job_type else "")
            + (f" in queue {queue!r}" if queue else "")
        )
        if dry_run or not total:
            self.stdout.write(
                f"{'dry run: would requeue' if dry_run else 'nothing to requeue:'} {total} {what}"
            )
            return
        done, after = 0, 0
        while True:
            ids = store.dead_ids(
                conf.DATABASE, after=after, job_type=job_type, queue=queue, limit=BATCH
            )
            if not ids:
                break
            after = ids[-1]
            moved = store.requeue(conf.DATABASE, ids)
            wakeup.jobs_ready(conf.DATABASE, moved.values())
            done += len(moved)
            self._progress(done, total)
        self.stdout.write(f"requeued {done} {what}")

    def _progress(self, done, total):
        width = 30
        filled = min(width, width * done // max(total, 1))
        line = f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total}"
        if sys.stdout.isatty():
            self.stdout.write("\r" + line, ending="")
            if done >= total:
                self.stdout.write("")
        elif total > BATCH:
            self.stdout.write(line)
