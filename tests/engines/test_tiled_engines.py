"""InternVL, Idefics3 and SmolVLM through the engine builders: tiles mapped to items, each image
anchor expanded exactly as transformers' processor writes it, every engine's round trip
byte-exact."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, ClassVar

import ml_dtypes
import numpy as np
import pytest
from PIL import Image

from smg_grpc_proto import tensors
from smg_grpc_proto.engines import PreparedMedia, VisionModel, _decoded, expand_placeholders
from smg_grpc_proto.engines import sglang as sglang_adapter
from smg_grpc_proto.engines import tokenspeed as ts_adapter
from smg_grpc_proto.engines import vllm as vllm_adapter
from smg_grpc_proto.errors import MultimodalError, ProcessorConfigError

# OpenGVLab/InternVL3-*-hf: Qwen2.5-VL's tokenizer + <img>, </img>, <IMG_CONTEXT>.
INTERNVL = {"<img>": 151665, "</img>": 151666, "<IMG_CONTEXT>": 151667}
# HuggingFaceM4/Idefics3-8B-Llama3: Llama 3 + three added tokens; the rest is Llama 3 text.
IDEFICS3 = {
    "<fake_token_around_image>": 128256,
    "<image>": 128257,
    "<": 27,
    ">": 29,
    "row": 654,
    "_": 62,
    "_col": 10422,
    "global": 9951,
    "-img": 21743,
    "\n": 198,
    "\n\n": 271,
    **{
        str(n): i
        for n, i in zip(
            range(1, 17), [*range(16, 25), 605, 806, 717, 1032, 975, 868, 845], strict=False
        )
    },
}
# SmolVLM-256M/500M and SmolVLM2 (SmolLM2 tokenizers; "\n\n" between added tokens is 1116).
SMOLVLM = {
    "<fake_token_around_image>": 49189,
    "<image>": 49190,
    "<global-img>": 49152,
    "\n": 198,
    **{
        f"<row_{r}_col_{c}>": 49153 + (r - 1) * 6 + (c - 1)
        for r in range(1, 7)
        for c in range(1, 7)
    },
}
SMOL_DOUBLE_NEWLINE = 1116

ANCHOR = {"internvl": 151667, "idefics3": 128257, "smolvlm": 49190}
SIZES = {
    # 1 tile (no thumbnail); 2 x 1 + thumbnail; 3 x 3 + thumbnail
    "internvl": [(448, 448), (448, 896), (1000, 1000)],
    # without do_resize: not split (no larger than a tile); 2 x 3 + global; 4 x 4 + global
    "idefics3": [(364, 364), (500, 900), (1456, 1456)],
    "smolvlm": [(300, 300), (600, 1100), (2048, 1600)],
}
# Idefics3's class defaults resize every image up to 4 x 4 tiles; without resizing, small
# images stay whole. SmolVLM as its published 256M/500M checkpoints: 512-px tiles, 64 tokens.
CONFIG: dict[str, dict[str, Any]] = {
    "internvl": {},
    "idefics3": {"do_resize": False},
    "smolvlm": {"do_resize": False, "max_image_size": {"longest_edge": 512}, "image_seq_len": 64},
}


def _images(seed: int, sizes: list[tuple[int, int]]) -> list[np.ndarray[Any, Any]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in sizes]


def _model(family: str) -> VisionModel:
    return VisionModel.for_family(family, config=CONFIG[family])  # type: ignore[arg-type]


def _media(family: str, sizes: list[tuple[int, int]], seed: int = 0) -> PreparedMedia:
    return _model(family).prepare(_images(seed, sizes))


def _prompt(family: str, n: int) -> list[int]:
    ids = [1, 17]
    for k in range(n):
        ids += [ANCHOR[family], 30 + k]
    return [*ids, 2]


def _wire(request: tensors.TensorMessage[Any]) -> tensors.TensorMessage[Any]:
    return tensors.parse(tensors.serialize(request), type(request.message))


def _same(decoded: np.ndarray[Any, Any], original: np.ndarray[Any, Any]) -> None:
    assert decoded.dtype == original.dtype, (decoded.dtype, original.dtype)
    assert decoded.shape == original.shape
    assert np.ascontiguousarray(decoded).tobytes() == np.ascontiguousarray(original).tobytes()


def _tiles(family: str, media: PreparedMedia) -> list[int]:
    out = media.output
    if family == "internvl":
        assert out.num_patches is not None
        return [int(n) for n in out.num_patches]
    assert out.rows is not None
    assert out.cols is not None
    return [int(r) * int(c) + 1 for r, c in zip(out.rows[0], out.cols[0], strict=True)]


def _check_items(
    family: str,
    media: PreparedMedia,
    ids: np.ndarray[Any, Any],
    items: Any,
    *,
    bf16: bool = False,
    sizes_name: str | None = None,
) -> None:
    for i, item in enumerate(items):
        for name, original in media.item_tensors(i, sizes_name).items():
            want = (
                original.astype(ml_dtypes.bfloat16) if bf16 and name == "pixel_values" else original
            )
            _same(item.tensors[name], want)
        assert item.tensors["pixel_values"].shape[0] == _tiles(family, media)[i]
        offset, length = item.placeholder
        tokens, embed = media.replacements[i]
        assert length == tokens.shape[0]
        assert (ids[offset : offset + length] == tokens).all()
        assert item.embed_mask is not None
        assert (item.embed_mask == embed).all()
        assert (item.embed_mask == (tokens == ANCHOR[family])).all()
        assert int(item.embed_mask.sum()) == media.token_counts[i]


FAMILIES = ["internvl", "idefics3", "smolvlm"]


# -- items vs tiles --------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_tiles_map_to_items(family: str) -> None:
    media = _media(family, SIZES[family])
    assert media.item_rows == tuple(_tiles(family, media))
    flat = {"pixel_values"} if family == "internvl" else {"pixel_values", "pixel_attention_mask"}
    sizes = "image_num_patches" if family == "internvl" else "num_patches"
    layout = media.layout()
    assert {n for n, kind in layout.items() if kind == "flat"} == flat
    assert media.tensors()[sizes].tolist() == list(media.item_rows)
    pixels = media.tensors()["pixel_values"]
    assert pixels.shape[0] == sum(media.item_rows)
    starts = np.cumsum([0, *media.item_rows])
    for i in range(media.count):
        _same(media.item_tensors(i)["pixel_values"], pixels[starts[i] : starts[i + 1]])
    assert (media.anchor, media.token_id) == (ANCHOR[family], ANCHOR[family])


def test_tile_counts() -> None:
    assert _media("internvl", SIZES["internvl"]).item_rows == (1, 3, 10)
    assert _media("idefics3", SIZES["idefics3"]).item_rows == (1, 7, 17)
    assert _media("smolvlm", SIZES["smolvlm"]).item_rows == (1, 7, 17)
    # Idefics3's class defaults: every image resized up to 1456 px, 4 x 4 tiles + global.
    assert VisionModel.for_family("idefics3").prepare(_images(0, [(300, 300)])).item_rows == (17,)


# -- every engine's round trip ---------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize(
    ("transport", "dtype"), [("inline", None), ("shm", None), ("shm", "bfloat16")]
)
def test_vllm_round_trip_exact(family: str, transport: str, dtype: str | None) -> None:
    media = _media(family, SIZES[family], seed=3)
    request = vllm_adapter.generate_request(
        "r",
        _prompt(family, 3),
        media,
        transport=transport,
        dtype=dtype,
        shm_min_bytes=0,  # type: ignore[arg-type]
    )
    assert bool(request.shm_segments) == (transport == "shm")
    mm = request.message.mm_inputs
    sizes = "image_num_patches" if family == "internvl" else "num_patches"
    assert dict(mm.flat_keys)["pixel_values"] == sizes
    assert mm.im_token_id == ANCHOR[family]
    (batch,) = vllm_adapter.decode_mm_inputs(_wire(request))
    assert batch.sizes["pixel_values"] == media.item_rows
    ids = np.asarray(request.message.tokenized.input_ids)
    _check_items(family, media, ids, batch.items, bf16=dtype is not None)
    assert [s for s in request.shm_segments if os.path.exists(f"/dev/shm/{s}")] == []


@pytest.mark.parametrize("family", FAMILIES)
def test_sglang_round_trip_exact(family: str) -> None:
    media = _media(family, SIZES[family][1:], seed=4)
    request = sglang_adapter.generate_request("r", _prompt(family, 2), media)
    assert request.message.mm_inputs.im_token_id == ANCHOR[family]
    (batch,) = sglang_adapter.decode_mm_inputs(_wire(request))
    ids = np.asarray(request.message.tokenized.input_ids)
    _check_items(family, media, ids, batch.items, sizes_name=_decoded.SIZES_KEY)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize(("transport", "dtype"), [("inline", None), ("shm", "bfloat16")])
def test_tokenspeed_round_trip_exact(family: str, transport: str, dtype: str | None) -> None:
    media = _media(family, SIZES[family], seed=5)
    request = ts_adapter.generate_request(
        "r",
        _prompt(family, 3),
        media,
        transport=transport,
        dtype=dtype,
        shm_min_bytes=0,  # type: ignore[arg-type]
    )
    items = request.message.mm_inputs.items
    assert [item.placeholder_token_id for item in items] == [ANCHOR[family]] * 3
    batches = ts_adapter.decode_mm_inputs(_wire(request))
    ids = np.asarray(request.message.tokenized.input_ids)
    for i, b in enumerate(batches):
        item = b.items[0]
        for name, original in media.item_tensors(i, _decoded.SIZES_KEY).items():
            want = (
                original.astype(ml_dtypes.bfloat16)
                if dtype and name == "pixel_values"
                else original
            )
            _same(item.tensors[name], want)
        offset, length = item.placeholder
        tokens, embed = media.replacements[i]
        assert (ids[offset : offset + length] == tokens).all()
        assert item.embed_mask is not None
        assert (item.embed_mask == embed).all()
    assert [s for s in request.shm_segments if os.path.exists(f"/dev/shm/{s}")] == []


# -- the expanded prompt is transformers' -----------------------------------------------------
class _Outputs:
    """An image processor (transformers' needs torch here) that hands back our outputs, whose
    bit-exactness tests/vision covers."""

    @staticmethod
    def make(outputs: dict[str, Any]) -> Any:
        from transformers import BatchFeature
        from transformers.image_processing_utils import BaseImageProcessor
        from transformers.processing_utils import ImagesKwargs

        class Kwargs(ImagesKwargs, total=False):  # type: ignore[misc]
            # what InternVLProcessor / Idefics3Processor pass their image processor
            crop_to_patches: bool
            return_row_col_info: bool

        class Outputs(BaseImageProcessor):  # type: ignore[misc]
            model_input_names: ClassVar[list[str]] = ["pixel_values"]
            valid_kwargs = Kwargs

            def __call__(self, images: Any, **kwargs: Any) -> Any:
                return BatchFeature(dict(outputs))

            preprocess = __call__

            def fetch_images(self, images: Any) -> Any:
                return images

        return Outputs()


def _word_tokenizer(vocab: dict[str, int], special: list[str], **kwargs: Any) -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({"<unk>": 0, **vocab}, "<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", additional_special_tokens=special, **kwargs
    )


@pytest.mark.parametrize("sizes", [[(448, 448)], [(1000, 1000)], SIZES["internvl"]])
def test_input_ids_equal_internvl_processor(sizes: list[tuple[int, int]]) -> None:
    from transformers.models.internvl.processing_internvl import InternVLProcessor

    media = _media("internvl", sizes, seed=7)
    out = media.output
    vocab = {"describe": 1, "and": 2, "<video>": 151670, **INTERNVL}
    tokenizer = _word_tokenizer(
        vocab,
        [*INTERNVL, "<video>"],
        extra_special_tokens={
            "start_image_token": "<img>",
            "end_image_token": "</img>",
            "context_image_token": "<IMG_CONTEXT>",
            "video_token": "<video>",
        },
    )

    class Processor(InternVLProcessor):  # type: ignore[misc]
        # the video processor's class check needs torch; no video here
        def check_argument_for_proper_class(self, name: str, argument: Any) -> None:
            return None

    processor = Processor(
        image_processor=_Outputs.make(
            {"pixel_values": np.asarray(out.pixel_values), "num_patches": out.num_patches}
        ),
        tokenizer=tokenizer,
    )
    text = "describe " + " and ".join(["<IMG_CONTEXT>"] * len(sizes))
    images = [Image.new("RGB", (w, h)) for h, w in sizes]
    want = processor(text=text, images=images)["input_ids"][0]
    ids, _ = expand_placeholders(tokenizer(text)["input_ids"], [media])
    assert ids.tolist() == list(want)


def _llama3_piece_tokenizer() -> Any:
    """A BPE tokenizer splitting text as Llama 3 does (its pre-tokenizer pattern) whose merges
    give Idefics3's replacement pieces at their Llama 3 ids."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    pattern = (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
        r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    )
    words = ["row", "_col", "global", "-img", "\n\n", *[str(n) for n in range(10, 17)]]
    vocab: dict[str, int] = {"<unk>": 0}
    merges: list[tuple[str, str]] = []
    spare = 200000

    def add(token: str, token_id: int | None = None) -> None:
        nonlocal spare
        if token not in vocab:
            if token_id is None:
                spare += 1
                token_id = spare
            vocab[token] = token_id

    for name, token_id in IDEFICS3.items():
        if len(name) == 1:
            add(name, token_id)
    for word in words:
        for ch in word:
            add(ch)
        left = word[0]
        for ch in word[1:]:
            merges.append((left, ch))
            add(left + ch, IDEFICS3.get(left + ch) if left + ch == word else None)
            left += ch
    added = ["<fake_token_around_image>", "<image>", "<end_of_utterance>"]
    vocab.update(
        {"<fake_token_around_image>": 128256, "<image>": 128257, "<end_of_utterance>": 128258}
    )
    backend = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", additional_special_tokens=added
    )


