"""Gemma 3 (with and without pan-and-scan crops) and Pixtral through the engine builders: crops
mapped to items, each anchor expanded exactly as transformers' ``Gemma3Processor`` /
``PixtralProcessor`` writes it, and every engine's round trip byte-exact."""

from __future__ import annotations

import json
import os
import sys
import types
from pathlib import Path
from typing import Any, ClassVar

import ml_dtypes
import numpy as np
import pytest
from PIL import Image

from smg_grpc_proto import tensors
from smg_grpc_proto.engines import PreparedMedia, VisionModel, expand_placeholders
from smg_grpc_proto.engines import sglang as sglang_adapter
from smg_grpc_proto.engines import tokenspeed as ts_adapter
from smg_grpc_proto.engines import vllm as vllm_adapter
from smg_grpc_proto.engines._media import placeholder_ranges
from smg_grpc_proto.errors import ProcessorConfigError

# google/gemma-3-*-it: Gemma3Config boi/eoi/image_token_index; "\n" 107 … "\n\n\n\n" 110.
GEMMA = {"<start_of_image>": 255999, "<end_of_image>": 256000, "<image_soft_token>": 262144}
BOI, EOI, SOFT = GEMMA.values()
NEWLINES = {"\n": 107, "\n\n": 108, "\n\n\n": 109, "\n\n\n\n": 110}
# mistral-community/pixtral-12b's tekken special tokens.
PIXTRAL = {"[IMG]": 10, "[IMG_BREAK]": 12, "[IMG_END]": 13}
IMG = PIXTRAL["[IMG]"]
# The text pieces at fixed ids of the test tokenizer.
WORDS = "describe and compare Here is the original image here are some crops to help you see better"
VOCAB = {w: 1000 + k for k, w in enumerate(dict.fromkeys(WORDS.split()))}
PIECES = {
    "Here is the original image \n\n": "Here is the original image \n\n",
    "\n\n and here are some crops to help you see better \n\n": "",
    "\n\n \n\n": "",
}
SMALL = {"size": {"height": 224, "width": 224}}
PAN = {**SMALL, "do_pan_and_scan": True}
# tiny; 2:1 strip (2 crops); 1:4 strip (4 crops); large 4:3 (2 crops); a square (none).
GEMMA_SIZES = [(20, 30), (300, 700), (1200, 300), (1200, 1600), (500, 500)]
# tiny; strips; large (bounded by longest_edge 1024); odd sizes.
PIXTRAL_SIZES = [(5, 7), (40, 600), (900, 30), (1500, 1100), (333, 257)]


def _images(seed: int, sizes: list[tuple[int, int]]) -> list[np.ndarray[Any, Any]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in sizes]


def _wire(request: tensors.TensorMessage[Any]) -> tensors.TensorMessage[Any]:
    return tensors.parse(tensors.serialize(request), type(request.message))


def _same(decoded: np.ndarray[Any, Any], original: np.ndarray[Any, Any]) -> None:
    assert decoded.dtype == original.dtype, (decoded.dtype, original.dtype)
    assert decoded.shape == original.shape
    assert np.ascontiguousarray(decoded).tobytes() == np.ascontiguousarray(original).tobytes()


# -- tokenizers with the special tokens at their real ids -------------------------------------
def _backend(special: dict[str, int]) -> Any:
    from tokenizers import AddedToken, Regex, Tokenizer, models, pre_tokenizers

    vocab = {"<unk>": 3, **NEWLINES, **VOCAB, **special}
    backend = Tokenizer(models.WordLevel(vocab, "<unk>"))
    # words and runs of newlines are tokens; spaces separate them
    backend.pre_tokenizer = pre_tokenizers.Split(
        Regex(r"\n+|[^\s]+"), behavior="removed", invert=True
    )
    backend.add_special_tokens(list(special))
    # Gemma's newline runs are pieces the tokenizer takes whole, longest first, wherever they
    # stand in the text (transformers' SpmConverter makes sentencepiece's user-defined pieces
    # non-special added tokens): so "\n" + "\n\n" in the substituted text is the one token
    # "\n\n\n", as in Gemma3Processor's output
    backend.add_tokens([AddedToken(t, normalized=False, special=False) for t in NEWLINES])
    return backend


