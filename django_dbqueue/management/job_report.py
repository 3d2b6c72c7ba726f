"""``jobqueue_status --job ID``: one job's status and its steps, as lines of text or as JSON.

The text is one ``label: value`` line per field, in a fixed order (every field always printed,
``none`` or ``-`` when empty), then the steps, one line each. A new field is one more entry of
``FIELDS`` (and the same key in the JSON): it adds a line and reformats none of the others. The
steps are bounded like the admin's (``STEPS_SHOWN``, then how many more), and their results are
cut in the database for the text (``RESULT_CHARS``); the JSON carries them whole, decoded.

A row written by hand may hold what Python cannot read back (docs/admin.md): a time outside
Python's years is printed as PostgreSQL writes it, marked ``(out of range)``; JSON Python's json
refuses as ``unreadable: <why>``. The job is printed all the same.
"""

import datetime

from django_dbqueue import decoding, steps, store
from django_dbqueue.exceptions import UnreadableJob

STEPS_SHOWN = 200
RESULT_CHARS = 80  # of a step's result JSON, in the text

# Control characters (a newline in an error message, an escape sequence in a step name, a C1
# control that JSON text leaves as it is) shown as escapes, so that each field stays on its line
# and nothing reaches the terminal raw.
_ESCAPES = {code: repr(chr(code))[1:-1] for code in [*range(32), *range(127, 160)]}


def one_line(text):
    return text.translate(_ESCAPES)


def shorten(text, limit):
    return text if len(text) <= limit else text[: limit - 3] + "..."


def step_label(name, occurrence):
    """``name``, or ``name #n`` for the n-th call of that name in a run (n > 1)."""
    return name if occurrence == 1 else f"{name} #{occurrence}"


def read(using, job_id, *, result_chars=None):
    """``(job, steps_total, steps)`` from the store (``store.job_status``, ``store.job_steps``;
    each step's result as JSON text, cut to ``result_chars`` when given), or None when there is
    no such job."""
    job = store.job_status(using, job_id)
    if job is None:
        return None
    total, steps = store.job_steps(using, job_id, limit=STEPS_SHOWN, chars=result_chars)
    return job, total, steps


def _time(value):
    if value is None:
        return "-"
    if not isinstance(value, datetime.datetime):  # PostgreSQL's text of a time Python cannot show
        return f"{value} (out of range)"
    return value.isoformat(timespec="seconds")


def _iso(value):
    return _time(value) if not isinstance(value, datetime.datetime) else value.isoformat()


def _last_error(job):
    entry = _decode(job["last_error"], "last error")
    if isinstance(entry, str):  # unreadable (or a history written by hand)
        return entry
    if not isinstance(entry, dict):
        return "none" if not entry else str(entry)
    text = f"{entry.get('class', '')}: {entry.get('message', '')}"
    if entry.get("attempt") is not None:
        text += f" (attempt {entry['attempt']})"
    return text


# (label, the field's text): the job's lines, in order.
FIELDS = [
    ("job", lambda job: str(job["id"])),
    ("type", lambda job: job["type"]),
    ("queue", lambda job: job["queue"]),
    ("state", lambda job: job["state"]),
    ("attempts", lambda job: f"{job['attempts']}/{job['max_attempts']}"),
    ("run after", lambda job: _time(job["run_after"])),
    ("worker", lambda job: job["worker_id"] or "-"),
    ("last error", _last_error),
    ("snoozes", lambda job: str(job["snoozes"])),
    ("waiting for", lambda job: steps.waiting_for(job["waiting_for"], _datetime(job["run_after"]))),
]


def lines(job, total, steps):
    """The text: the fields, then ``steps: N`` and one line per shown step (name, the attempt
    that finished it, when, its result cut to ``RESULT_CHARS``), then how many more."""
    out = [f"{label}: {one_line(value(job))}" for label, value in FIELDS]
    if job.get("event_id") is not None:  # a job that a publish made (docs/events.md)
        out.append(f"event: {one_line(job['event'] or '(deleted)')} #{job['event_id']}")
    shown = f" (the first {len(steps)} below)" if total > len(steps) else ""
    out.append(f"steps: {total}{shown}")
    rows = [
        (
            one_line(step_label(name, occurrence)),
            f"attempt {attempt}",
            f"finished {_time(finished_at)}",
            one_line(shorten("null" if result is None else result, RESULT_CHARS)),
        )
        for name, occurrence, attempt, finished_at, result in steps
    ]
    widths = [max((len(row[i]) for row in rows), default=0) for i in range(3)]
    for row in rows:
        out.append("  " + "  ".join([*(row[i].ljust(widths[i]) for i in range(3)), row[3]]))
    if total > len(steps):
        out.append(f"  ... and {total - len(steps)} more")
    return out


def _datetime(value):
    return value if isinstance(value, datetime.datetime) else None


def _decode(text, what):
    """The JSON ``text`` decoded, or ``"unreadable: <why>"`` for what Python's json refuses."""
    try:
        return decoding.json_value(text, what)
    except UnreadableJob as exc:
        return f"unreadable: {exc.reason}"


def as_json(job, total, steps):
    """The same as a JSON object: the job's fields under their column names (times in ISO
    8601, ``last_error`` the last entry of the error history as stored, or null), ``steps_total``
    and ``steps`` (the first ``STEPS_SHOWN``, results decoded)."""
    return {
        **{
            key: value
            for key, value in job.items()
            if key not in ("last_error", "run_after", "event_id", "event")
        },
        # Only for a job that a publish made (docs/events.md).
        **({"event": {"id": job["event_id"], "name": job["event"]}} if job.get("event_id") else {}),
        "run_after": job["run_after"] and _iso(job["run_after"]),
        "last_error": _decode(job["last_error"], "last error"),
        "steps_total": total,
        "steps": [
            {
                "name": name,
                "occurrence": occurrence,
                "attempt": attempt,
                "finished_at": _iso(finished_at),
                "result": _decode(result, "result"),
            }
            for name, occurrence, attempt, finished_at, result in steps
        ],
    }
