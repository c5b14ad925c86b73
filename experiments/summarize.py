"""python -m experiments.summarize: an alias of `maskjax.cli.summarize`."""

from experiments import alias

alias(__name__, "summarize")
