"""python -m experiments.boolean: an alias of `maskjax.cli.boolean`."""

from experiments import alias

alias(__name__, "boolean")
