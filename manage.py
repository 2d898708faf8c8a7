#!/usr/bin/env python3
"""Django's command-line utility for SparkOps.

The settings are loaded before any command runs, so that a malformed environment value (say
``SPARKOPS_COLLECT_INTERVAL=5s``) stops the command with one line naming the variable and exit
status 1, not with a traceback from deep inside the first command that reads a setting (for
``bin/sparkops start``, ``migrate``).
"""

import os
import sys


def load_settings() -> None:
    """Import the settings; a bad value in the environment exits with one line on stderr."""
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured

    try:
        settings.INSTALLED_APPS  # noqa: B018 - the first read imports the settings module
    except ImproperlyConfigured as error:
        sys.exit(f"sparkops: {error}")
    except ValueError as error:
        # dj_database_url refuses an unknown scheme with a ValueError of its own; its message
        # names the scheme, never the URL's password.
        if type(error).__module__.startswith("dj_database_url"):
            sys.exit(f"sparkops: DATABASE_URL: {error}")
        raise


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "sparkops.settings")
    load_settings()
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
