"""Models with the masked attention inside."""

from maskjax.models.gotu import GotuTransformer, ModelConfig

__all__ = ["GotuTransformer", "ModelConfig"]
