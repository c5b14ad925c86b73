"""maskjax: mask-based attention priors, softmax(QK^T/sqrt(d) + log_sigmoid(M)), in JAX/Flax."""

from maskjax.attention import (
    MaskedSelfAttention,
    NNXMaskedSelfAttention,
    attention_weights,
    check_mask_logits,
    fused_attention,
    mask_bias,
    masked_attention,
)
from maskjax.bias import MaskBias, NNXMaskBias, decay_mask, with_mask_bias, with_mask_params

__all__ = [
    "MaskBias",
    "MaskedSelfAttention",
    "NNXMaskBias",
    "NNXMaskedSelfAttention",
    "attention_weights",
    "check_mask_logits",
    "decay_mask",
    "fused_attention",
    "mask_bias",
    "masked_attention",
    "with_mask_bias",
    "with_mask_params",
]
__version__ = "0.1.0"