def _tokenizer(special: dict[str, int], **extra: str) -> Any:
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=_backend(special),
        unk_token="<unk>",
        additional_special_tokens=list(special),
        extra_special_tokens=extra,
    )


def _gemma_tokenizer() -> Any:
    return _tokenizer(
        GEMMA,
        boi_token="<start_of_image>",
        eoi_token="<end_of_image>",
        image_token="<image_soft_token>",
    )


def _piece_ids() -> dict[str, tuple[int, ...]]:
    """The pan-and-scan pieces as the test tokenizer writes them."""
    backend = _backend(GEMMA)
    return {p: tuple(backend.encode(p, add_special_tokens=False).ids) for p in PIECES}


def _gemma(sizes: list[tuple[int, int]], config: dict[str, Any], seed: int = 0) -> PreparedMedia:
    model = VisionModel.for_family("gemma3", config=config, token_ids=_piece_ids())
    return model.prepare(_images(seed, sizes))


def _pixtral(sizes: list[tuple[int, int]], seed: int = 0, **config: Any) -> PreparedMedia:
    return VisionModel.for_family("pixtral", config=config or None).prepare(_images(seed, sizes))


def _prompt(anchor: int, n: int) -> list[int]:
    ids = [2, VOCAB["describe"]]
    for _ in range(n):
        ids += [anchor, VOCAB["and"]]
    return [*ids, VOCAB["compare"]]


def _rows(media: PreparedMedia) -> list[int]:
    """Rows of pixel_values per item: Gemma 3 one plus its crops, Pixtral one."""
    crops = media.output.tensors().get("num_crops")
    return [1 + int(c) for c in crops.tolist()] if crops is not None else [1] * media.count


def _check_item(
    media: PreparedMedia,
    ids: np.ndarray[Any, Any],
    i: int,
    item: Any,
    *,
    dtype: Any = None,
    sizes_as: str | None = None,
) -> None:
    """``sizes_as``: the name the contract carries the sizes tensor under (SGLang and TokenSpeed
    have no layout keys and take it as ``patches_per_image``)."""
    for name, original in media.item_tensors(i).items():
        want = original.astype(dtype) if dtype is not None and name == "pixel_values" else original
        got = sizes_as if sizes_as is not None and name == media.sizes_key else name
        _same(item.tensors[got], want)
    assert item.tensors["pixel_values"].shape[0] == _rows(media)[i]
    offset, length = item.placeholder
    tokens, embed = media.replacements[i]
    assert length == tokens.shape[0]
    assert (ids[offset : offset + length] == tokens).all()
    # the mask is exactly the image-token positions (vLLM's select_token_id)
    assert item.embed_mask is not None
    assert (item.embed_mask == embed).all()
    assert (item.embed_mask == (tokens == media.token_id)).all()
    assert int(item.embed_mask.sum()) == media.token_counts[i]


CASES = {
    "gemma3": lambda n, seed: _gemma(GEMMA_SIZES[:n] if n > 1 else [(20, 30)], SMALL, seed),
    "gemma3-pan": lambda n, seed: _gemma(GEMMA_SIZES[1 : 1 + n], PAN, seed),
    "pixtral": lambda n, seed: _pixtral(PIXTRAL_SIZES[:n] if n > 1 else [(333, 257)], seed),
}


