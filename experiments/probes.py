"""python -m experiments.probes: an alias of `maskjax.cli.probes`."""

from experiments import alias

alias(__name__, "probes")
