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


# The studies, whose figures `maskjax.drawing`'s children draw: started before JAX is imported, they
# load matplotlib on a core the parent leaves idle.
STUDIES = ("boolean", "arithmetic", "vision", "language")


def run(command: str, argv: list[str] | None = None) -> int:
    """Run one program with `argv` (None: the process's own arguments), under `driver.run_main`'s error
    policy; a missing `studies` extra is bad input like any other (one line, exit 2)."""
    from maskjax import drawing

    if command in STUDIES:
        drawing.start()
    try:
        from maskjax.cli.driver import run_main
        from maskjax.extras import require_studies

        def main(args: list[str] | None) -> int:
            require_studies(f"maskjax {command}")
            return importlib.import_module(f"maskjax.cli.{command}").main(args)

        return run_main(main, argv)
    finally:
        drawing.stop()


def main(argv: list[str] | None = None) -> int:
    """`maskjax NAME [FLAGS]`: the console script."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in COMMANDS:
        return run(argv[0], argv[1:])
    width = max(map(len, COMMANDS))
    listing = "\n".join(f"  {name:<{width}}  {what}" for name, what in COMMANDS.items())
    usage = f"usage: maskjax COMMAND [FLAGS]   (maskjax COMMAND --help for its flags)\n\ncommands:\n{listing}"
    if argv and argv[0] in ("-h", "--help"):
        print(usage)
        return 0
    print(f"error: unknown command {argv[0]!r}\n\n{usage}" if argv else usage, file=sys.stderr)
    return 2