# -- items vs crops ---------------------------------------------------------------------------
def test_crops_map_to_items() -> None:
    media = _gemma(GEMMA_SIZES, PAN)
    assert media.output.tensors()["num_crops"].tolist() == [0, 2, 4, 2, 0]
    assert media.item_rows == (1, 3, 5, 3, 1)
    assert media.layout() == {
        "pixel_values": "flat",
        "num_crops": "batched",
        "num_patches": "batched",
    }
    assert media.tensors()["num_patches"].tolist() == [1, 3, 5, 3, 1]
    pixels = media.tensors()["pixel_values"]
    starts = np.cumsum([0, *media.item_rows])
    for i in range(media.count):
        _same(media.item_tensors(i)["pixel_values"], pixels[starts[i] : starts[i + 1]])
    assert media.token_counts == (256, 3 * 256, 5 * 256, 3 * 256, 256)
    assert (media.anchor, media.token_id) == (BOI, SOFT)
    plain = _gemma(GEMMA_SIZES, SMALL)
    assert plain.item_rows == (1,) * 5
    assert plain.token_counts == (256,) * 5


def test_pixtral_items_are_padded_images() -> None:
    media = _pixtral(PIXTRAL_SIZES)
    sizes = media.output.image_sizes
    assert sizes is not None
    assert media.layout() == {"pixel_values": "batched", "image_sizes": "batched"}
    assert media.item_rows == ()
    assert (media.anchor, media.token_id) == (IMG, IMG)
    assert media.token_counts == tuple(int(h // 16) * int(w // 16) for h, w in sizes.tolist())


# -- every engine's round trip ----------------------------------------------------------------
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize(
    ("transport", "dtype"), [("inline", None), ("shm", None), ("shm", "bfloat16")]
)
def test_vllm_round_trip_exact(case: str, n: int, transport: str, dtype: str | None) -> None:
    media = CASES[case](n, n)
    request = vllm_adapter.generate_request(
        "r",
        _prompt(media.anchor, n),
        media,
        transport=transport,
        dtype=dtype,
        shm_min_bytes=0,  # type: ignore[arg-type]
    )
    assert bool(request.shm_segments) == (transport == "shm")
    mm = request.message.mm_inputs
    assert mm.im_token_id == media.token_id
    if case.startswith("gemma3"):
        assert dict(mm.flat_keys) == {"pixel_values": "num_patches"}
        assert sorted(mm.batched_keys) == ["num_crops", "num_patches"]
    else:
        assert dict(mm.flat_keys) == {}
        assert sorted(mm.batched_keys) == ["image_sizes", "pixel_values"]
    (batch,) = vllm_adapter.decode_mm_inputs(_wire(request))
    ids = np.asarray(request.message.tokenized.input_ids)
    for i, item in enumerate(batch.items):
        _check_item(media, ids, i, item, dtype=ml_dtypes.bfloat16 if dtype else None)
    assert [s for s in request.shm_segments if os.path.exists(f"/dev/shm/{s}")] == []


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("n", [1, 3])
def test_sglang_round_trip_exact(case: str, n: int) -> None:
    media = CASES[case](n, 10 + n)
    request = sglang_adapter.generate_request("r", _prompt(media.anchor, n), media)
    assert request.message.mm_inputs.im_token_id == media.token_id
    (batch,) = sglang_adapter.decode_mm_inputs(_wire(request))
    ids = np.asarray(request.message.tokenized.input_ids)
    for i, item in enumerate(batch.items):
        _check_item(media, ids, i, item, sizes_as="patches_per_image")


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize(("transport", "dtype"), [("inline", None), ("shm", "bfloat16")])
def test_tokenspeed_round_trip_exact(case: str, n: int, transport: str, dtype: str | None) -> None:
    media = CASES[case](n, 20 + n)
    request = ts_adapter.generate_request(
        "r",
        _prompt(media.anchor, n),
        media,
        transport=transport,
        dtype=dtype,
        shm_min_bytes=0,  # type: ignore[arg-type]
    )
    items = request.message.mm_inputs.items
    assert [item.placeholder_token_id for item in items] == [media.token_id] * n
    batches = ts_adapter.decode_mm_inputs(_wire(request))
    ids = np.asarray(request.message.tokenized.input_ids)
    for i, batch in enumerate(batches):
        _check_item(
            media,
            ids,
            i,
            batch.items[0],
            dtype=ml_dtypes.bfloat16 if dtype else None,
            sizes_as="patches_per_image",
        )
    assert [s for s in request.shm_segments if os.path.exists(f"/dev/shm/{s}")] == []


@pytest.mark.parametrize("case", list(CASES))
def test_fill_mm_inputs_finds_the_replacements(case: str) -> None:
    media = CASES[case](3, 5)
    prompt = _prompt(media.anchor, 3)
    ids, ranges = expand_placeholders(prompt, [media])
    assert placeholder_ranges(ids, [media]) == ranges
    request = vllm_adapter.generate_request("r", prompt, media)
    built = tensors.TensorMessage(type(request.message)(request_id="r"))
    built.message.tokenized.input_ids.extend(ids.tolist())
    vllm_adapter.fill_mm_inputs(built, media)
    assert list(built.message.mm_inputs.mm_placeholders) == list(
        request.message.mm_inputs.mm_placeholders
    )
    (batch,) = vllm_adapter.decode_mm_inputs(_wire(built))
    for i, item in enumerate(batch.items):
        _check_item(media, ids, i, item)


# -- the expanded prompt is transformers' ------------------------------------------------------
def _image_processor(outputs: dict[str, Any], base: Any = None) -> Any:
    """An image processor (of class ``base``, for its accepted keyword arguments) handing back
    our processor's outputs (whose bit-exactness tests/vision covers), so that transformers'
    processor writes the prompt from them."""
    from transformers import BatchFeature
    from transformers.image_processing_utils import BaseImageProcessor

    class Outputs(base or BaseImageProcessor):  # type: ignore[misc]
        model_input_names: ClassVar[list[str]] = ["pixel_values"]

        def __call__(self, images: Any, **kwargs: Any) -> Any:
            return BatchFeature(outputs)

        preprocess = __call__

    return Outputs()


def _pixtral_processor_class() -> Any:
    """transformers' PixtralProcessor; its module imports the torch-only image processor for a
    helper that ``__call__`` never uses, which stands in here while the module loads."""
    name = "transformers.models.pixtral.image_processing_pixtral"
    if "transformers.models.pixtral.processing_pixtral" not in sys.modules:
        stand_in = types.ModuleType(name)
        stand_in.get_resize_output_image_size = None  # type: ignore[attr-defined]
        previous = sys.modules.get(name)
        sys.modules[name] = stand_in
        try:
            import transformers.models.pixtral.processing_pixtral  # noqa: F401
        finally:
            if previous is None:
                del sys.modules[name]
            else:
                sys.modules[name] = previous
    return sys.modules["transformers.models.pixtral.processing_pixtral"].PixtralProcessor


def _text(anchor: str, n: int) -> str:
    return "describe " + " and ".join([anchor] * n) + " compare"


@pytest.mark.parametrize("pan", [False, True], ids=["plain", "pan-and-scan"])
@pytest.mark.parametrize(
    "sizes",
    [[(20, 30)], [(300, 700)], [(1200, 300)], [(500, 500), (1200, 1600), (300, 700)]],
    ids=["tiny", "wide-strip", "tall-strip", "3-images"],
)
def test_input_ids_equal_gemma3_processor(pan: bool, sizes: list[tuple[int, int]]) -> None:
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil
    from transformers.models.gemma3.processing_gemma3 import Gemma3Processor

    media = _gemma(sizes, PAN if pan else SMALL, seed=7)
    out = media.output.tensors()
    processor = Gemma3Processor(
        image_processor=_image_processor(
            {"pixel_values": out["pixel_values"], "num_crops": out["num_crops"]},
            Gemma3ImageProcessorPil,
        ),
        tokenizer=_gemma_tokenizer(),
    )
    images = [Image.new("RGB", (w, h)) for h, w in sizes]
    text = _text("<start_of_image>", len(sizes))
    want = processor(text=text, images=images, return_tensors=None)["input_ids"][0]
    prompt = _gemma_tokenizer()(text)["input_ids"]
    ids, ranges = expand_placeholders(prompt, [media])
    assert ids.tolist() == list(want)
    assert (int(out["num_crops"].sum()) > 0) == (pan and sizes != [(20, 30)])
    for (offset, length), (tokens, _) in zip(ranges[0], media.replacements, strict=True):
        assert length == tokens.shape[0]
        assert ids[offset + length - 1] == NEWLINES["\n\n"]


@pytest.mark.parametrize(
    ("sizes", "config"),
    [
        ([(5, 7)], {}),
        ([(40, 600)], {}),
        ([(1500, 1100)], {}),
        ([(900, 30), (333, 257), (5, 7)], {}),
        ([(333, 257), (40, 600)], {"spatial_merge_size": 2}),
    ],
    ids=["tiny", "strip", "large", "3-images", "merge-2"],
)
def test_input_ids_equal_pixtral_processor(
    sizes: list[tuple[int, int]], config: dict[str, Any]
) -> None:
    media = _pixtral(sizes, 8, **config)
    out = media.output
    processor = _pixtral_processor_class()(
        image_processor=_image_processor(
            {"pixel_values": out.pixel_values, "image_sizes": out.image_sizes}
        ),
        tokenizer=_tokenizer(PIXTRAL),
        spatial_merge_size=config.get("spatial_merge_size", 1),
    )
    images = [Image.new("RGB", (w, h)) for h, w in sizes]
    text = _text("[IMG]", len(sizes))
    want = processor(text=text, images=images, return_tensors=None)["input_ids"][0]
    ids, _ = expand_placeholders(_tokenizer(PIXTRAL)(text)["input_ids"], [media])
    assert ids.tolist() == list(want)


# -- token ids ----------------------------------------------------------------------------------
def test_for_family_uses_the_published_ids() -> None:
    gemma = VisionModel.for_family("gemma3")
    assert gemma.image_token_id == SOFT
    assert dict(gemma.token_ids) == {**GEMMA, **NEWLINES}
    media = gemma.prepare(_images(1, [(300, 700)]))
    assert media.output.tensors()["pixel_values"].shape == (1, 3, 896, 896)
    ids, _ = expand_placeholders([BOI], [media])
    assert ids.tolist() == [108, BOI, *[SOFT] * 256, EOI, 108]
    # pan-and-scan crops need the model's sentence: an error naming it, not a wrong prompt
    cropping = VisionModel.for_family("gemma3", config={"do_pan_and_scan": True})
    with pytest.raises(ProcessorConfigError, match="Here is the original image"):
        cropping.prepare(_images(1, [(300, 700)]))
    pixtral = VisionModel.for_family("pixtral")
    assert (pixtral.image_token_id, dict(pixtral.token_ids)) == (IMG, PIXTRAL)
    ids, _ = expand_placeholders([IMG], [pixtral.prepare(_images(1, [(32, 48)]))])
    assert ids.tolist() == [10, 10, 10, 12, 10, 10, 10, 13]


def test_from_pretrained_reads_ids_and_pieces(tmp_path: Path) -> None:
    # a Gemma 3 directory whose ids differ from the published ones; the pieces come from its
    # tokenizer.json through the tokenizers library
    special = {name: 500 + k for k, name in enumerate(GEMMA)}
    (tmp_path / "preprocessor_config.json").write_text(
        json.dumps(
            {
                "image_processor_type": "Gemma3ImageProcessor",
                "size": {"height": 224, "width": 224},
                "do_pan_and_scan": True,
            }
        )
    )
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "gemma3", "image_token_index": special["<image_soft_token>"]})
    )
    _backend(special).save(str(tmp_path / "tokenizer.json"))
    model = VisionModel.from_pretrained(tmp_path)
    assert model.image_token_id == special["<image_soft_token>"]
    assert model.token_ids["<start_of_image>"] == special["<start_of_image>"]
    assert model.token_ids["\n\n"] == 108
    assert {t: model.token_ids[t] for t in NEWLINES} == NEWLINES
    pieces = _piece_ids()
    for piece, ids in pieces.items():
        assert tuple(np.atleast_1d(model.token_ids[piece]).tolist()) == ids
    media = model.prepare(_images(3, [(300, 700)]))
    expanded, _ = expand_placeholders([special["<start_of_image>"]], [media])
    intro = pieces["Here is the original image \n\n"]
    assert expanded[: len(intro)].tolist() == list(intro)
    assert int((expanded == special["<image_soft_token>"]).sum()) == 3 * 256
    assert media.item_rows == (3,)


