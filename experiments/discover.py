"""python -m experiments.discover: an alias of `maskjax.cli.discover`."""

from experiments import alias

alias(__name__, "discover")
