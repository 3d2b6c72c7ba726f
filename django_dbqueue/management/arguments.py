"""Argument types shared by the management commands: a bad value is an argparse usage error
(exit 2 with the usage line) naming the argument and the value."""

import argparse


def whole_number(minimum, what="a whole number"):
    """An int >= ``minimum``."""

    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(
                f"must be {'at least 1' if minimum == 1 else f'{minimum} or more'}, got {value}"
            )
        return value

    return parse


def positive_seconds(text):
    """A float > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be greater than 0, got {text}")
    return value


def port_number(text):
    """A TCP port, 1 to 65535."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a port number, got {text!r}") from None
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port from 1 to 65535, got {value}")
    return value