def test_bad_grids() -> None:
    gemma = VisionModel.for_family("gemma3").processor._native
    pixtral = VisionModel.for_family("pixtral").processor._native
    ids = sorted(PIXTRAL.items())
    with pytest.raises(ProcessorConfigError, match="image_sizes"):
        pixtral.prompt_replacement([8, 32], ids)
    with pytest.raises(ProcessorConfigError, match=r"\[IMG_BREAK\]"):
        pixtral.prompt_replacement([32, 32], [("[IMG]", 10)])
    with pytest.raises(ProcessorConfigError, match="num_crops"):
        gemma.prompt_replacement([-1], sorted(GEMMA.items()))


# -- newlines next to an anchor merge with the replacement's "\n\n" ------------------------------
JOIN_TEXTS = {
    "chat-template": "<start_of_turn>user\n<start_of_image>describe<end_of_turn>\n",
    "newline-before": "describe \n<start_of_image> compare",
    "two-newlines-before": "describe \n\n<start_of_image> compare",
    "newline-after": "describe <start_of_image>\ncompare",
    "two-newlines-after": "describe <start_of_image>\n\ncompare",
    "both-sides": "\n<start_of_image>\n",
    "text-around": "describe <start_of_image> compare",
    "adjacent-2": "describe\n<start_of_image><start_of_image> compare",
    "adjacent-3": "<start_of_image><start_of_image><start_of_image>",
    "prompt-edges": "<start_of_image>",
}
TURNS = {"<start_of_turn>": 105, "<end_of_turn>": 106}


