"""python -m experiments.audit: an alias of `maskjax.cli.audit`."""

from experiments import alias

alias(__name__, "audit")
