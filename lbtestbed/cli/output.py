"""What ``lbt`` writes besides its tables: exit codes, one-line messages on stderr, JSON on stdout.

Exit codes: 0 success, 1 the run failed, 2 bad input (spec or arguments), 128 + N ended by signal N.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import Any

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2
EXIT_INTERRUPTED = 130  # Ctrl-C, as a shell reports it

Say = Callable[[str], None]


def say(line: str) -> None:
    """A line the user should read (a warning, what was picked), on stderr as ``lbt: <line>``."""
    print(f"lbt: {line}", file=sys.stderr)


def note(line: str) -> None:
    """A line on stderr as it is (what a command is about to do)."""
    print(line, file=sys.stderr)


def error(message: str, code: int = EXIT_BAD_INPUT) -> int:
    """``lbt: error: <message>`` on stderr; the exit code (bad input unless said otherwise)."""
    print(f"lbt: error: {message}", file=sys.stderr)
    return code


def print_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=1)
    sys.stdout.write("\n")


def stages(quiet: bool) -> Say:
    """Progress lines for long commands (run, sweep): seconds since the start, then what happens now."""
    started = time.monotonic()

    def stage(line: str) -> None:
        if not quiet:
            print(f"[{time.monotonic() - started:6.1f} s] {line}", file=sys.stderr, flush=True)

    return stage
