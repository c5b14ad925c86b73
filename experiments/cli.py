"""What every experiment CLI shares: one-line errors, seed parsing, output folders, progress."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable


class UserError(Exception):
    """Bad input from the command line: reported in one line, exit code 2."""


class Parser(argparse.ArgumentParser):
    """argparse that reports a bad flag in one line instead of a usage block."""

    def error(self, message: str) -> None:
        raise UserError(message)


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def name_list(text: str) -> list[str]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names:
        raise argparse.ArgumentTypeError("expected a comma-separated list of names")
    return names


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run_main(main: Callable[[list[str] | None], int], argv: list[str] | None = None) -> int:
    """Run a CLI body; bad input becomes `error: ...` on stderr and exit 2, never a traceback."""
    try:
        return main(argv)
    except (UserError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: results written so far are kept", file=sys.stderr)
        return 130
