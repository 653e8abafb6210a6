"""The engine modules' shared verbs (smg_grpc_proto.engines.VERBS): every engine module defines
them with the same positional parameters; ``fill_mm_inputs`` on a request built elsewhere gives
the request ``generate_request`` gives, and the reference servicers, over loopback gRPC, decode
it back to the prepared tensors; the shared helpers (``placeholder_ranges``, ``image_format``)
against their definitions."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import io
import threading
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from PIL import (
    BmpImagePlugin,
    GifImagePlugin,
    Image,
    JpegImagePlugin,
    PngImagePlugin,
    WebPImagePlugin,
)

import smg_grpc_proto.engines as engines
from smg_grpc_proto import channel, shm, tensors
from smg_grpc_proto.engines import (
    VERBS,
    PreparedMedia,
    VisionModel,
    expand_placeholders,
    image_format,
    placeholder_ranges,
)
from smg_grpc_proto.errors import (
    MultimodalError,
    MultimodalNotSupportedError,
    PlaceholderError,
    TensorError,
)
from smg_grpc_proto.testing import ReferenceServer, ToyModel

pytestmark = pytest.mark.timeout(120)

ENGINES = ("vllm", "sglang", "tokenspeed", "trtllm", "mlx")
PB = {
    "vllm": "vllm_engine_pb2",
    "sglang": "sglang_scheduler_pb2",
    "tokenspeed": "tokenspeed_scheduler_pb2",
    "trtllm": "trtllm_service_pb2",
    "mlx": "mlx_engine_pb2",
}
# The positional parameters (name, default) of each verb, the same in every engine module.
POSITIONAL = {
    "generate_request": [
        ("request_id", inspect.Parameter.empty),
        ("input_ids", inspect.Parameter.empty),
        ("media", ()),
    ],
    "fill_mm_inputs": [("message", inspect.Parameter.empty), ("media", inspect.Parameter.empty)],
    "decode_mm_inputs": [("request", inspect.Parameter.empty)],
}
IMAGE, VIDEO = 151655, 151656
SIZES_OF = {"patches_per_image": "pixel_values", "patches_per_video": "pixel_values_videos"}


def _module(engine: str) -> ModuleType:
    return importlib.import_module(f"smg_grpc_proto.engines.{engine}")


def _pb(engine: str) -> Any:
    return importlib.import_module(f"smg_grpc_proto.generated.{PB[engine]}")


# -- the verbs and their signatures ---------------------------------------------------------
def test_verbs_are_the_documented_set() -> None:
    assert tuple(POSITIONAL) == VERBS
    assert "VERBS" in engines.__all__
    for verb in (*VERBS, "embed_request"):
        assert f"``{verb}``" in (engines.__doc__ or "")  # the table names every verb


@pytest.mark.parametrize("engine", ENGINES)
def test_every_engine_module_has_every_verb(engine: str) -> None:
    module = _module(engine)
    for verb in VERBS:
        function = getattr(module, verb)
        assert verb in module.__all__
        assert function.__module__ == module.__name__
        params = list(inspect.signature(function).parameters.values())
        positional = [p for p in params if p.kind is not inspect.Parameter.KEYWORD_ONLY]
        assert [(p.name, p.default) for p in positional] == POSITIONAL[verb], (engine, verb)
        assert all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in positional)
        assert not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
    # Nothing else: the shared helpers are not engine API (SGLang alone has an Embed with media;
    # vLLM alone reads KV transfer params, which its disaggregated decode side needs).
    extra = {"sglang": {"embed_request"}, "vllm": {"kv_transfer_params"}}.get(engine, set())
    functions = {n for n in module.__all__ if inspect.isfunction(getattr(module, n))}
    assert functions == set(VERBS) | extra


def test_shared_helpers_live_in_one_place() -> None:
    for helper in ("content_hash", "image_format", "placeholder_ranges", "expand_placeholders"):
        assert helper in engines.__all__
        assert getattr(engines, helper).__module__ == "smg_grpc_proto.engines._media"
        assert not any(helper in _module(e).__all__ for e in ENGINES)


def test_keyword_options_of_the_fill_match_the_builder() -> None:
    """``fill_mm_inputs`` takes the builder's media options under the same names and defaults."""
    for engine in ENGINES:
        module = _module(engine)
        build = inspect.signature(module.generate_request).parameters
        for name, param in inspect.signature(module.fill_mm_inputs).parameters.items():
            if param.kind is inspect.Parameter.KEYWORD_ONLY:
                assert build[name].default == param.default, (engine, name)


