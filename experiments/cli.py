"""python -m experiments.cli: an alias of `maskjax.cli.driver`."""

from experiments import alias

alias(__name__, "driver")
