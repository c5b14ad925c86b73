"""python -m experiments.language: an alias of `maskjax.cli.language`."""

from experiments import alias

alias(__name__, "language")