def _join_tokenizer() -> Any:
    return _tokenizer(
        {**GEMMA, **TURNS},
        boi_token="<start_of_image>",
        eoi_token="<end_of_image>",
        image_token="<image_soft_token>",
    )


@pytest.mark.parametrize("case", list(JOIN_TEXTS))
@pytest.mark.parametrize("pan", [False, True], ids=["plain", "pan-and-scan"])
def test_joins_equal_gemma3_processor(case: str, pan: bool) -> None:
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil
    from transformers.models.gemma3.processing_gemma3 import Gemma3Processor

    text = JOIN_TEXTS[case]
    n = text.count("<start_of_image>")
    sizes = [(300, 700), (20, 30), (1200, 300)][:n]
    media = _gemma(sizes, PAN if pan else SMALL, seed=9)
    out = media.output.tensors()
    processor = Gemma3Processor(
        image_processor=_image_processor(
            {"pixel_values": out["pixel_values"], "num_crops": out["num_crops"]},
            Gemma3ImageProcessorPil,
        ),
        tokenizer=_join_tokenizer(),
    )
    images = [Image.new("RGB", (w, h)) for h, w in sizes]
    want = processor(text=text, images=images, return_tensors=None)["input_ids"][0]
    prompt = _join_tokenizer()(text)["input_ids"]
    ids, ranges = expand_placeholders(prompt, [media])
    assert ids.tolist() == list(want)
    # (a pan-and-scan replacement opens with its sentence, not "\n\n")
    if case in ("chat-template", "newline-before", "newline-after", "both-sides") and not pan:
        assert NEWLINES["\n\n\n"] in ids.tolist()
    if case.startswith(("two-newlines", "adjacent")) and not pan:
        assert NEWLINES["\n\n\n\n"] in ids.tolist()
    # vLLM's ranges: the replacement's length, from the token that holds its first token; the
    # interior is the replacement's own, and adjacent images share the merged token between them
    for (offset, length), (tokens, _) in zip(ranges[0], media.replacements, strict=True):
        assert length == tokens.shape[0]
        assert (ids[offset + 1 : offset + length - 1] == tokens[1:-1]).all()
        opens = (108, 109, 110) if int(tokens[0]) == 108 else (int(tokens[0]),)
        assert int(ids[offset]) in opens
        assert int(ids[offset + length - 1]) in (108, 109, 110)
    starts = [o for o, _ in ranges[0]]
    ends = [o + n - 1 for o, n in ranges[0]]
    if case.startswith("adjacent") and not pan:
        assert all(e == s for e, s in zip(ends, starts[1:], strict=False))
    assert placeholder_ranges(ids, [media]) == ranges
    assert int((ids == SOFT).sum()) == sum(media.token_counts)


