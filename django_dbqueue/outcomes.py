"""What a finished attempt leaves behind: the error record kept per failed attempt, and the
handler's return value encoded for the ``result`` column."""

import traceback

from . import payloads


def error_record(exc, *, attempt, worker_id, message=None):
    """The entry kept in the job's ``errors`` list for one failed attempt."""
    return {
        "attempt": attempt,
        "class": f"{type(exc).__module__}.{type(exc).__qualname__}"
        if type(exc).__module__ != "builtins"
        else type(exc).__qualname__,
        "message": message if message is not None else str(exc),
        "traceback": "".join(traceback.format_exception(exc)),
        "worker": worker_id,
    }


class ResultError(TypeError):
    """A handler returned a value that JSON cannot store unchanged."""


def encode_result(result):
    """The handler's return value as JSON text, or ``ResultError`` naming the bad value's path."""
    if result is None:
        return None
    try:
        return payloads.dumps(result, "result")
    except payloads.PayloadError as exc:
        raise ResultError(f"the handler's return value cannot be stored: {exc}") from None
