"""python -m experiments.persistence: an alias of `maskjax.cli.persistence`."""

from experiments import alias

alias(__name__, "persistence")