# -- fill_mm_inputs == generate_request, and the servicers decode it ------------------------
def _images(seed: int, sizes: list[tuple[int, int]]) -> list[np.ndarray[Any, Any]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in sizes]


def _png(image: np.ndarray[Any, Any]) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG")
    return buffer.getvalue()


MODEL = VisionModel.for_family("qwen2_vl")


def _media(engine: str) -> list[PreparedMedia]:
    files = [_png(x) for x in _images(3, [(56, 84), (112, 56)])]
    images = MODEL.prepare(files)
    if engine in ("vllm", "tokenspeed"):
        return [images, MODEL.prepare(videos=[_images(4, [(56, 56)] * 2)])]
    return [images]


def _prompt(media: list[PreparedMedia]) -> list[int]:
    ids = [101, 2023]
    for m in media:
        for _ in range(m.count):
            ids += [151652, m.token_id, 151653]
    return [*ids, 102]


# Engine options that keep the tensors exact (TokenSpeed's default is bfloat16).
OPTIONS: dict[str, dict[str, Any]] = {"tokenspeed": {"dtype": None}, "trtllm": {}}
BUILD: dict[str, dict[str, Any]] = {"trtllm": {"max_tokens": 8}}


def _text_request(engine: str, ids: list[int]) -> tensors.TensorMessage[Any]:
    """The request as other code builds it, before the media: prompt and sampling only."""
    pb = _pb(engine)
    if engine == "trtllm":
        request = pb.GenerateRequest(request_id="r", max_tokens=8)
        request.tokenized.input_token_ids.extend(ids)
    else:
        request = pb.GenerateRequest(request_id="r")
        request.tokenized.input_ids.extend(ids)
    return tensors.TensorMessage(request)


def _filled(engine: str, media: list[PreparedMedia], **options: Any) -> tensors.TensorMessage[Any]:
    module = _module(engine)
    prompt = _prompt(media)
    ids = prompt if engine == "trtllm" else expand_placeholders(prompt, media)[0].tolist()
    message = _text_request(engine, ids)
    module.fill_mm_inputs(message, media[0] if engine == "trtllm" else media, **options)
    return message


@pytest.mark.parametrize("engine", ["vllm", "sglang", "tokenspeed", "trtllm"])
def test_fill_gives_the_request_the_builder_gives(engine: str) -> None:
    module = _module(engine)
    media = _media(engine)
    options = OPTIONS.get(engine, {})
    built = module.generate_request(
        "r",
        _prompt(media),
        media[0] if engine == "trtllm" else media,
        **options,
        **BUILD.get(engine, {}),
    )
    filled = _filled(engine, media, **options)
    assert tensors.serialize(filled) == tensors.serialize(built)


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, tuple[ReferenceServer, dict[str, Any]]]]:
    """One reference server per engine, each reporting what its decoder returned."""
    out: dict[str, tuple[ReferenceServer, dict[str, Any]]] = {}
    try:
        for engine in ENGINES:
            seen: dict[str, Any] = {}
            lock = threading.Lock()

            def record(
                rid: str, decoded: Any, _s: float, seen: dict[str, Any] = seen, lock: Any = lock
            ) -> None:
                with lock:
                    seen[rid] = decoded

            server = ReferenceServer(
                engine, model=ToyModel(merge_size=2), servicer_kwargs={"on_decoded": record}
            )
            server.start()
            out[engine] = (server, seen)
        yield out
    finally:
        for server, _ in out.values():
            server.stop()


