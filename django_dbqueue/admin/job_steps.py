"""The job page's Steps section: the steps the job recorded (``ctx.step``, docs/steps.md), read
only, bounded.

Each row: the step's name (with ``#n`` for the n-th call of a name in a run), the attempt whose
run finished it, when, and its result as JSON cut to ``RESULT_CHARS``. A recorded step is a
finished one (a step that raised records nothing), and so is a durable wait's record
(``sleep:<name>``, ``signal:<name>``: when the wait began and until when it lasts). At most
``STEPS_SHOWN`` rows, in the order they finished; the section says how many more there are. One
statement (``store.job_steps``), which cuts the results in the database, so neither a job of
10,000 steps nor one of huge results makes a large page.
"""

from django.utils import timezone
from django.utils.html import format_html, format_html_join

from .. import store
from ..conf import get_settings
from .common import shorten

STEPS_SHOWN = 200
RESULT_CHARS = 200


def step_label(name, occurrence):
    """``name``, or ``name #n`` for the n-th call of that name in a run (n > 1)."""
    return name if occurrence == 1 else f"{name} #{occurrence}"


def _when(finished_at):
    if isinstance(finished_at, str):  # PostgreSQL's text of a time Python cannot show
        return f"{finished_at} (out of range)"
    return timezone.localtime(finished_at).strftime("%Y-%m-%d %H:%M:%S")


def steps_html(job_id):
    total, rows = store.job_steps(
        get_settings().DATABASE, job_id, limit=STEPS_SHOWN, chars=RESULT_CHARS + 1
    )
    if not total:
        return "none recorded"
    table = format_html(
        '<table class="dbqueue-steps"><thead><tr><th>step</th><th>attempt</th>'
        "<th>finished at</th><th>result</th></tr></thead><tbody>{}</tbody></table>",
        format_html_join(
            "",
            '<tr><td>{}</td><td>{}</td><td>{}</td><td><code style="overflow-wrap: anywhere">{}</code>'
            "</td></tr>",
            (
                (
                    step_label(name, occurrence),
                    attempt,
                    _when(finished_at),
                    shorten("null" if result is None else result, RESULT_CHARS),
                )
                for name, occurrence, attempt, finished_at, result in rows
            ),
        ),
    )
    if total == len(rows):
        return table
    return format_html(
        '{}<p class="dbqueue-steps-more">and {} more: the first {} of {} are shown, in the '
        "order they finished</p>",
        table,
        f"{total - len(rows):,}",
        f"{len(rows):,}",
        f"{total:,}",
    )
