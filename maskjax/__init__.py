"""maskjax: mask-based attention priors, softmax(QK^T/sqrt(d) + log_sigmoid(M)), in JAX/Flax."""

from maskjax.attention import (
    MaskedSelfAttention,
    NNXMaskedSelfAttention,
    attention_weights,
    check_mask_logits,
    extend_relative_mask,
    fused_attention,
    mask_bias,
    masked_attention,
)
from maskjax.bias import (
    MaskBias,
    NNXMaskBias,
    add_attention_bias,
    attention_bias,
    bias_layout,
    decay_mask,
    fixed_masks,
    freeze_fixed_masks,
    with_mask_bias,
    with_mask_params,
)
from maskjax.errors import ConfigError

__all__ = [
    "ConfigError",
    "MaskBias",
    "MaskedSelfAttention",
    "NNXMaskBias",
    "NNXMaskedSelfAttention",
    "add_attention_bias",
    "attention_bias",
    "attention_weights",
    "bias_layout",
    "check_mask_logits",
    "decay_mask",
    "extend_relative_mask",
    "fixed_masks",
    "freeze_fixed_masks",
    "fused_attention",
    "mask_bias",
    "masked_attention",
    "with_mask_bias",
    "with_mask_params",
]
__version__ = "0.1.0"