def _vllm_merge(ids: list[int]) -> list[int]:
    """vLLM's Gemma3MultiModalProcessor._apply_token_matches after the replacement: "\n" "\n\n"
    and "\n\n" "\n" become "\n\n\n", then "\n\n" "\n\n" becomes "\n\n\n\n" (left to right)."""
    for pair, merged in (((107, 108), 109), ((108, 107), 109), ((108, 108), 110)):
        out: list[int] = []
        i = 0
        while i < len(ids):
            if tuple(ids[i : i + 2]) == pair:
                out.append(merged)
                i += 2
            else:
                out.append(ids[i])
                i += 1
        ids = out
    return ids


@pytest.mark.parametrize("case", list(JOIN_TEXTS))
def test_joins_equal_vllm_merges(case: str) -> None:
    """The same prompts as vLLM merges them after its unmerged replacement."""
    text = JOIN_TEXTS[case]
    media = _gemma([(20, 30)] * text.count("<start_of_image>"), SMALL, seed=3)
    prompt = _join_tokenizer()(text)["input_ids"]
    unmerged: list[int] = []
    for t in prompt:
        unmerged += media.replacements[0][0].tolist() if t == BOI else [t]
    ids, _ = expand_placeholders(prompt, [media])
    assert ids.tolist() == _vllm_merge(unmerged)