@pytest.mark.parametrize(
    "sizes", [[(364, 364)], [(500, 900)], SIZES["idefics3"]], ids=["1-tile", "2x3", "3-images"]
)
def test_input_ids_equal_idefics3_processor(sizes: list[tuple[int, int]]) -> None:
    from transformers.models.idefics3.processing_idefics3 import Idefics3Processor

    media = _media("idefics3", sizes, seed=8)
    out = media.output
    tokenizer = _llama3_piece_tokenizer()
    outputs = {"pixel_values": np.asarray(out.pixel_values), "rows": out.rows, "cols": out.cols}
    processor = Idefics3Processor(
        image_processor=_Outputs.make(outputs), tokenizer=tokenizer, image_seq_len=169
    )
    text = "row" + "global".join(["<image>"] * len(sizes)) + "_col"
    images = [Image.new("RGB", (w, h)) for h, w in sizes]
    want = processor(text=text, images=images)["input_ids"][0]
    ids, _ = expand_placeholders(tokenizer(text)["input_ids"], [media])
    assert ids.tolist() == list(want)


@pytest.mark.parametrize("sizes", [[(300, 300)], [(600, 1100)], SIZES["smolvlm"]])
def test_input_ids_equal_smolvlm_prompt_string(sizes: list[tuple[int, int]]) -> None:
    """SmolVLMProcessor needs num2words (not installed here); its replace_image_token is
    get_image_prompt_string, tokenized by a tokenizer holding SmolVLM's added tokens."""
    from transformers.models.smolvlm.processing_smolvlm import get_image_prompt_string

    media = _media("smolvlm", sizes, seed=9)
    out = media.output
    assert out.rows is not None
    assert out.cols is not None
    vocab = {"describe": 1, "\n": 198, "\n\n": SMOL_DOUBLE_NEWLINE, **SMOLVLM}
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({"<unk>": 0, **vocab}, "<unk>"))
    specials = [t for t in SMOLVLM if t.startswith("<")]
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", additional_special_tokens=specials
    )
    pieces = ["describe"]
    for r, c in zip(out.rows[0], out.cols[0], strict=True):
        pieces.append(
            get_image_prompt_string(
                int(r), int(c), 64, "<fake_token_around_image>", "<image>", "<global-img>"
            )
        )
    want = tokenizer("".join(pieces))["input_ids"]
    prompt = tokenizer("describe" + "<image>" * len(sizes))["input_ids"]
    ids, _ = expand_placeholders(prompt, [media])
    assert ids.tolist() == list(want)


