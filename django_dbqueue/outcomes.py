"""What a finished attempt leaves behind: the error record kept per failed attempt, and the
handler's return value encoded for the ``result`` column."""

import traceback

from . import payloads


def _text(text):
    """Text jsonb can hold, written so a reader sees what was there: a NUL as ``\\x00``, a lone
    surrogate (an undecodable byte a handler's message carries, such as a file name read with
    surrogateescape) as ``\\udcff``. jsonb refuses both, and the failure, with its error, would
    never be recorded. A runaway traceback is cut short, so as not to bloat the row."""
    text = text.replace("\x00", "\\x00")
    if not text.isascii():
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 20] + "\n... (truncated)"


text_for_record = _text  # a delivery's error text follows the same rules


def _describe(exc):
    try:
        return str(exc)
    except Exception:  # an exception whose __str__ raises must still be recorded
        return f"<unprintable {type(exc).__name__}>"


def error_record(exc, *, attempt, worker_id, message=None):
    """The entry kept in the job's ``errors`` list for one failed attempt."""
    cls = type(exc)
    try:
        trace = "".join(traceback.format_exception(exc))
    except Exception:
        trace = ""
    return {
        "attempt": attempt,
        "class": _text(
            cls.__qualname__
            if cls.__module__ == "builtins"
            else f"{cls.__module__}.{cls.__qualname__}"
        ),
        "message": _text(message if message is not None else _describe(exc)),
        "traceback": _text(trace),
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


MAX_DELAY = 30 * 86400.0  # seconds: the longest retry delay a handler or a backoff may ask for
MAX_TEXT = 20_000  # characters of a message or traceback kept per attempt


def clamp_delay(delay):
    """A retry delay PostgreSQL's interval arithmetic accepts: finite, 0 to 30 days."""
    try:
        delay = float(delay)
    except (TypeError, ValueError):
        return 60.0
    if delay != delay:  # NaN
        return 60.0
    return min(max(delay, 0.0), MAX_DELAY)
