"""maskjax: mask-based attention priors, softmax(QK^T/sqrt(d) + log_sigmoid(M)), in JAX/Flax."""

from maskjax.attention import (
    MaskedSelfAttention,
    NNXMaskedSelfAttention,
    attention_weights,
    check_mask_logits,
    masked_attention,
)

__all__ = [
    "MaskedSelfAttention",
    "NNXMaskedSelfAttention",
    "attention_weights",
    "check_mask_logits",
    "masked_attention",
]
__version__ = "0.1.0"
