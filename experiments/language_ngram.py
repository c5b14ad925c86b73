"""python -m experiments.language_ngram: an alias of `maskjax.cli.language_ngram`."""

from experiments import alias

alias(__name__, "language_ngram")
