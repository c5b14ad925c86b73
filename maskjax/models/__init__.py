"""Models with the masked attention inside."""

from maskjax.models.gotu import GotuTransformer
from maskjax.models.layers import ModelConfig

__all__ = ["GotuTransformer", "ModelConfig"]
