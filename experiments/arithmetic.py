"""python -m experiments.arithmetic: an alias of `maskjax.cli.arithmetic`."""

from experiments import alias

alias(__name__, "arithmetic")
