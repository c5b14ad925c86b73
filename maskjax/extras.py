"""The studies' optional dependencies, and the one line a user gets when they are not installed.

`pip install maskjax` brings only what the drop-in needs (jax, flax, optax, numpy); the studies, their
CLIs and figures need the `studies` extra.
"""

from __future__ import annotations

import importlib.util

from maskjax.errors import ConfigError

# Import name -> distribution, for the modules the `studies` extra installs.
STUDIES = {
    "matplotlib": "matplotlib",
    "scipy": "scipy",
    "orbax": "orbax-checkpoint",
    "PIL": "pillow",
    "tokenizers": "tokenizers",
}


class MissingExtraError(ConfigError, ModuleNotFoundError):
    """An optional dependency is not installed: the CLIs print it in one line (exit 2)."""


def require_studies(what: str) -> None:
    """Raise MissingExtraError naming the extra to install when any of the studies' modules is missing."""
    missing = [dist for name, dist in STUDIES.items() if importlib.util.find_spec(name) is None]
    if missing:
        raise MissingExtraError(f'{what} needs {", ".join(missing)}: pip install "maskjax[studies]"')
