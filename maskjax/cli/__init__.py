"""The command-line programs: `maskjax NAME ...` from an install, `python -m experiments.NAME` from a checkout.

Each program is a module here with a `main(argv) -> int`; `run` gives it the one error policy of every
CLI (bad input one line and exit 2, a bug its traceback). They need the studies' extra
(`pip install "maskjax[studies]"`), which `maskjax.studies` checks on import.
"""

from __future__ import annotations

import importlib
import sys

# The programs, by the name `maskjax NAME` and `python -m experiments.NAME` take.
COMMANDS = {
    "boolean": "the Boolean generalisation-on-the-unseen study",
    "arithmetic": "the low-data arithmetic study",
    "vision": "the ViT study",
    "language": "the small language model study",
    "contrast": "a grid of open x closed mask logits as one batch",
    "discover": "how often the data finds the mask",
    "qk_match": "how well each prior matches its target at init",
    "vision_linear": "the softmax-regression floor of the vision study",
    "language_ngram": "the n-gram floors of the language study",
    "probes": "drift and gradient probes of finished runs",
    "persistence": "whether the mask moved less than each prior, seed for seed",
    "summarize": "one summary of Boolean runs kept in several folders",
    "compare": "whether two sets of runs agree",
    "scale": "the Boolean study across model sizes",
    "audit": "check every results page against its records",
}


def run(command: str, argv: list[str] | None = None) -> int:
    """Run one program with `argv` (None: the process's own arguments)."""
    from maskjax.extras import MissingExtraError, require_studies

    try:
        require_studies(f"maskjax {command}")
    except MissingExtraError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    module = importlib.import_module(f"maskjax.cli.{command}")
    from maskjax.cli.driver import run_main

    return run_main(module.main, argv)


def main(argv: list[str] | None = None) -> int:
    """`maskjax NAME [FLAGS]`: the console script."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        width = max(map(len, COMMANDS))
        listing = "\n".join(f"  {name:<{width}}  {what}" for name, what in COMMANDS.items())
        usage = f"usage: maskjax COMMAND [FLAGS]   (maskjax COMMAND --help for its flags)\n\ncommands:\n{listing}"
        if argv and argv[0] not in ("-h", "--help"):
            print(f"error: unknown command {argv[0]!r}\n\n{usage}", file=sys.stderr)
            return 2
        print(usage, file=sys.stderr if not argv else sys.stdout)
        return 2 if not argv else 0
    return run(argv[0], argv[1:])
