"""Adjacent Gemma 3 images share their merged newline token: vLLM's Gemma 3 processor reports
the two placeholder ranges overlapping by that one token, and every decoder accepts exactly that
— one shared boundary token that takes no embedding — and still refuses any other overlap."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

from smg_grpc_proto import tensors
from smg_grpc_proto.engines import PreparedMedia, VisionModel, expand_placeholders
from smg_grpc_proto.engines import sglang as sglang_adapter
from smg_grpc_proto.engines import tokenspeed as ts_adapter
from smg_grpc_proto.engines import vllm as vllm_adapter
from smg_grpc_proto.errors import PlaceholderError

ADAPTERS = {"vllm": vllm_adapter, "sglang": sglang_adapter, "tokenspeed": ts_adapter}
SOFT, NL1, NL4 = 262144, 107, 110  # <image_soft_token>, "\n", four newlines


def _gemma(n: int) -> PreparedMedia:
    rng = np.random.default_rng(n)
    images = [rng.integers(0, 256, (48 + 16 * k, 64, 3), dtype=np.uint8) for k in range(n)]
    return VisionModel.for_family("gemma3").prepare(images)


def _prompt(media: PreparedMedia) -> list[int]:
    return [2, 106, NL1, *([media.anchor] * media.count), NL1, 50, NL1]


def _wire(request: tensors.TensorMessage[Any]) -> tensors.TensorMessage[Any]:
    return tensors.parse(tensors.serialize(request), type(request.message))


@pytest.mark.parametrize("engine", list(ADAPTERS))
@pytest.mark.parametrize("n", [2, 3])
def test_adjacent_images_round_trip(engine: str, n: int) -> None:
    media = _gemma(n)
    ids, (ranges,) = expand_placeholders(_prompt(media), [media])
    # each pair of neighbours shares exactly one token: the merged "\n\n" + "\n\n"
    for (o1, l1), (o2, _) in itertools.pairwise(ranges):
        assert o1 + l1 - 1 == o2
        assert ids[o2] == NL4
    adapter = ADAPTERS[engine]
    request = adapter.generate_request("r", _prompt(media), media)
    batches = adapter.decode_mm_inputs(_wire(request))
    got = [p for b in batches for p in b.placeholders]
    assert got == ranges
    items = [item for b in batches for item in b.items]
    for item, (tokens, embed) in zip(items, media.replacements, strict=True):
        assert item.embed_mask is not None
        assert int(np.count_nonzero(item.embed_mask)) == int(embed.sum()) == 256
        offset, length = item.placeholder
        assert (ids[offset : offset + length][item.embed_mask] == SOFT).all()
        assert len(tokens) == length


def _tampered(mutate: Any) -> tensors.TensorMessage[Any]:
    media = _gemma(2)
    request = vllm_adapter.generate_request("r", _prompt(media), media)
    mutate(request.message)
    return _wire(request)


def test_an_overlap_of_two_tokens_is_refused() -> None:
    def widen(message: Any) -> None:
        second = message.mm_inputs.mm_placeholders[1]
        second.offset -= 1
        second.length += 1

    with pytest.raises(PlaceholderError, match="overlaps"):
        vllm_adapter.decode_mm_inputs(_tampered(widen))


def test_a_shared_embedding_token_is_refused() -> None:
    def share_a_soft_token(message: Any) -> None:
        first, second = message.mm_inputs.mm_placeholders
        # shift the second range so that its first token is the first image's last soft token
        delta = second.offset - (first.offset + first.length - 3)
        second.offset -= delta
        second.length += delta
        first.length -= 2

    with pytest.raises(PlaceholderError, match="overlaps"):
        vllm_adapter.decode_mm_inputs(_tampered(share_a_soft_token))


def test_without_an_embedding_token_nothing_is_shared() -> None:
    def drop_token(message: Any) -> None:
        message.mm_inputs.ClearField("im_token_id")  # every position then takes an embedding

    with pytest.raises(PlaceholderError, match="overlaps"):
        vllm_adapter.decode_mm_inputs(_tampered(drop_token))


def test_nested_ranges_are_refused() -> None:
    def nest(message: Any) -> None:
        first, second = message.mm_inputs.mm_placeholders
        first.length = second.offset + second.length - first.offset  # covers the second

    with pytest.raises(PlaceholderError, match="overlaps"):
        vllm_adapter.decode_mm_inputs(_tampered(nest))