def _send(engine: str, server: ReferenceServer, request: tensors.TensorMessage[Any]) -> None:
    pb = _pb(engine)
    service = next(iter(pb.DESCRIPTOR.services_by_name.values())).full_name
    with channel.insecure_channel(server.target) as ch:
        call: Callable[..., Any] = ch.unary_stream(
            f"/{service}/Generate",
            request_serializer=tensors.serialize,
            response_deserializer=pb.GenerateResponse.FromString,
        )
        responses = list(call(request, timeout=30))
    assert responses
    assert responses[-1].WhichOneof("response") == "complete"


def _expected_items(
    media: list[PreparedMedia],
) -> list[tuple[str, dict[str, np.ndarray[Any, Any]]]]:
    """Every item of every PreparedMedia in prompt order, its tensors under the names the
    engines' decoders use."""
    order = sorted(
        (r[0], b, i)
        for b, ranges in enumerate(expand_placeholders(_prompt(media), media)[1])
        for i, r in enumerate(ranges)
    )
    return [(media[b].modality, media[b].item_tensors(i)) for _, b, i in order]


@pytest.mark.parametrize(
    ("engine", "transport"),
    [
        ("vllm", "inline"),
        ("vllm", "shm"),
        ("sglang", "inline"),
        ("tokenspeed", "inline"),
        ("tokenspeed", "shm"),
    ],
)
def test_filled_tensors_reach_the_reference_servicer(
    engine: str, transport: str, servers: dict[str, tuple[ReferenceServer, dict[str, Any]]]
) -> None:
    server, seen = servers[engine]
    media = _media(engine)
    options = dict(OPTIONS.get(engine, {}))
    if transport != "inline":
        options["transport"] = transport
    request = _filled(engine, media, **options)
    request.message.request_id = rid = f"{engine}-{transport}"
    assert (len(request.shm_segments) > 0) == (transport == "shm")
    _send(engine, server, request)
    decoded = seen.pop(rid)
    items = [(batch.modality, item) for batch in decoded for item in batch.items]
    expected = _expected_items(media)
    assert len(items) == len(expected) == sum(m.count for m in media)
    for (modality, item), (want_modality, want) in zip(items, expected, strict=True):
        assert modality == want_modality
        extra = set(item.tensors) - set(want)  # vLLM's flat_keys sizes: the item's rows
        assert extra <= set(SIZES_OF), extra
        for name in extra:
            assert item.tensors[name].tolist() == [len(want[SIZES_OF[name]])]
        for name, array in want.items():
            got = item.tensors[name]
            assert got.dtype == array.dtype, (engine, name)
            assert np.array_equal(got, array), (engine, name)


def test_filled_files_reach_the_reference_servicer(
    servers: dict[str, tuple[ReferenceServer, dict[str, Any]]],
) -> None:
    server, seen = servers["trtllm"]
    media = _media("trtllm")
    request = _filled("trtllm", media)
    request.message.request_id = "trtllm-files"
    _send("trtllm", server, request)
    assert seen.pop("trtllm-files") == tuple(e for e in media[0].encoded if e is not None)


def test_mlx_fill_refuses_media_by_name(
    servers: dict[str, tuple[ReferenceServer, dict[str, Any]]],
) -> None:
    from smg_grpc_proto.engines import mlx

    media = _media("mlx")
    request = _text_request("mlx", [1, 2, 3])
    before = request.message.SerializeToString()
    for given in (media[0], media):
        with pytest.raises(MultimodalNotSupportedError, match="MLX's contract carries no media"):
            mlx.fill_mm_inputs(request, given)
        with pytest.raises(NotImplementedError):
            mlx.generate_request("r", [1, IMAGE, 3], given)
    mlx.fill_mm_inputs(request, ())  # nothing to fill: the request stays as it was
    assert request.message.SerializeToString() == before
    server, seen = servers["mlx"]
    request.message.request_id = "mlx-text"
    _send("mlx", server, request)
    assert "mlx-text" not in seen  # text only: nothing to decode


