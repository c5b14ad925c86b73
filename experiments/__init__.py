"""`python -m experiments.NAME` from a checkout: each module here is an alias of the program
`maskjax.cli.NAME` (`maskjax NAME` once installed; `experiments.cli` is `maskjax.cli.driver`)."""

from __future__ import annotations

import importlib
import sys


def alias(name: str, target: str) -> None:
    """Make the module `name` the program `maskjax.cli.<target>`, or run that program when started with -m."""
    if name == "__main__":
        from maskjax.cli import run

        sys.exit(run(target))
    sys.modules[name] = importlib.import_module(f"maskjax.cli.{target}")