@pytest.mark.parametrize("engine", ["vllm", "sglang", "tokenspeed"])
@pytest.mark.parametrize("case", ["chat-template", "adjacent-3", "both-sides"])
def test_joined_round_trips_exact(engine: str, case: str) -> None:
    text = JOIN_TEXTS[case]
    n = text.count("<start_of_image>")
    media = _gemma(GEMMA_SIZES[1 : 1 + n], PAN, seed=4)
    prompt = _join_tokenizer()(text)["input_ids"]
    ids, ranges = expand_placeholders(prompt, [media])
    if engine == "vllm":
        request = vllm_adapter.generate_request("r", prompt, media)
        (batch,) = vllm_adapter.decode_mm_inputs(_wire(request))
        items = list(batch.items)
    elif engine == "sglang":
        request = sglang_adapter.generate_request("r", prompt, media)
        (batch,) = sglang_adapter.decode_mm_inputs(_wire(request))
        items = list(batch.items)
    else:
        request = ts_adapter.generate_request("r", prompt, media)
        items = [b.items[0] for b in ts_adapter.decode_mm_inputs(_wire(request))]
    assert list(request.message.tokenized.input_ids) == ids.tolist()
    assert [tuple(item.placeholder) for item in items] == ranges[0]
    sizes_as = None if engine == "vllm" else "patches_per_image"
    for i, item in enumerate(items):
        for name, original in media.item_tensors(i).items():
            got = sizes_as if sizes_as is not None and name == media.sizes_key else name
            # TokenSpeed's default wire dtype for pixel_values is bfloat16
            bf16 = item.tensors[got].dtype == ml_dtypes.bfloat16
            _same(item.tensors[got], original.astype(ml_dtypes.bfloat16) if bf16 else original)
        _, embed = media.replacements[i]
        assert item.embed_mask is not None
        assert (item.embed_mask == embed).all()
        offset, length = item.placeholder
        # the embedding positions are exactly the image tokens of the expanded prompt
        assert (ids[offset : offset + length][embed] == SOFT).all()
        assert int((ids[offset : offset + length] == SOFT).sum()) == media.token_counts[i]