def test_media_a_contract_cannot_carry_is_not_supported() -> None:
    from smg_grpc_proto.engines import sglang, trtllm

    _, video = _media("vllm")
    decoded_pixels = MODEL.prepare(_images(5, [(56, 56)]))
    ids = expand_placeholders(_prompt([video]), [video])[0].tolist()
    with pytest.raises(MultimodalNotSupportedError, match="SGLang's preprocessed input carries"):
        sglang.fill_mm_inputs(_text_request("sglang", ids), video)
    with pytest.raises(MultimodalNotSupportedError, match="TensorRT-LLM needs the encoded files"):
        trtllm.fill_mm_inputs(_text_request("trtllm", [IMAGE]), decoded_pixels)
    with pytest.raises(MultimodalNotSupportedError, match="carries image files only, got video"):
        trtllm.fill_mm_inputs(_text_request("trtllm", [VIDEO, VIDEO]), video)
    assert issubclass(MultimodalNotSupportedError, MultimodalError)


@pytest.mark.parametrize("engine", ["vllm", "sglang", "tokenspeed", "trtllm"])
def test_fill_refuses_a_prompt_that_does_not_fit(engine: str) -> None:
    module = _module(engine)
    media = _media(engine)
    prompt = _prompt(media)
    # vLLM, SGLang, TokenSpeed need the expanded prompt; TensorRT-LLM one anchor per image.
    wrong = expand_placeholders(prompt, media)[0].tolist() if engine == "trtllm" else prompt
    arg = media[0] if engine == "trtllm" else media
    message = _text_request(engine, wrong)
    with pytest.raises(PlaceholderError) as err:
        module.fill_mm_inputs(message, arg, **OPTIONS.get(engine, {}))
    assert err.value.field in ("input_ids", "tokenized.input_token_ids")
    filled = _filled(engine, media, **OPTIONS.get(engine, {}))
    with pytest.raises(MultimodalError, match="filled already"):
        module.fill_mm_inputs(filled, arg, **OPTIONS.get(engine, {}))


def test_a_failed_fill_unlinks_the_segments_it_wrote() -> None:
    from smg_grpc_proto.engines import tokenspeed, vllm

    images, video = _media("vllm")
    # A video whose pixels are float64, a dtype no contract carries: its attach fails after
    # the images' segments are written.
    out = video.output
    bad = dataclasses.replace(out, pixel_values_videos=out.pixel_values_videos.astype(np.float64))
    bad_video = dataclasses.replace(video, processed=bad)
    ids = expand_placeholders(_prompt([images, video]), [images, video])[0].tolist()
    for module, engine in ((vllm, "vllm"), (tokenspeed, "tokenspeed")):
        message = _text_request(engine, ids)
        with pytest.raises(TensorError, match="float64"):
            module.fill_mm_inputs(message, [images, bad_video], transport="shm", dtype=None)
        written = message.shm_segments
        assert written  # the images' segments were written, then unlinked
        assert [n for n in written if (shm.DEFAULT_DIR / n).exists()] == []


# -- placeholder_ranges: the inverse of expand_placeholders -------------------------------------
def test_placeholder_ranges_inverts_expand_placeholders() -> None:
    for engine in ("vllm", "sglang"):
        media = _media(engine)
        ids, ranges = expand_placeholders(_prompt(media), media)
        assert placeholder_ranges(ids, media) == ranges
        assert placeholder_ranges(ids.tolist(), media) == ranges


def test_placeholder_ranges_refuses_what_is_not_an_expanded_prompt() -> None:
    images = _media("sglang")[0]  # two images
    ids = expand_placeholders(_prompt([images]), [images])[0].tolist()
    with pytest.raises(PlaceholderError, match="must be expanded"):
        placeholder_ranges(_prompt([images]), [images])
    first = ids.index(IMAGE)
    split = [*ids[: first + 1], 7, *ids[first + 2 :], IMAGE]  # same count, first run interrupted
    with pytest.raises(PlaceholderError, match=r"item 0: its .* are not one run"):
        placeholder_ranges(split, [images])
    with pytest.raises(PlaceholderError, match="1-D sequence"):
        placeholder_ranges([[1, 2]], [images])
    with pytest.raises(PlaceholderError, match="share the placeholder token"):
        placeholder_ranges(ids, [images, images])


