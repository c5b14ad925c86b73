"""The rules the Boolean study's scale ladder and floors are read by (docs/design.md, "Sizes that learn" and
"The low-data floor"), and the FLOP count the ladder is laid out on: functions of records, no training."""

from __future__ import annotations

import functools
from collections.abc import Sequence

from maskjax import runs
from maskjax.models.layers import ModelConfig
from maskjax.tasks.boolean import get_task, seen_share


def train_flops(model: ModelConfig, n_tokens: int, batch_size: int) -> float:
    """Matmul FLOPs of one training step of one run, 3x the forward's (the backward costs two forwards):
    the scale axis of docs/results/boolean_scale.md. LayerNorm, softmax, GELU and the optimizer are left
    out: against XLA's count of the whole step it is 88% at quick, 94% at w64d4, 97% at w128d6 and 99% at
    the paper's size (docs/benchmarks/train_step_*_cpu2.txt)."""
    inner = model.heads * model.head_dim
    dense = n_tokens * (3 * model.dim * inner + inner * model.dim + 2 * model.dim * model.mlp_dim)
    attention = 2 * n_tokens**2 * inner
    forward = 2 * (model.depth * (dense + attention) + model.dim)
    return 3.0 * batch_size * forward


# The vanilla rule that picks the medium preset (docs/design.md, Presets): train loss under FIT_LOSS and
# acc_all within MDI_BAND of the MDI's, in at least 3 of 4 seeds.
FIT_LOSS = 1e-3
MDI_BAND = 0.01


def vanilla_rule(records: Sequence[dict], mdi_acc: float) -> dict:
    """How many of a task's vanilla runs fit the seen data, land on the MDI, and both; passes when both
    hold in at least three quarters of them. A diverged run (no loss, no accuracy) does neither."""
    fit = [r["train_loss"] is not None and r["train_loss"] < FIT_LOSS for r in records]
    at_mdi = [r["acc_all"] is not None and abs(r["acc_all"] - mdi_acc) <= MDI_BAND for r in records]
    both = runs.seed_verdict([f and a for f, a in zip(fit, at_mdi, strict=True)])
    return {
        "seeds": both["seeds"],
        "fit": sum(fit),
        "at_mdi": sum(at_mdi),
        "both": both["pass"],
        "passes": both["passes"],
    }


# Issue 43's floor for Cyclic3 (docs/design.md, "The low-data floor"): vanilla at the MDI's plateau, at
# least this share of the seen points right, in at least 6 of 8 seeds.
SEEN_FLOOR = 0.97


def seen_accuracy(record: dict) -> float | None:
    """Accuracy on the seen points alone, from the whole cube's and the unseen part's (records store those
    two): acc_all = s * acc_seen + (1 - s) * acc_unseen, s the seen share of the cube."""
    if record.get("acc_all") is None or record.get("acc_unseen") is None:
        return None
    share = _seen_share(record["task"])
    return (record["acc_all"] - (1.0 - share) * record["acc_unseen"]) / share


@functools.cache
def _seen_share(task: str) -> float:
    """Once per task: the pages derive acc_seen for every Boolean record they read."""
    return seen_share(get_task(task))


def plateau_floor(records: Sequence[dict], floor: float = SEEN_FLOOR) -> dict:
    """How many vanilla seeds sit at the MDI plateau (at least `floor` of the seen points right); passes
    when at least three quarters do."""
    return runs.seed_verdict([(acc := seen_accuracy(r)) is not None and acc >= floor for r in records])