# -- token ids -------------------------------------------------------------------------------
def test_for_family_uses_the_published_ids() -> None:
    internvl = VisionModel.for_family("internvl")
    assert internvl.image_token_id == 151667
    assert dict(internvl.token_ids) == INTERNVL
    idefics3 = VisionModel.for_family("idefics3")
    assert idefics3.processor.config["image_seq_len"] == 169
    assert idefics3.image_token_id == 128257
    assert dict(idefics3.token_ids) == IDEFICS3
    smolvlm = _model("smolvlm")
    assert smolvlm.image_token_id == 49190
    assert dict(smolvlm.token_ids) == {**SMOLVLM, "\n\n": SMOL_DOUBLE_NEWLINE}
    # a SmolVLM-Instruct (v1) style tokenizer without the id of "\n\n": only images that are
    # not split can be expanded
    bare = VisionModel.for_family("smolvlm", config=CONFIG["smolvlm"])
    object.__setattr__(bare, "token_ids", {k: v for k, v in bare.token_ids.items() if k != "\n\n"})
    assert bare.prepare(_images(1, [(300, 300)])).item_rows == (1,)
    with pytest.raises((MultimodalError, ProcessorConfigError), match="\n\n"):
        bare.prepare(_images(1, [(600, 1100)]))


def test_from_pretrained_reads_token_ids(tmp_path: Path) -> None:
    (tmp_path / "preprocessor_config.json").write_text(
        json.dumps({"image_processor_type": "Idefics3ImageProcessor", "image_seq_len": 4})
    )
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "idefics3", "image_token_id": 900})
    )
    added = [{"id": 901, "content": "<fake_token_around_image>"}, {"id": 900, "content": "<image>"}]
    vocab = {"<": 3, ">": 4, "row": 5, "_": 6, "_col": 7, "global": 8, "-img": 9, "Ċ": 10, "ĊĊ": 11}
    vocab.update({str(n): 100 + n for n in range(1, 17)})
    (tmp_path / "tokenizer.json").write_text(
        json.dumps({"added_tokens": added, "model": {"type": "BPE", "vocab": vocab}})
    )
    model = VisionModel.from_pretrained(tmp_path)
    assert model.image_token_id == 900
    assert model.token_ids["\n\n"] == 11
    assert model.token_ids["row"] == 5
    media = model.prepare(_images(2, [(500, 900)]))
    expanded, _ = expand_placeholders([900], [media])
    assert expanded.tolist()[:8] == [901, 3, 5, 6, 101, 7, 6, 101]
    assert 11 in expanded.tolist()
