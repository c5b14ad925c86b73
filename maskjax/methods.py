"""The method registry: where each method puts its prior, and how it is set.

Methods are data. A study asks the registry by name and builds its model from the fields;
adding a method is one `register` call.
"""

from __future__ import annotations

import dataclasses

from maskjax.attention import MaskMode
from maskjax.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Method:
    """mask_mode: where an attention bias lives; mask_pattern: what it starts from.

    mask_pattern "oracle" uses the task's interaction pattern with the study's open/closed
    values, "zero" an all-zero M (log_sigmoid(0) = -log 2 everywhere: the same as no mask),
    "misspecified" the pattern moved onto bits that do not interact, "random" as many open
    entries placed at random, drawn per seed, "learned" the pattern `maskjax.discover` reads off the
    training data (no oracle).
    qk_init names the Q/K initialisation ("default" for the framework's own); qk_norm adds a LayerNorm
    on queries and keys (QK-LayerNorm) in every block. mask_structure: "study" for the study's own
    parameterisation of M (per entry, or per distance in the language study), "full" for one logit per
    entry everywhere. position_bias: a fixed bias beside the mask ("alibi"). studies: the studies that can
    build it (None: every study, for the methods any study with a mask pattern builds); the registry is the
    one allow-list every study's CLI checks.
    """

    name: str
    mask_mode: MaskMode = "none"
    mask_pattern: str = "none"
    qk_init: str = "default"
    qk_norm: bool = False
    mask_structure: str = "study"
    position_bias: str = "none"
    description: str = ""
    studies: tuple[str, ...] | None = None

    def defined_for(self, study: str) -> bool:
        return self.studies is None or study in self.studies


METHODS: dict[str, Method] = {}


def register(method: Method) -> Method:
    if method.name in METHODS:
        raise ConfigError(f"method {method.name!r} is already registered")
    METHODS[method.name] = method
    return method


def get_method(name: str) -> Method:
    if name not in METHODS:
        raise ConfigError(f"unknown method {name!r}; known: {', '.join(METHODS)}")
    return METHODS[name]


def methods_for(study: str) -> list[str]:
    """The registered methods a study can build, in registration order."""
    return [name for name, method in METHODS.items() if method.defined_for(study)]


def check_in_study(method: Method, study: str) -> None:
    """Refuse a method whose prior the study cannot build, rather than train it as something else."""
    if not method.defined_for(study):
        known = ", ".join(methods_for(study))
        raise ConfigError(f"method {method.name!r} is not defined for the {study} study; known there: {known}")


# Patterns through W_Q, W_K need a task pattern per head the study defines; mimetic and impulse need none.
QK_STUDIES = ("boolean", "arithmetic", "language")
INIT_STUDIES = ("boolean", "arithmetic", "vision")

register(Method("vanilla", description="plain attention, framework initialisation"))
register(Method("mask", "learnable", "oracle", description="learnable mask from the task's oracle pattern"))
register(Method("mask_fixed", "fixed", "oracle", description="the oracle mask held constant"))
register(Method("mask_zero", "learnable", "zero", description="learnable mask initialised to zero"))
register(
    Method(
        "qk_svd",
        qk_init="svd",
        studies=QK_STUDIES,
        description="the oracle pattern injected into W_Q, W_K in closed form",
    )
)
register(
    Method(
        "qk_opt",
        qk_init="opt",
        studies=QK_STUDIES,
        description="W_Q, W_K optimised at init to produce the oracle pattern",
    )
)
register(
    Method(
        "mimetic",
        qk_init="mimetic",
        studies=(*INIT_STUDIES, "language"),
        description="mimetic init: W_Q W_K^T ~ I, W_V W_O ~ -I; no task pattern",
    )
)
register(
    Method(
        "impulse",
        qk_init="impulse",
        studies=INIT_STUDIES,
        description="impulse init: each head's W_Q, W_K set to a shifted identity",
    )
)
register(
    Method(
        "mask_misspecified",
        "learnable",
        "misspecified",
        studies=("boolean",),
        description="the oracle pattern on the wrong bits",
    )
)
register(
    Method(
        "mask_random",
        "learnable",
        "random",
        studies=("boolean", "vision"),
        description="a random pattern of the oracle's sparsity, per seed",
    )
)
register(
    Method(
        "mask_learned",
        "learnable",
        "learned",
        studies=("boolean",),
        description="learnable mask from interactions found in the data",
    )
)
register(
    Method(
        "vanilla_qknorm",
        qk_norm=True,
        studies=QK_STUDIES,
        description="vanilla with LayerNorm on queries and keys (the control)",
    )
)
register(
    Method(
        "qk_svd_qknorm",
        qk_init="svd",
        qk_norm=True,
        studies=QK_STUDIES,
        description="qk_svd with LayerNorm on queries and keys",
    )
)
register(
    Method(
        "qk_opt_qknorm",
        qk_init="opt",
        qk_norm=True,
        studies=QK_STUDIES,
        description="qk_opt with LayerNorm on queries and keys",
    )
)
register(
    Method(
        "mask_full",
        "learnable",
        "oracle",
        mask_structure="full",
        studies=("boolean", "arithmetic", "language"),
        description="learnable mask with one logit per query-key entry (in the language study: not the Toeplitz bias)",
    )
)
register(
    Method(
        "alibi",
        position_bias="alibi",
        studies=("language",),
        description="ALiBi's fixed linear distance bias, a published control",
    )
)
register(
    Method(
        "alibi_matched",
        position_bias="alibi_matched",
        studies=("language",),
        description="ALiBi with each head's slope matched to the mask's initial window (scale / w_h per token)",
    )
)
