"""python -m experiments.vision_linear: an alias of `maskjax.cli.vision_linear`."""

from experiments import alias

alias(__name__, "vision_linear")
