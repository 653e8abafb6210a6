"""Disaggregated prefill/decode on vLLM: the decode side's ``mm_inputs`` without ``pixel_values``
(placeholders, hashes, side tensors) with KV transfer params. Built by
``vllm.generate_request(..., pixels=False)``, through the wire bytes and a loopback reference
server, accepted exactly when smg-grpc-servicer 0.14.1's own code accepts it."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest

from smg_grpc_proto import tensors
from smg_grpc_proto.compat import CompatError
from smg_grpc_proto.engines import PreparedMedia, VisionModel, expand_placeholders
from smg_grpc_proto.engines import vllm as vllm_adapter
from smg_grpc_proto.errors import DisaggregationError, MultimodalError
from smg_grpc_proto.generated import vllm_engine_pb2 as vllm_pb
from smg_grpc_proto.testing import ReferenceServer, ToyModel

pytestmark = pytest.mark.timeout(120)

QWEN_IMAGE = 151655
GENERATE = "/vllm.grpc.engine.VllmEngine/Generate"
KV = {"do_remote_prefill": True, "remote_engine_id": "prefill-0", "remote_block_ids": [1, 2]}
FAMILIES = ("qwen2_vl", "qwen2_5_vl", "llava", "llava_next")


def _images(seed: int, sizes: list[tuple[int, int]]) -> list[np.ndarray[Any, Any]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in sizes]


def _media(family: str = "qwen2_vl", seed: int = 1) -> PreparedMedia:
    return VisionModel.for_family(family).prepare(_images(seed, [(56, 84), (112, 56)]))  # type: ignore[arg-type]


def _prompt(token: int, n: int = 2) -> list[int]:
    ids = [101, 2023]
    for _ in range(n):
        ids += [151652, token, 151653]
    return [*ids, 102]


def _wire(request: tensors.TensorMessage[Any]) -> tensors.TensorMessage[vllm_pb.GenerateRequest]:
    return tensors.parse(tensors.serialize(request), vllm_pb.GenerateRequest)


def _decode_side(family: str = "qwen2_vl", **kw: Any) -> tensors.TensorMessage[Any]:
    media = _media(family)
    kw.setdefault("kv_transfer_params", KV)
    return vllm_adapter.generate_request("d", _prompt(media.token_id), media, pixels=False, **kw)


def _shm_now() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


# -- builder ---------------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_round_trip_matches_the_full_request(family: str) -> None:
    media = _media(family)
    ids = _prompt(media.token_id)
    full = vllm_adapter.generate_request("p", ids, media)
    decode = vllm_adapter.generate_request("d", ids, media, pixels=False, kv_transfer_params=KV)
    message = decode.message
    assert not message.mm_inputs.HasField("pixel_values")
    assert "pixel_values" not in message.mm_inputs.flat_keys
    assert "pixel_values" not in message.mm_inputs.batched_keys
    assert json.loads(message.kv_transfer_params_json) == KV
    assert list(message.tokenized.input_ids) == list(full.message.tokenized.input_ids)
    for name in ("mm_placeholders", "mm_hashes", "modality", "im_token_id", "keep_on_cpu_keys"):
        assert getattr(message.mm_inputs, name) == getattr(full.message.mm_inputs, name), name
    assert set(message.mm_inputs.model_specific_tensors) == set(
        full.message.mm_inputs.model_specific_tensors
    )
    merge = 2 if family.startswith("qwen") else None
    (got,) = vllm_adapter.decode_mm_inputs(_wire(decode), merge_size=merge)
    (want,) = vllm_adapter.decode_mm_inputs(_wire(full), merge_size=merge)
    assert got.pixels is False
    assert want.pixels is True
    assert got.placeholders == want.placeholders
    assert got.hashes == want.hashes == tuple(media.hex_hashes)
    assert got.modality == want.modality
    assert got.im_token_id == want.im_token_id
    side = {k: v for k, v in want.tensors.items() if k != "pixel_values"}
    assert set(got.tensors) == set(side)
    for name, array in side.items():
        np.testing.assert_array_equal(got.tensors[name], array)
    for a, b in zip(got.items, want.items, strict=True):
        assert a.placeholders == b.placeholders
        assert a.content_hash == b.content_hash
        assert "pixel_values" not in a.tensors
        assert (a.embed_mask is None) == (b.embed_mask is None)


def test_legacy_kv_message_and_fill_mm_inputs() -> None:
    media = _media()
    legacy = vllm_pb.KvTransferParams(remote_host="10.0.0.2", remote_port=7000)
    built = _decode_side(kv_transfer_params=legacy)
    assert built.message.kv_transfer_params == legacy
    assert not built.message.HasField("kv_transfer_params_json")
    expected = {"remote_host": "10.0.0.2", "remote_port": 7000}
    assert vllm_adapter.kv_transfer_params(built) == expected
    # fill_mm_inputs: same option, the request's own KV params
    ids, _ = expand_placeholders(_prompt(QWEN_IMAGE), [media])
    request = vllm_pb.GenerateRequest(request_id="d", kv_transfer_params_json=json.dumps(KV))
    request.tokenized.input_ids.extend(ids.tolist())
    message = tensors.TensorMessage(request)
    vllm_adapter.fill_mm_inputs(message, media, pixels=False)
    built, filled = _decode_side().message.mm_inputs, message.message.mm_inputs
    for name in ("mm_placeholders", "mm_hashes", "batched_keys", "flat_keys", "im_token_id"):
        assert getattr(filled, name) == getattr(built, name), name
    assert not filled.HasField("pixel_values")
    (a,) = vllm_adapter.decode_mm_inputs(message, merge_size=2)
    (b,) = vllm_adapter.decode_mm_inputs(_decode_side(), merge_size=2)
    assert a.pixels is False
    assert a.placeholders == b.placeholders
    assert a.hashes == b.hashes
    for name in b.tensors:
        np.testing.assert_array_equal(a.tensors[name], b.tensors[name])


def test_builder_requires_kv_transfer_params() -> None:
    media = _media()
    with pytest.raises(DisaggregationError, match="pass kv_transfer_params") as info:
        vllm_adapter.generate_request("d", _prompt(QWEN_IMAGE), media, pixels=False)
    assert info.value.field == "kv_transfer_params_json"
    ids, _ = expand_placeholders(_prompt(QWEN_IMAGE), [media])
    request = vllm_pb.GenerateRequest(request_id="d")
    request.tokenized.input_ids.extend(ids.tolist())
    with pytest.raises(DisaggregationError):
        vllm_adapter.fill_mm_inputs(tensors.TensorMessage(request), media, pixels=False)
    with pytest.raises(DisaggregationError, match="remote_port must be in"):
        _decode_side(kv_transfer_params=vllm_pb.KvTransferParams(remote_host="h"))
    with pytest.raises(DisaggregationError, match="not JSON-serializable"):
        _decode_side(kv_transfer_params={"x": object()})
    # text-only requests may carry KV params without media; pixels=False then changes nothing
    plain = vllm_adapter.generate_request("t", [1, 2, 3], pixels=False)
    assert not plain.message.HasField("mm_inputs")


def test_pixel_less_request_uses_no_shared_memory() -> None:
    before = _shm_now()
    request = _decode_side(transport="shm", shm_min_bytes=0)
    assert request.shm_segments == []
    assert _shm_now() - before == set()
    payloads = [td for td in request.message.mm_inputs.model_specific_tensors.values()]
    assert payloads
    assert all(td.WhichOneof("payload") == "inline" for td in payloads)


# -- decoder ---------------------------------------------------------------------------------
def test_decoder_refuses_pixel_less_without_kv() -> None:
    message = _decode_side().to_message()
    message.ClearField("kv_transfer_params_json")
    with pytest.raises(DisaggregationError, match="kv_transfer_params") as info:
        vllm_adapter.decode_mm_inputs(message)
    assert info.value.field == "mm_inputs.pixel_values"
    assert isinstance(info.value, MultimodalError)
    assert "mm_inputs.pixel_values is not set" in str(info.value)


def test_decoder_reads_kv_params_like_the_servicer() -> None:
    message = _decode_side().to_message()
    message.kv_transfer_params_json = "[1, 2]"
    with pytest.raises(DisaggregationError, match="must be a JSON object"):
        vllm_adapter.decode_mm_inputs(message)
    message.kv_transfer_params_json = "{"
    with pytest.raises(DisaggregationError, match="not valid JSON"):
        vllm_adapter.decode_mm_inputs(message)
    message.kv_transfer_params_json = "{}"  # an empty object is params all the same
    assert vllm_adapter.decode_mm_inputs(message)[0].pixels is False
    message.ClearField("kv_transfer_params_json")
    message.kv_transfer_params.remote_host = "h"
    message.kv_transfer_params.remote_port = 1
    assert vllm_adapter.decode_mm_inputs(message)[0].pixels is False


def test_hashes_only_batch_needs_no_kv() -> None:
    # no side tensors at all (LLaVA): the servicer's cache-salt path, accepted without KV
    message = _decode_side("llava").to_message()
    assert not message.mm_inputs.model_specific_tensors
    message.ClearField("kv_transfer_params_json")
    (batch,) = vllm_adapter.decode_mm_inputs(message)
    assert batch.pixels is False
    assert dict(batch.tensors) == {}
    assert batch.hashes == tuple(_media("llava").hex_hashes)


def test_stripped_layout_is_tolerated() -> None:
    """A router that strips pixel_values but leaves flat_keys naming it is still read."""
    message = _decode_side().to_message()
    message.mm_inputs.flat_keys["pixel_values"] = "patches_per_image"
    assert vllm_adapter.decode_mm_inputs(message, merge_size=2)[0].pixels is False


# -- the real servicer's decision ------------------------------------------------------------
@pytest.fixture(scope="module")
def real() -> Any:
    from support.servicer import vllm_servicer

    try:
        return vllm_servicer()
    except CompatError as exc:  # offline: the wheel cannot be downloaded
        pytest.skip(f"smg-grpc-servicer wheel unavailable: {exc}")


def _cases() -> Iterator[tuple[str, vllm_pb.GenerateRequest]]:
    base = _decode_side().to_message()
    yield "json kv", base
    no_kv = vllm_pb.GenerateRequest()
    no_kv.CopyFrom(base)
    no_kv.ClearField("kv_transfer_params_json")
    yield "no kv", no_kv
    legacy = vllm_pb.GenerateRequest()
    legacy.CopyFrom(no_kv)
    legacy.kv_transfer_params.remote_host = "h"
    legacy.kv_transfer_params.remote_port = 9
    yield "legacy kv", legacy
    bad_legacy = vllm_pb.GenerateRequest()
    bad_legacy.CopyFrom(no_kv)
    bad_legacy.kv_transfer_params.remote_host = "h"
    yield "legacy kv without port", bad_legacy
    for text in ("{}", "[]", "{", "null"):
        odd = vllm_pb.GenerateRequest()
        odd.CopyFrom(base)
        odd.kv_transfer_params_json = text
        yield f"json {text}", odd
    both = vllm_pb.GenerateRequest()
    both.CopyFrom(legacy)
    both.kv_transfer_params_json = json.dumps(KV)
    yield "json and legacy", both
    bare = _decode_side("llava").to_message()
    bare.ClearField("kv_transfer_params_json")
    yield "hashes only, no kv", bare
    full = vllm_adapter.generate_request("p", _prompt(QWEN_IMAGE), _media()).to_message()
    yield "full, no kv", full
    mixed = vllm_pb.GenerateRequest()
    mixed.CopyFrom(full)
    mixed.extra_mm_inputs.add().CopyFrom(no_kv.mm_inputs)  # second batch, pixel-less
    mixed.extra_mm_inputs[0].modality = 2  # VIDEO, so the keys do not collide
    for key in list(mixed.extra_mm_inputs[0].model_specific_tensors):
        td = mixed.extra_mm_inputs[0].model_specific_tensors.pop(key)
        mixed.extra_mm_inputs[0].model_specific_tensors[key.replace("image", "video")].CopyFrom(td)
    del mixed.extra_mm_inputs[0].batched_keys[:]
    mixed.extra_mm_inputs[0].batched_keys.extend(["video_grid_thw", "patches_per_image"])
    del mixed.extra_mm_inputs[0].keep_on_cpu_keys[:]
    yield "pixels + pixel-less batch, no kv", mixed


CASES = dict(_cases())


def _ours(request: vllm_pb.GenerateRequest) -> str | None:
    try:
        vllm_adapter.decode_mm_inputs(request)
        vllm_adapter.kv_transfer_params(request)
    except MultimodalError as exc:
        return str(exc)
    return None


@pytest.mark.parametrize("case", list(CASES))
def test_agrees_with_the_real_servicer(case: str, real: Any) -> None:
    from support.servicer import servicer_refusal

    request = CASES[case]
    theirs = servicer_refusal(real, request)
    ours = _ours(request)
    assert (ours is None) == (theirs is None), (case, ours, theirs)


def test_real_servicer_decisions(real: Any) -> None:
    """The rule itself, as the real code states it (so a reader sees what is mirrored)."""
    from support.servicer import servicer_refusal

    accepted = {name for name, r in CASES.items() if servicer_refusal(real, r) is None}
    assert accepted == {
        "json kv",
        "legacy kv",
        "json {}",
        "json and legacy",
        "hashes only, no kv",
        "full, no kv",
    }


# -- over a loopback reference server --------------------------------------------------------
@pytest.fixture(scope="module")
def server() -> Iterator[ReferenceServer]:
    with ReferenceServer("vllm", model=ToyModel(token_delay_s=0.0)) as running:
        yield running


def _generate(server: ReferenceServer, request: Any) -> list[vllm_pb.GenerateResponse]:
    with grpc.insecure_channel(server.target) as ch:
        call = ch.unary_stream(
            GENERATE,
            request_serializer=tensors.serialize,
            response_deserializer=vllm_pb.GenerateResponse.FromString,
        )
        return list(call(request, timeout=30))


def test_reference_server_accepts_decode_side(server: ReferenceServer) -> None:
    params = vllm_pb.SamplingParams(max_tokens=5)
    before = _shm_now()
    (response,) = _generate(server, _decode_side(sampling_params=params, transport="shm"))
    assert response.complete.finish_reason in ("length", "stop")
    assert len(response.complete.output_ids) == 5
    assert _shm_now() - before == set()


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda m: m.ClearField("kv_transfer_params_json"), "mm_inputs.pixel_values is not set"),
        (lambda m: setattr(m, "kv_transfer_params_json", "[]"), "must be a JSON object"),
    ],
)
def test_reference_server_refuses(server: ReferenceServer, edit: Any, message: str) -> None:
    request = _decode_side(sampling_params=vllm_pb.SamplingParams(max_tokens=5)).to_message()
    edit(request)
    with pytest.raises(grpc.RpcError) as info:
        _generate(server, request)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in (info.value.details() or "")
