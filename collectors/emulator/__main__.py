"""Entry point: `python3 -m collectors.emulator serve MODEL [flags]` (see `cli`)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from .app import run
from .cli import parse_or_exit


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line (exit 2 if refused) and run the emulator; return its exit status."""
    config = parse_or_exit(sys.argv[1:] if argv is None else argv)
    return run(config)


if __name__ == "__main__":
    sys.exit(main())
