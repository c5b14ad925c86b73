"""python -m experiments.scale: an alias of `maskjax.cli.scale`."""

from experiments import alias

alias(__name__, "scale")
