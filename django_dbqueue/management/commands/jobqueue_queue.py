import getpass

from django.core.management.base import BaseCommand, CommandError

from django_dbqueue import flow, validation
from django_dbqueue.conf import get_settings
from django_dbqueue.exceptions import InvalidArgument
from django_dbqueue.management.arguments import queue_name, who
from django_dbqueue.management.preflight import queue_database


class Command(BaseCommand):
    help = (
        "Pause or resume a queue for every worker, or list the queues with their flow state "
        "(paused, jobs running against the fleet-wide limit, rate window)."
    )

    def add_arguments(self, parser):
        parser.add_argument("action", choices=["pause", "resume", "list"])
        parser.add_argument(
            "name", nargs="?", type=queue_name, help="The queue (a key of DBQUEUE['QUEUES'])."
        )
        parser.add_argument(
            "--by",
            default=None,
            type=who,
            help=f"Who, for the record, at most {validation.MAX_BY} characters (default: $USER).",
        )

    def handle(self, *args, action, name, by, **options):
        using = queue_database()
        if action == "list":
            if name is not None:
                raise CommandError("list takes no queue name")
            for line in flow_lines(flow.queue_flows(using)):
                self.stdout.write(line)
            return
        if name is None:
            raise CommandError(f"{action} needs a queue name")
        if name not in get_settings().QUEUES:
            known = ", ".join(sorted(get_settings().QUEUES))
            raise CommandError(f"queue {name!r} is not in DBQUEUE['QUEUES'] (known: {known})")
        if by is None:
            by = f"command:{getpass.getuser()}"[: validation.MAX_BY]
        switch = flow.pause_queue if action == "pause" else flow.resume_queue
        try:
            switch(name, by=by, using=using)
        except InvalidArgument as exc:  # a $USER that PostgreSQL cannot store
            raise CommandError(f"{exc} (pass --by)") from None
        if action == "pause":
            self.stdout.write(f"paused {name}: no worker claims its jobs until it is resumed")
        else:
            self.stdout.write(f"resumed {name}")


def flow_lines(flows):
    """One line per queue: paused or not, running against its limit, its rate window."""
    for q in flows:
        parts = [q.name, "PAUSED" if q.paused else "active"]
        limit = "" if q.global_concurrency is None else f"/{q.global_concurrency}"
        parts.append(f"running {q.running}{limit}")
        if q.rate_limit is not None:
            rate = q.rate_limit
            per = f" per {rate['key']}" if rate["key"] else ""
            parts.append(f"rate {rate['limit']}/{rate['period']:g}s{per}")
            if q.rate_reopens_at is not None:
                parts.append(f"window reopens {q.rate_reopens_at.isoformat()}")
        if q.paused and q.changed_at is not None:
            parts.append(f"since {q.changed_at.isoformat()} by {q.changed_by or '?'}")
        yield "  ".join(parts)