# -- image_format: the native decoder's signature check, as Pillow accepts files ------------
def _pillow_format(prefix: bytes) -> str | None:
    """Which of the five plugins would open the file (their ``_accept``, in Pillow's order)."""

    def bmp(p: bytes) -> bool:
        return BmpImagePlugin._accept(p) or (len(p) >= 4 and BmpImagePlugin._dib_accept(p))

    checks: list[tuple[str, Callable[[bytes], Any]]] = [
        ("jpeg", JpegImagePlugin._accept),
        ("png", PngImagePlugin._accept),
        ("gif", GifImagePlugin._accept),
        ("bmp", bmp),
        ("webp", WebPImagePlugin._accept),
    ]
    return next((name for name, accept in checks if accept(prefix) is True), None)


def test_image_format_names_encoded_files() -> None:
    image = _images(9, [(20, 30)])[0]
    for fmt in ("JPEG", "PNG", "GIF", "BMP", "WEBP"):
        buffer = io.BytesIO()
        Image.fromarray(image).save(buffer, format=fmt)
        data = buffer.getvalue()
        assert image_format(data) == fmt.lower()
        assert image_format(bytearray(data)) == image_format(memoryview(data)) == fmt.lower()
    assert image_format(b"") is None
    assert image_format(b"hello world") is None


def test_image_format_agrees_with_pillow() -> None:
    rng = np.random.default_rng(0)
    heads = [
        b"\xff\xd8\xff",
        b"\x89PNG\r\n\x1a\n",
        b"GIF87a",
        b"GIF89a",
        b"GIF88a",
        b"BM",
        b"RIFF\x10\x00\x00\x00WEBPVP8 ",
        b"RIFF\x10\x00\x00\x00WEBPVP8L",
        b"RIFF\x10\x00\x00\x00WEBPVP8X",
        b"RIFF\x10\x00\x00\x00WEBPVP9 ",  # not a WebP chunk: refused (the old table took it)
        b"RIFF\x10\x00\x00\x00WAVEfmt ",
        *(n.to_bytes(4, "little") for n in (12, 40, 52, 56, 64, 108, 124, 13, 41)),  # bare DIBs
        b"II*\x00",
        b"",
    ]
    cases = 0
    for head in heads:
        for _ in range(40):
            tail = rng.integers(0, 256, int(rng.integers(0, 24)), dtype=np.uint8).tobytes()
            data = (head + tail)[: int(rng.integers(0, len(head) + len(tail) + 1))]
            assert image_format(data) == _pillow_format(data), data
            cases += 1
    for _ in range(2000):
        data = rng.integers(0, 256, int(rng.integers(0, 20)), dtype=np.uint8).tobytes()
        assert image_format(data) == _pillow_format(data), data
        cases += 1
    assert cases == len(heads) * 40 + 2000


def test_trtllm_checks_files_with_the_native_sniff() -> None:
    from smg_grpc_proto.engines import trtllm

    dib = (40).to_bytes(4, "little") + bytes(60)  # Pillow's BMP plugin opens a bare DIB
    request = trtllm.generate_request("r", [IMAGE], [dib], max_tokens=4)
    assert trtllm.decode_mm_inputs(request) == (dib,)
    fake_webp = b"RIFF\x10\x00\x00\x00WEBPVP9 " + bytes(16)  # no VP8/VP8L/VP8X chunk
    with pytest.raises(MultimodalError, match=r"media\[0\]: not a JPEG, PNG, GIF, BMP or WebP"):
        trtllm.generate_request("r", [IMAGE], [fake_webp], max_tokens=4)
