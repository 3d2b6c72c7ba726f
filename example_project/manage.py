#!/usr/bin/env python
"""Django's command-line utility for the django-dbqueue example shop."""

import os
import sys
from importlib.util import find_spec
from pathlib import Path


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")
    if find_spec("django_dbqueue") is None:
        # Running from a source checkout without `pip install -e .`: use the checkout's package.
        sys.path.append(str(Path(__file__).resolve().parent.parent))
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
