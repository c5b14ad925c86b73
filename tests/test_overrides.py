import dataclasses

import pytest

from maskjax import overrides
from maskjax.errors import ConfigError
from maskjax.studies import language, vision


def test_overrides_set_nested_and_top_level_fields_with_their_types():
    config = overrides.apply(
        vision.STUDY.preset("quick"),
        ["model.dim=64", "learning_rate=3e-4", "clip_norm=none", "min_steps=2300", "pool=cls"],
    )
    assert config.model.dim == 64 and isinstance(config.model.dim, int)
    assert config.learning_rate == 3e-4 and config.clip_norm is None and config.min_steps == 2300
    assert config.pool == "cls" and config.model.depth == vision.STUDY.preset("quick").model.depth
    shared = overrides.apply(language.STUDY.preset("quick"), ["share_mask=true", "max_positions=64"])
    assert shared.share_mask is True and shared.max_positions == 64


def test_a_later_override_wins_and_the_preset_is_untouched():
    preset = vision.STUDY.preset("quick")
    assert overrides.apply(preset, ["epochs=3", "epochs=7"]).epochs == 7
    assert preset == vision.STUDY.preset("quick") and dataclasses.is_dataclass(preset)


@pytest.mark.parametrize(
    ("assignment", "message"),
    [
        ("model.dimm=3", "model.dimm is not a field of ModelConfig; its fields: dim"),
        ("epochs=ten", "epochs expects an integer"),
        ("learning_rate=nan", "learning_rate expects a finite number"),
        ("share_mask=maybe", "share_mask expects true or false"),
        ("model=3", "model is a nested config: set its fields (model.dim"),
        ("epochs.x=3", "epochs is not a nested config"),
        ("epochs", "expected an override NAME=VALUE"),
        ("min_steps=none", "min_steps expects an integer"),
    ],
)
def test_bad_overrides_name_what_is_wrong(assignment, message):
    config = language.STUDY.preset("quick") if assignment.startswith("share") else vision.STUDY.preset("quick")
    with pytest.raises(ConfigError) as error:
        overrides.apply(config, [assignment])
    assert message in str(error.value)

