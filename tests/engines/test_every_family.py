"""Every vision family reaches every engine: for each of ``_native.families()``,
``VisionModel.for_family(f).prepare(images)`` → builder → ``tensors.serialize`` →
``tensors.parse`` → ``decode_mm_inputs`` gives back every item's tensors byte for byte (vLLM
inline, shared memory, shared memory as bfloat16; SGLang; TokenSpeed inline and shared memory),
the placeholder ranges cover each item's whole replacement, the embed masks are exactly the
positions of the embedding token, and no segment of the request is left in ``/dev/shm``.

The family-specific rules (the tokens of each replacement against transformers' processors)
are tested per family (``test_llama4_engines.py``, …); this is the matrix of the contract.
"""

from __future__ import annotations

import os
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from smg_grpc_proto import _native, tensors
from smg_grpc_proto.engines import PreparedMedia, VisionModel, expand_placeholders
from smg_grpc_proto.engines import sglang as sglang_adapter
from smg_grpc_proto.engines import tokenspeed as ts_adapter
from smg_grpc_proto.engines import trtllm as trtllm_adapter
from smg_grpc_proto.engines import vllm as vllm_adapter
from smg_grpc_proto.engines._decoded import SIZES_KEY, DecodedItem
from smg_grpc_proto.engines._tensors import CROSS_ATTENTION, ENGINE_LAYOUTS
from smg_grpc_proto.errors import MultimodalError, MultimodalNotSupportedError

ALL_FAMILIES = [name for name, *_ in _native.families()]
# Cross-attention families (Llama 3.2 Vision): processed exactly, but no engine contract here
# carries their images, and every builder says so (test_cross_attention_refused).
FAMILIES = [f for f in ALL_FAMILIES if f not in CROSS_ATTENTION]


def _reads(engine: str, family: str) -> bool:
    """Whether ``engine``'s models read ``family``'s layout (ENGINE_LAYOUTS: Nemotron-H-Omni's
    packed patches only TokenSpeed; TensorRT-LLM takes its files)."""
    engines, _ = ENGINE_LAYOUTS.get(family, (None, ""))
    return engines is None or engine in engines


# A landscape photo-sized image (tiled by every tiling family), a portrait strip, a tiny square.
SHAPES = [(300, 500), (900, 400), (40, 40)]


def _images(seed: int, shapes: list[tuple[int, int]]) -> list[np.ndarray[Any, Any]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in shapes]


_PREPARED: dict[tuple[str, int], PreparedMedia] = {}


def _media(family: str, n: int) -> PreparedMedia:
    """The family's media for the first ``n`` shapes (cached: the matrix reuses them)."""
    key = (family, n)
    if key not in _PREPARED:
        model = VisionModel.for_family(family)  # type: ignore[arg-type]
        _PREPARED[key] = model.prepare(_images(n, SHAPES[:n]))
    return _PREPARED[key]


def _prompt(media: PreparedMedia) -> list[int]:
    ids = [1, 7]
    for k in range(media.count):
        ids += [media.anchor, 100 + k]
    return [*ids, 2]


def _wire(request: tensors.TensorMessage[Any]) -> tensors.TensorMessage[Any]:
    return tensors.parse(tensors.serialize(request), type(request.message))


def _same(decoded: np.ndarray[Any, Any], original: np.ndarray[Any, Any], name: str) -> None:
    assert decoded.dtype == original.dtype, (name, decoded.dtype, original.dtype)
    assert decoded.shape == original.shape, (name, decoded.shape, original.shape)
    assert np.ascontiguousarray(decoded).tobytes() == np.ascontiguousarray(original).tobytes(), name


def _expected_tokens(media: PreparedMedia, i: int) -> tuple[np.ndarray[Any, Any], Any]:
    """Item ``i``'s replacement tokens and embed mask by the model's rule."""
    if media.replacements:
        return media.replacements[i]
    count = media.token_counts[i]
    return np.full(count, media.token_id, dtype=np.uint32), np.ones(count, dtype=bool)


