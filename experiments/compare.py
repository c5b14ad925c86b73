"""python -m experiments.compare: an alias of `maskjax.cli.compare`."""

from experiments import alias

alias(__name__, "compare")
