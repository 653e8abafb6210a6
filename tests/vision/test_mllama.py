"""Llama 3.2 Vision (``MllamaImageProcessorPil``, transformers 5.24): ``vision.ImageProcessor``
against transformers, live and byte for byte — tiles on the best canvas, black padding, the
unused tile slots, ``aspect_ratio_ids``, ``aspect_ratio_mask``, ``num_tiles``; configuration
errors; and ``MllamaProcessor``'s prompt (``<|image|>`` 128256 stays one token) against our
placeholder expansion. The builders' refusal of this cross-attention family is tested in
``tests/engines/test_every_family.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.parity import (
    IMAGE_CASES,
    META,
    MLLAMA_HUB,
    assert_matches,
    check_batches,
    check_files,
    check_options,
    check_pil_inputs,
    check_raw_arrays,
    configs_of,
    encode,
    hf_processor,
    our_processor,
    pattern,
    reference_mark,
    run_hf,
)

from smg_grpc_proto.engines import VisionModel, expand_placeholders
from smg_grpc_proto.errors import ProcessorConfigError
from smg_grpc_proto.vision import ImageProcessor

pytest.importorskip("transformers", reason="the reference is transformers")
pytest.importorskip("PIL", reason="the reference resizer is Pillow")

from PIL import Image
from transformers import MllamaImageProcessorPil

pytestmark = reference_mark()

CONFIGS = configs_of("mllama")


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("name", IMAGE_CASES)
def test_files(corpus: dict[str, Path], config: str, name: str) -> None:
    """Encoded files: our decoder + processor vs ``load_image`` + the PIL backend."""
    check_files(corpus, config, name)


@pytest.mark.parametrize("config", ["mllama-hub"])
@pytest.mark.parametrize("name", IMAGE_CASES)
def test_pil_inputs(corpus: dict[str, Path], config: str, name: str) -> None:
    check_pil_inputs(corpus, config, name)


@pytest.mark.parametrize("channels", [1, 2, 4])
def test_raw_arrays(channels: int) -> None:
    check_raw_arrays("mllama-hub", channels)


@pytest.mark.parametrize("config", CONFIGS)
def test_batches(corpus: dict[str, Path], config: str) -> None:
    """A flat batch is one sample: ``(1, B, tiles, 3, s, s)``, in order, any thread count."""
    check_batches(corpus, config)


OPTIONS: list[Any] = [
    ("mllama", {"max_image_tiles": 1}),
    ("mllama", {"max_image_tiles": 2, "size": {"height": 100, "width": 100}}),
    ("mllama", {"max_image_tiles": 6, "size": {"height": 64, "width": 64}}),
    ("mllama", {"max_image_tiles": 9, "size": 50}),
    ("mllama", {"resample": 3, "size": {"height": 448, "width": 448}}),  # bicubic
    ("mllama", {"resample": 0}),  # nearest
    ("mllama", {"do_normalize": False}),
    ("mllama", {"do_rescale": False, "do_normalize": False}),
    (
        "mllama",
        {"rescale_factor": 0.5, "image_mean": [0.1, 0.2, 0.3], "image_std": [2.0, 0.4, 0.9]},
    ),
]


@pytest.mark.parametrize(("family", "options"), OPTIONS, ids=lambda v: str(v))
def test_options(family: str, options: dict[str, Any]) -> None:
    check_options(family, options)


# (height, width): a pixel, strips both ways (a side floor()-ed to 0 becomes 1), one tile
# exactly, canvas multiples, just above and below a tile, odd sizes, beyond the largest canvas.
SIZES = [
    (1, 1),
    (1, 3000),
    (3000, 1),
    (2, 2000),
    (560, 560),
    (560, 1120),
    (1120, 560),
    (1120, 1120),
    (559, 561),
    (561, 559),
    (37, 23),
    (300, 500),
    (900, 400),
    (1080, 1920),
    (3000, 2000),
    (100, 2241),
]


@pytest.mark.parametrize(("height", "width"), SIZES)
def test_sizes(height: int, width: int) -> None:
    """Odd shapes as arrays and PNG bytes, with the published config and the class defaults."""
    array = pattern(height, width, 23)
    png = encode(Image.fromarray(array), "PNG")
    for config in CONFIGS:
        ref = run_hf(hf_processor(config), array, input_data_format="channels_last")
        ours = our_processor(config)
        out = ours(array)
        assert_matches(out, ref, f"{config} {height}x{width} array")
        assert_matches(ours(png), ref, f"{config} {height}x{width} bytes")
        assert set(out.tensors()) == set(ref)
        assert out.num_image_tokens == (1,)


def test_random_shapes_in_one_batch() -> None:
    rng = np.random.default_rng(5)
    shapes = [(int(h), int(w)) for h, w in rng.integers(1, 1800, size=(12, 2))]
    images = [pattern(h, w, i) for i, (h, w) in enumerate(shapes)]
    ref = run_hf(hf_processor("mllama-hub"), images, input_data_format="channels_last")
    out = our_processor("mllama-hub")(images)
    assert_matches(out, ref, f"random batch {shapes}")
    assert out.pixel_values is not None
    assert out.pixel_values.shape[:3] == (1, 12, 4)
    assert out.num_image_tokens == (1,) * 12


def test_recognised_and_defaults() -> None:
    for suffix in ("", "Fast", "Pil"):
        ours = ImageProcessor.from_pretrained(
            {"image_processor_type": f"MllamaImageProcessor{suffix}"}
        )
        assert ours.family == "mllama"
    defaults = ImageProcessor.for_family("mllama").config
    ref = MllamaImageProcessorPil()
    assert defaults["size"] == {"height": ref.size["height"], "width": ref.size["width"]}
    assert defaults["max_image_tiles"] == ref.max_image_tiles


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"do_pad": False}, "do_pad"),
        ({"do_resize": False}, "do_resize"),
        ({"size": {"height": 560, "width": 448}}, "size"),
        ({"max_image_tiles": 0}, "max_image_tiles"),
        ({"max_image_tiles": 65}, "max_image_tiles"),
        ({"size": 4000, "max_image_tiles": 20}, "size"),
    ],
)
def test_config_errors(config: dict[str, Any], field: str) -> None:
    with pytest.raises(ProcessorConfigError, match=field):
        ImageProcessor.from_pretrained({"image_processor_type": "MllamaImageProcessor", **config})


# ---- the prompt: MllamaProcessor keeps <|image|> as one token -------------------------------

HUB = {k: v for k, v in MLLAMA_HUB.items() if k not in META}
SPECIAL = {"<|begin_of_text|>": 128000, "<|python_tag|>": 128010, "<|image|>": 128256}


def _processor() -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.models.mllama.processing_mllama import MllamaProcessor

    vocab = {"<unk>": 0, "describe": 1, "and": 2, "compare": 3, **SPECIAL}
    backend = Tokenizer(models.WordLevel(vocab, "<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="<unk>",
        bos_token="<|begin_of_text|>",
        additional_special_tokens=list(SPECIAL),
    )
    return MllamaProcessor(image_processor=MllamaImageProcessorPil(**HUB), tokenizer=tokenizer)


@pytest.mark.parametrize(
    ("text", "sizes"),
    [
        ("<|image|> describe", [(300, 500)]),
        ("<|image|> <|image|> compare", [(300, 500), (900, 400)]),
        ("describe <|image|> and <|image|> and <|image|>", [(40, 40), (1200, 1200), (10, 900)]),
    ],
)
def test_prompt_as_mllama_processor(text: str, sizes: list[tuple[int, int]]) -> None:
    """Our expansion of the un-expanded prompt is ``MllamaProcessor``'s ``input_ids``: each
    ``<|image|>`` stays one token (128256), which takes no embedding; the pixels, ids and masks
    are the processor's too."""
    images = [pattern(h, w, i) for i, (h, w) in enumerate(sizes)]
    processor = _processor()
    ref = processor(images=images, text=text, return_tensors="np")
    model = VisionModel.for_family("mllama", config=HUB)
    assert model.image_token_id == 128256
    media = model.prepare(images)
    prompt = processor.tokenizer(processor.prepare_inputs_layout(text=text)[1][0])["input_ids"]
    ids, ranges = expand_placeholders(prompt, [media])
    assert ids.tolist() == ref["input_ids"][0].tolist()
    assert ids.tolist() == prompt
    for i, (offset, length) in enumerate(ranges[0]):
        assert length == 1
        assert ids[offset] == 128256
        tokens, embed = media.replacements[i]
        assert tokens.tolist() == [128256]
        assert embed.tolist() == [False]
    assert media.token_counts == (0,) * len(sizes)
    out = media.output
    for name in ("pixel_values", "aspect_ratio_ids", "aspect_ratio_mask"):
        np.testing.assert_array_equal(getattr(out, name), ref[name])
    assert out.num_image_tokens == (1,) * len(sizes)
    # the engine layout: the sample dimension dropped, one entry per image
    tensors = media.tensors()
    assert tensors["pixel_values"].shape[:2] == (len(sizes), 4)
    assert tensors["num_tiles"].tolist() == [int(n) for n in out.num_tiles[0]]


def test_model_directory(tmp_path: Path) -> None:
    """A Llama 3.2 Vision directory: the published preprocessor config and ``config.json``'s
    ``image_token_index`` 128256 (``MllamaConfig``'s default)."""
    import json

    (tmp_path / "preprocessor_config.json").write_text(json.dumps(MLLAMA_HUB))
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "mllama", "image_token_index": 128256})
    )
    model = VisionModel.from_pretrained(tmp_path)
    assert model.family == "mllama"
    assert model.image_token_id == 128256
    assert model.processor.config["size"] == {"height": 560, "width": 560}
    media = model.prepare([pattern(300, 500, 1)])
    assert media.anchor == 128256
    ref = run_hf(
        hf_processor("mllama-hub"), [pattern(300, 500, 1)], input_data_format="channels_last"
    )
    assert_matches(media.output, ref, "from_pretrained")
