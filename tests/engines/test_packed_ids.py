"""The builders write list prompts' expanded ids as packed wire bytes (the native core's
``packed_prompt``, or without it short prompts in Python); the request must hold exactly the ids
(and ranges) that ``expand_placeholders`` gives, and refuse the same. Other prompts' ids go
through ``put_ids`` (one packed record whose varints the native core writes): the same message
as ``extend`` gives, with or without the native core."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from smg_grpc_proto import _core
from smg_grpc_proto.engines import VisionModel, _media, expand_placeholders
from smg_grpc_proto.engines import vllm as vllm_adapter
from smg_grpc_proto.errors import PlaceholderError
from smg_grpc_proto.generated import (
    mlx_engine_pb2,
    sglang_scheduler_pb2,
    tokenspeed_scheduler_pb2,
    trtllm_service_pb2,
    vllm_engine_pb2,
)


@pytest.fixture(scope="module")
def media() -> Any:
    model = VisionModel.for_family("qwen2_vl")
    rng = np.random.default_rng(3)
    images = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in [(60, 90), (120, 64)]]
    return model.prepare(images, threads=1)


def _prompt(token: int, head: list[int], n: int) -> list[int]:
    out = list(head)
    for i in range(n):
        out += [token, i, 2**32 - 1 - i]
    return out


@pytest.mark.parametrize(
    "head",
    [[], [0], [127, 128, 16383, 16384], [2**21 - 1, 2**21, 2**28, 2**32 - 1], [5, 2**30] * 300],
)
@pytest.mark.parametrize("native", [True, False])
def test_packed_ids_equal_the_expanded_list(
    media: Any, head: list[int], native: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not native:
        monkeypatch.setattr(_core, "AVAILABLE", False)
    prompt = _prompt(media.anchor, head, media.count)
    request = vllm_adapter.generate_request("r", prompt, media).message
    expanded, ranges = expand_placeholders(prompt, [media])
    assert list(request.tokenized.input_ids) == expanded.tolist()
    assert [(p.offset, p.length) for p in request.mm_inputs.mm_placeholders] == ranges[0]
    plain = type(request)()
    plain.CopyFrom(request)
    plain.tokenized.ClearField("input_ids")
    plain.tokenized.input_ids.extend(expanded.tolist())
    # Map entries in key order: upb writes a map in its hash table's order, which a copy may
    # not keep (the two `model_specific_tensors` entries came out swapped in one CI run).
    assert plain.SerializeToString(deterministic=True) == request.SerializeToString(
        deterministic=True
    )
    assert plain.tokenized.SerializeToString() == request.tokenized.SerializeToString()


@pytest.mark.parametrize("form", ["long", "array", "numpy ints"])
def test_other_prompts_take_the_array_path(
    media: Any, form: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    prompt: Any = _prompt(media.anchor, [3], media.count)
    if form == "long":
        # Without the native core (which expands lists of any length: test_listed_ids.py).
        monkeypatch.setattr(_core, "AVAILABLE", False)
        prompt = [5] * (_media._FEW_IDS + 1) + prompt
    elif form == "array":
        prompt = np.asarray(prompt, dtype=np.uint32)
    else:
        prompt = [np.int64(t) for t in prompt]
    assert _media._few_runs(prompt, [media]) is None
    request = vllm_adapter.generate_request("r", prompt, media).message
    expanded, ranges = expand_placeholders(prompt, [media])
    assert list(request.tokenized.input_ids) == expanded.tolist()
    assert [(p.offset, p.length) for p in request.mm_inputs.mm_placeholders] == ranges[0]


@pytest.mark.parametrize(
    "prompt",
    [[1, 2], [-1, 7], [2**32, 7], [True, 7], [1.5, 7], [[1], [2]], "anchors"],
)
def test_packed_path_refuses_what_expand_refuses(media: Any, prompt: Any) -> None:
    if prompt == "anchors":
        prompt = _prompt(media.anchor, [], media.count + 1)
    with pytest.raises(PlaceholderError) as ours:
        vllm_adapter.generate_request("r", prompt, media)
    with pytest.raises(PlaceholderError) as theirs:
        expand_placeholders(prompt, [media])
    assert str(ours.value) == str(theirs.value)


@pytest.mark.parametrize(
    ("module", "field"),
    [
        (vllm_engine_pb2, "input_ids"),
        (sglang_scheduler_pb2, "input_ids"),
        (tokenspeed_scheduler_pb2, "input_ids"),
        (trtllm_service_pb2, "input_token_ids"),
        (mlx_engine_pb2, "input_ids"),
    ],
)
@pytest.mark.parametrize("native", [True, False])
def test_put_ids_equals_extend(
    module: Any, field: str, native: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    edges = [0, 1, 127, 128, 16383, 16384, 2**21 - 1, 2**21, 2**28 - 1, 2**28, 2**32 - 1]
    rng = np.random.default_rng(7)
    for ids in (
        np.asarray(edges, dtype=np.uint32),
        rng.integers(0, 2**32, 3000, dtype=np.uint64).astype(np.uint32),
        np.zeros(0, dtype=np.uint32),
    ):
        if not native:
            monkeypatch.setattr(_core, "AVAILABLE", False)
        # As the builders call it: on a `tokenized` not set yet (its presence and the `input`
        # oneof must follow as with `extend`).
        ours = module.GenerateRequest()
        _media.put_ids(ours.tokenized, field, ids)
        plain = module.GenerateRequest()
        getattr(plain.tokenized, field).extend(ids.tolist())
        assert list(getattr(ours.tokenized, field)) == ids.tolist()
        assert ours.HasField("tokenized") == plain.HasField("tokenized")
        assert ours.SerializeToString() == plain.SerializeToString()


def test_put_ids_refuses_other_dtypes() -> None:
    message = vllm_engine_pb2.GenerateRequest()
    with pytest.raises(TypeError, match="uint32"):
        _media.put_ids(message.tokenized, "input_ids", np.asarray([-1, 2**32 + 3], np.int64))
    assert not message.HasField("tokenized")