def _check_item(
    media: PreparedMedia,
    i: int,
    item: DecodedItem,
    ids: np.ndarray[Any, Any],
    *,
    dtype: Any = None,
    sizes_name: str | None = None,
    names: Any = None,
) -> None:
    """``names``: the engine model's names for transformers' (vLLM Gemma 4), ``None`` for a
    tensor the engine does not take."""
    want = media.item_tensors(i, sizes_name)
    if names:
        want = {names.get(k, k): v for k, v in want.items() if names.get(k, k) is not None}
    primary = want.pop(media.primary_name)
    if dtype is not None:
        primary = primary.astype(dtype)
    got = dict(item.tensors)
    decoded_primary = got.pop(media.primary_name, None)
    if decoded_primary is None:
        decoded_primary = got.pop("pixel_values")
    _same(decoded_primary, primary, media.primary_name)
    name = sizes_name or media.sizes_name
    if name in got and name not in want:
        # the builder's sizes tensor of a grid-split primary (Qwen): this item's rows
        assert got.pop(name).tolist() == [media.flat_sizes()[i]]
    assert sorted(got) == sorted(want), (sorted(got), sorted(want))
    for name, array in want.items():
        _same(got[name], array, name)
    offset, length = item.placeholder
    tokens, embed = _expected_tokens(media, i)
    assert length == tokens.shape[0]
    assert (ids[offset : offset + length] == tokens).all()
    # no mask: every position of the range takes an embedding
    mask = np.ones(length, dtype=bool) if item.embed_mask is None else item.embed_mask
    assert (np.asarray(mask) == embed).all()
    assert int(np.count_nonzero(embed)) == media.token_counts[i]


def _assert_refused(engine: str, build: Any) -> None:
    """``build`` raises MultimodalNotSupportedError naming ``engine`` and leaves no segment."""
    before = set(os.listdir("/dev/shm"))
    with pytest.raises(MultimodalNotSupportedError) as info:
        build()
    assert str(info.value).startswith(f"{engine}: ")
    assert info.value.field.endswith("family")
    assert set(os.listdir("/dev/shm")) <= before


@pytest.mark.parametrize("family", sorted(ENGINE_LAYOUTS))
def test_trtllm_follows_engine_layouts(family: str) -> None:
    """TensorRT-LLM's builder refuses a family its input processors do not serve, and sends the
    files (prompt unexpanded) of one they do (Nemotron-H-Omni: its own processor)."""
    media = _media(family, 3)
    if not _reads("TensorRT-LLM", family):
        _assert_refused(
            "TensorRT-LLM",
            lambda: trtllm_adapter.generate_request("r", _prompt(media), media, max_tokens=4),
        )
        return
    files = [_png(a) for a in _images(3, SHAPES)]
    encoded = VisionModel.for_family(family).prepare(files)  # type: ignore[arg-type]
    request = trtllm_adapter.generate_request("r", _prompt(encoded), encoded, max_tokens=4)
    assert list(request.message.tokenized.input_token_ids) == _prompt(encoded)
    assert trtllm_adapter.decode_mm_inputs(_wire(request), image_token_id=encoded.anchor) == tuple(
        files
    )


