"""Job types of benchmarks/waits.py: one snooze, one durable sleep, one wait for a signal, each
then done. Imported by jobs.py, so the worker process discovers them."""

from django_dbqueue import job

SNOOZED = set()  # ids of the jobs this process has snoozed (the benchmark runs one worker)


@job("bench-snooze-once")
def snooze_once(ctx):
    """Snoozes for no time on its first run, then is done: a snooze-and-resume cycle."""
    if ctx.id not in SNOOZED:
        SNOOZED.add(ctx.id)
        return ctx.snooze(0)
    return None


@job("bench-sleep-once")
def sleep_once(ctx):
    """A durable sleep of 1 ms: the first run records it and ends, the second replays it."""
    ctx.sleep("nap", 0.001)


@job("bench-signal-once")
def signal_once(ctx):
    """Waits for the signal "go", then is done."""
    ctx.wait_for_signal("go")
