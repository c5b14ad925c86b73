"""python -m experiments.contrast: an alias of `maskjax.cli.contrast`."""

from experiments import alias

alias(__name__, "contrast")
