"""python -m experiments.vision: an alias of `maskjax.cli.vision`."""

from experiments import alias

alias(__name__, "vision")
