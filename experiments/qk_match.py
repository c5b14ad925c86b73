"""python -m experiments.qk_match: an alias of `maskjax.cli.qk_match`."""

from experiments import alias

alias(__name__, "qk_match")
