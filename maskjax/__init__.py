"""maskjax: mask-based attention priors, softmax(QK^T/sqrt(d) + log_sigmoid(M)), in JAX/Flax.

The public names and submodules load on first use, so that `import maskjax.plots` (a child process that
only draws figures) does not import JAX and Flax.
"""

from __future__ import annotations

import importlib
import importlib.util

_HOMES = {
    "maskjax.attention": (
        "MaskedSelfAttention",
        "attention_weights",
        "check_mask_logits",
        "extend_relative_mask",
        "fused_attention",
        "mask_bias",
        "masked_attention",
    ),
    "maskjax.bias": (
        "MaskBias",
        "add_attention_bias",
        "attention_bias",
        "bias_layout",
        "decay_mask",
        "fixed_masks",
        "freeze_fixed_masks",
        "with_mask_bias",
        "with_mask_params",
    ),
    "maskjax.errors": ("ConfigError",),
    "maskjax.nnx_modules": ("NNXMaskBias", "NNXMaskedSelfAttention"),
}
_HOME = {name: module for module, names in _HOMES.items() for name in names}

__all__ = sorted(_HOME)
__version__ = "0.1.0"


def __getattr__(name: str):
    """A public name from its module, or a submodule (`maskjax.attention.mask_shape` after `import maskjax`)."""
    if name in _HOME:
        value = getattr(importlib.import_module(_HOME[name]), name)
    elif name.isidentifier() and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        value = importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module 'maskjax' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