def _png(array: np.ndarray[Any, Any]) -> bytes:
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture(params=FAMILIES)
def family(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_prepare_maps_tiles_to_items(family: str) -> None:
    media = _media(family, 3)
    assert media.count == 3
    layout = media.layout()
    sizes = media.flat_sizes()
    assert len(sizes) == 3
    assert min(sizes) >= 1
    for name, array in media.tensors().items():
        rows = sum(sizes) if layout[name] == "flat" else 3
        assert array.shape[0] == rows, (name, array.shape, layout[name])
    # the items' slices put back together are the whole tensors
    for name, array in media.tensors().items():
        parts = [media.item_tensors(i)[name] for i in range(3)]
        _same(np.concatenate(parts), array, name)
    ids, ranges = expand_placeholders(_prompt(media), [media])
    for i, (offset, length) in enumerate(ranges[0]):
        tokens, _ = _expected_tokens(media, i)
        assert (ids[offset : offset + length] == tokens).all()


@pytest.mark.parametrize(
    ("transport", "dtype"), [("inline", None), ("shm", None), ("shm", "bfloat16")]
)
def test_vllm_round_trip_exact(family: str, transport: str, dtype: str | None) -> None:
    media = _media(family, 3)
    if not _reads("vLLM", family):
        _assert_refused(
            "vLLM",
            lambda: vllm_adapter.generate_request(
                "r",
                _prompt(media),
                media,
                transport=transport,
                shm_min_bytes=0,  # type: ignore[arg-type]
            ),
        )
        return
    request = vllm_adapter.generate_request(
        "r",
        _prompt(media),
        media,
        transport=transport,  # type: ignore[arg-type]
        dtype=dtype,
        shm_min_bytes=0,
    )
    assert bool(request.shm_segments) == (transport == "shm")
    mm = request.message.mm_inputs
    assert mm.im_token_id == media.token_id
    flat = {k for k, v in media.layout().items() if v == "flat"}
    wire_name = {media.primary_name: "pixel_values"}
    assert set(mm.flat_keys) == {wire_name.get(k, k) for k in flat}
    assert set(mm.flat_keys.values()) <= {media.sizes_name}
    (batch,) = vllm_adapter.decode_mm_inputs(_wire(request))
    ids = np.asarray(request.message.tokenized.input_ids)
    bf16 = ml_dtypes.bfloat16 if dtype else None
    names = vllm_adapter.MODEL_TENSOR_NAMES.get(family)
    for i, item in enumerate(batch.items):
        _check_item(media, i, item, ids, dtype=bf16, names=names)
    assert [s for s in request.shm_segments if os.path.exists(f"/dev/shm/{s}")] == []


def test_sglang_round_trip_exact(family: str) -> None:
    media = _media(family, 3)
    if not _reads("SGLang", family):
        _assert_refused(
            "SGLang", lambda: sglang_adapter.generate_request("r", _prompt(media), media)
        )
        return
    request = sglang_adapter.generate_request("r", _prompt(media), media)
    assert request.message.mm_inputs.im_token_id == media.token_id
    (batch,) = sglang_adapter.decode_mm_inputs(_wire(request))
    ids = np.asarray(request.message.tokenized.input_ids)
    for i, item in enumerate(batch.items):
        _check_item(media, i, item, ids, sizes_name=SIZES_KEY)


@pytest.mark.parametrize(("transport", "dtype"), [("inline", None), ("shm", "bfloat16")])
def test_tokenspeed_round_trip_exact(family: str, transport: str, dtype: str | None) -> None:
    media = _media(family, 3)
    request = ts_adapter.generate_request(
        "r",
        _prompt(media),
        media,
        transport=transport,  # type: ignore[arg-type]
        dtype=dtype,
        shm_min_bytes=0,
    )
    items = request.message.mm_inputs.items
    assert [item.placeholder_token_id for item in items] == [media.token_id] * 3
    batches = ts_adapter.decode_mm_inputs(_wire(request))
    ids = np.asarray(request.message.tokenized.input_ids)
    bf16 = ml_dtypes.bfloat16 if dtype else None
    for i, decoded in enumerate(batches):
        (item,) = decoded.items
        _check_item(media, i, item, ids, dtype=bf16, sizes_name=SIZES_KEY)
    assert [s for s in request.shm_segments if os.path.exists(f"/dev/shm/{s}")] == []


@pytest.mark.parametrize("family", sorted(CROSS_ATTENTION))
def test_cross_attention_refused(family: str) -> None:
    """Every builder refuses a cross-attention family with MultimodalNotSupportedError naming
    the engine and the reason; nothing is left in shared memory."""
    assert family in ALL_FAMILIES
    media = _media(family, 3)
    before = set(os.listdir("/dev/shm"))
    builders: list[Any] = [
        lambda: vllm_adapter.generate_request("r", _prompt(media), media),
        lambda: vllm_adapter.generate_request(
            "r", _prompt(media), media, transport="shm", shm_min_bytes=0
        ),
        lambda: sglang_adapter.generate_request("r", _prompt(media), media),
        lambda: ts_adapter.generate_request("r", _prompt(media), media),
        lambda: trtllm_adapter.generate_request("r", _prompt(media), media, max_tokens=4),
    ]
    for build, engine in zip(
        builders, ["vLLM", "vLLM", "SGLang", "TokenSpeed", "TensorRT-LLM"], strict=True
    ):
        with pytest.raises(MultimodalNotSupportedError, match="cross-attention") as info:
            build()
        assert str(info.value).startswith(engine)
        assert info.value.field.endswith("family")
    assert set(os.listdir("/dev/shm")) <= before


STRUCTURED = [f for f in FAMILIES if VisionModel.for_family(f).processor._native.replacement_spec()]  # type: ignore[arg-type]


@pytest.mark.parametrize("family", STRUCTURED)
def test_wrap_an_output_made_elsewhere(family: str) -> None:
    """``VisionModel.wrap`` gives an output computed elsewhere the model's replacement and layout:
    the same replacements, rows and layout as ``prepare``, and a request that round-trips."""
    model = VisionModel.for_family(family)  # type: ignore[arg-type]
    prepared = _media(family, 3)
    wrapped = model.wrap(prepared.output)
    assert wrapped.item_rows == prepared.item_rows
    assert wrapped.token_counts == prepared.token_counts
    assert wrapped.layout() == prepared.layout()
    for (a, ma), (b, mb) in zip(wrapped.replacements, prepared.replacements, strict=True):
        assert a.tolist() == b.tolist()
        assert ma.tolist() == mb.tolist()
    assert len(set(wrapped.hashes)) == 3  # hashed from each item's own tensors
    if _reads("vLLM", family):
        request = vllm_adapter.generate_request("w", _prompt(wrapped), wrapped)
        (batch,) = vllm_adapter.decode_mm_inputs(_wire(request))
        names = vllm_adapter.MODEL_TENSOR_NAMES.get(family)
        ids = np.asarray(request.message.tokenized.input_ids)
        for i, item in enumerate(batch.items):
            _check_item(wrapped, i, item, ids, names=names)
    else:  # the engine that reads it (Nemotron-H-Omni: TokenSpeed), one item per batch
        request = ts_adapter.generate_request("w", _prompt(wrapped), wrapped, dtype=None)
        ids = np.asarray(request.message.tokenized.input_ids)
        for i, decoded in enumerate(ts_adapter.decode_mm_inputs(_wire(request))):
            (item,) = decoded.items
            _check_item(wrapped, i, item, ids, sizes_name=SIZES_KEY)
    # PreparedMedia.from_output cannot know the replacement: it refuses rather than send a run
    with pytest.raises(MultimodalError, match=r"VisionModel\.wrap"):
        PreparedMedia.from_output(prepared.output, token_id=model.image_token_id, family=family)


def test_from_output_keeps_working_for_run_families() -> None:
    media = _media("qwen2_vl", 2)
    wrapped = PreparedMedia.from_output(media.output, token_id=151655, family="qwen2_vl")
    assert wrapped.token_counts == media.token_counts
    # a family name that is not one of ours is a run family for from_output
    other = PreparedMedia.from_output(media.output, token_id=151655, family="my_qwen_fork")
    assert other.token_counts == media.token_counts
    assert VisionModel.for_family("qwen2_vl").wrap(media.output).token_counts == media.token_counts
