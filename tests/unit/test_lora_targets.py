"""LoRA target names: one vocabulary (api.LoraTarget) and one all-linear expansion for every consumer."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from accelbench.api.finetune import LORA_PROJECTIONS, LoraTarget, Method, expand_lora_targets

EVERY = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def test_projections_are_the_enum_in_hugging_face_order() -> None:
    assert LORA_PROJECTIONS == EVERY
    assert [t.value for t in LoraTarget] == [*EVERY, "all-linear"]


@pytest.mark.parametrize(
    ("targets", "expected"),
    [
        (["all-linear"], EVERY),
        (["q_proj", "all-linear"], EVERY),
        ([LoraTarget.ALL_LINEAR], EVERY),
        (["down_proj", "q_proj", "q_proj"], ("q_proj", "down_proj")),
        ([], ()),
    ],
)
def test_expansion(targets: list[str], expected: tuple[str, ...]) -> None:
    assert expand_lora_targets(targets) == expected


def test_expansion_refuses_an_unknown_name_and_lists_the_allowed_ones() -> None:
    with pytest.raises(ValueError, match=r"\['qkv'\].*'q_proj'.*'all-linear'"):
        expand_lora_targets(["q_proj", "qkv"])


def test_default_targets_unchanged() -> None:
    assert Method(rank=8).target_modules == list(EVERY)


def test_all_linear_is_accepted_and_round_trips() -> None:
    method = Method.model_validate({"type": "lora", "rank": 8, "targetModules": ["all-linear"]})
    assert method.target_modules == [LoraTarget.ALL_LINEAR]
    assert method.model_dump(mode="json", by_alias=True)["targetModules"] == ["all-linear"]


def test_api_refuses_an_unknown_name_with_the_allowed_values() -> None:
    with pytest.raises(ValidationError) as err:
        Method.model_validate({"type": "lora", "rank": 8, "targetModules": ["q_proj", "qkv"]})
    message = str(err.value)
    assert "qkv" in message and "'q_proj'" in message and "'all-linear'" in message
