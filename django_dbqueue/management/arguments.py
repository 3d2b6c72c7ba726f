"""Argument types shared by the management commands: a bad value is an argparse usage error
(exit 2 with the usage line) naming the argument and the value."""

import argparse
import ipaddress

from django_dbqueue import validation
from django_dbqueue.conf import get_settings

BIGINT_MAX = 2**63 - 1  # job ids are bigint
MAX_CONCURRENCY = validation.MAX_CONCURRENCY  # handler threads per process (CONCURRENCY too)
MAX_PROCESSES = 256


def whole_number(minimum, what="a whole number", maximum=BIGINT_MAX):
    """An int from ``minimum`` to ``maximum``."""

    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(
                f"must be {'at least 1' if minimum == 1 else f'{minimum} or more'}, got {value}"
            )
        if value > maximum:
            raise argparse.ArgumentTypeError(f"must be at most {maximum}, got {value}")
        return value

    return parse


def positive_seconds(text):
    """A finite float > 0, at most ten years."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, got {text!r}") from None
    if not value <= validation.MAX_SECONDS:  # also inf and NaN
        raise argparse.ArgumentTypeError(
            f"must be a finite number of seconds, at most {validation.MAX_SECONDS}, got {text}"
        )
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be greater than 0, got {text}")
    return value


def _usage(validator):
    """An argparse type from a ``validation`` rule: its message, minus the label argparse adds."""

    def parse(text):
        try:
            return validator(text, "", error=argparse.ArgumentTypeError)
        except argparse.ArgumentTypeError as exc:
            raise argparse.ArgumentTypeError(str(exc).strip()) from None

    return parse


job_type_name = _usage(validation.type_name)
queue_name = _usage(validation.queue_name)
who = _usage(validation.by)  # --by: an undecodable byte arrives as a lone surrogate


def queue_list(text):
    """Comma-separated names of configured queues, at least one."""
    queues = [name.strip() for name in text.split(",") if name.strip()]
    if not queues:
        raise argparse.ArgumentTypeError(f"needs at least one queue name, got {text!r}")
    configured = get_settings().QUEUES
    unknown = [name for name in queues if name not in configured]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"names {', '.join(map(repr, unknown))}, not in DBQUEUE['QUEUES'] "
            f"({', '.join(configured)})"
        )
    return queues


def port_number(text):
    """A TCP port, 1 to 65535."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a port number, got {text!r}") from None
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port from 1 to 65535, got {value}")
    return value


def listen_address(text):
    """A host name or IP address to listen on (``--metrics-addr``): an IP literal, or a name
    that the resolver can be asked for (IDNA-encodable: no label over 63 characters), with no
    NUL and no undecodable byte (argv carries one as a lone surrogate)."""
    if not text:
        raise argparse.ArgumentTypeError(f"must be a host name or an IP address, got {text!r}")
    problem = validation.text_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(f"{validation.shown(text)} {problem}")
    try:
        ipaddress.ip_address(text)
    except ValueError:
        try:
            text.encode("idna")
        except UnicodeError as exc:
            raise argparse.ArgumentTypeError(
                f"{validation.shown(text)} is not a host name or an IP address ({exc})"
            ) from None
    return text
