"""Idefics3 and SmolVLM (``Idefics3ImageProcessorPil``, ``SmolVLMImageProcessorPil``):
``vision.ImageProcessor`` against transformers, live and bit for bit — every input kind and
option, the two resizes, tiles and global image, rows/cols and token counts, configuration
errors, the CLI. The reference, the test images and the comparison: ``support/parity.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.parity import (
    IDEFICS3_HUB,
    IMAGE_CASES,
    SMOLVLM_HUB,
    assert_matches,
    assert_same,
    check_batches,
    check_files,
    check_options,
    check_pil_inputs,
    check_raw_arrays,
    configs_of,
    encode,
    hf_classes,
    hf_load,
    hf_processor,
    our_processor,
    pattern,
    reference_mark,
    run_hf,
)

from smg_grpc_proto.errors import (
    ProcessorConfigError,
)
from smg_grpc_proto.vision import ImageProcessor

pytest.importorskip("transformers", reason="the reference is transformers")
pytest.importorskip("PIL", reason="the reference resizer is Pillow")

from PIL import Image
from transformers import Idefics3ImageProcessorPil, SmolVLMImageProcessorPil
from transformers.models.idefics3.processing_idefics3 import Idefics3Processor
from transformers.models.smolvlm.processing_smolvlm import (
    get_image_prompt_string,
)

pytestmark = reference_mark()


# ---- parity on every input kind (the checks are support.parity's) ------------------------


@pytest.mark.parametrize("config", configs_of("idefics3", "smolvlm"))
@pytest.mark.parametrize("name", IMAGE_CASES)
def test_files(corpus: dict[str, Path], config: str, name: str) -> None:
    """Encoded files: our decoder + processor vs ``load_image`` + the PIL backend."""
    check_files(corpus, config, name)


@pytest.mark.parametrize("config", ["idefics3-defaults"])
@pytest.mark.parametrize("name", IMAGE_CASES)
def test_pil_inputs(corpus: dict[str, Path], config: str, name: str) -> None:
    """PIL images and encoded bytes with ``alpha="white"``."""
    check_pil_inputs(corpus, config, name)


@pytest.mark.parametrize("config", ["smolvlm-hub"])
@pytest.mark.parametrize("channels", [1, 2, 4])
def test_raw_arrays(config: str, channels: int) -> None:
    """1- and 4-channel arrays (transformers' ``convert_to_rgb`` for numpy)."""
    check_raw_arrays(config, channels)


@pytest.mark.slow
@pytest.mark.parametrize("config", configs_of("idefics3", "smolvlm"))
def test_batches(corpus: dict[str, Path], config: str) -> None:
    """Images of mixed sizes and kinds in one call (processed in parallel, in order)."""
    check_batches(corpus, config)


OPTIONS: list[Any] = [  # (family, options), some as pytest.param(..., marks=slow)
    ("idefics3", {"size": {"longest_edge": 500}, "max_image_size": {"longest_edge": 100}}),
    ("idefics3", {"size": {"longest_edge": 333}, "max_image_size": {"longest_edge": 111}}),
    ("idefics3", {"size": {"longest_edge": 99}, "max_image_size": {"longest_edge": 100}}),
    pytest.param(
        "idefics3",
        {"size": {"longest_edge": 4500}, "max_image_size": {"longest_edge": 1000}},
        marks=pytest.mark.slow,
    ),
    ("idefics3", {"do_image_splitting": False}),
    ("idefics3", {"do_image_splitting": False, "max_image_size": {"longest_edge": 97}}),
    ("idefics3", {"do_pad": False, "size": {"longest_edge": 300}}),
    ("idefics3", {"do_resize": False, "max_image_size": {"longest_edge": 64}}),
    ("idefics3", {"resample": 3, "size": {"longest_edge": 400}}),  # bicubic
    ("idefics3", {"resample": 2, "do_image_splitting": False}),  # bilinear
    ("idefics3", {"resample": 0, "size": {"longest_edge": 301}}),  # nearest, odd
    ("idefics3", {"do_normalize": False, "size": {"longest_edge": 200}}),
    ("idefics3", {"do_rescale": False, "do_normalize": False, "do_image_splitting": False}),
    (
        "idefics3",
        {"rescale_factor": 0.5, "image_mean": [0.1, 0.2, 0.3], "image_std": [2.0, 0.4, 0.9]},
    ),
    ("smolvlm", {}),
    pytest.param(
        "smolvlm",
        {"size": {"longest_edge": 2048}, "max_image_size": {"longest_edge": 512}},
        marks=pytest.mark.slow,
    ),
    ("smolvlm", {"size": {"longest_edge": 1536}, "max_image_size": {"longest_edge": 384}}),
    ("smolvlm", {"do_image_splitting": False, "max_image_size": {"longest_edge": 384}}),
    ("smolvlm", {"resample": 4, "size": {"longest_edge": 256}}),  # box
    ("smolvlm", {"resample": 5, "size": {"longest_edge": 257}}),  # hamming
]


@pytest.mark.parametrize(("family", "options"), OPTIONS, ids=lambda v: str(v))
def test_options(family: str, options: dict[str, Any]) -> None:
    """Other filters, sizes, crops, paddings and switches, on a batch of two sizes."""
    check_options(family, options)


# ---- Idefics3 / SmolVLM details: two resizes, tiles, global image, rows/cols, tokens -------

IDEFICS3_CONFIGS = ("idefics3-defaults", "idefics3-nosplit", "smolvlm-hub")
# (height, width): tiny, thin (a side int()-ed to 0 becomes 1), exact tile multiples, one
# tile exactly, odd sizes whose other side is rounded up to even, beyond MAX_IMAGE_SIZE.
IDEFICS3_SIZES = [
    (1, 1),
    (1, 3),
    (1, 3000),
    (3000, 1),
    (2, 2000),
    (364, 364),
    (364, 728),
    (728, 364),
    (1456, 1456),
    (1092, 1456),
    (512, 2048),
    (363, 365),
    (999, 1001),
    (10, 20),
    (37, 23),
    (500, 1500),
    (1080, 1920),
    (5000, 300),
]


def _idefics3_token_count(ref: Any, index: int, image_seq_len: int) -> int:
    """``Idefics3Processor.replace_image_token`` run on transformers' own ``rows``/``cols``, on
    a processor given just the attributes it reads (its ``__init__`` needs a tokenizer)."""
    processor = Idefics3Processor.__new__(Idefics3Processor)
    processor.image_seq_len = image_seq_len
    processor.fake_image_token = "<fake_token_around_image>"
    processor.image_token = "<image>"
    processor.global_image_tag = "<global-img>"
    text = processor.replace_image_token({"rows": ref["rows"], "cols": ref["cols"]}, index)
    # SmolVLMProcessor writes the same string.
    rows, cols = ref["rows"][0][index], ref["cols"][0][index]
    smol = get_image_prompt_string(
        rows, cols, image_seq_len, "<fake_token_around_image>", "<image>", "<global-img>"
    )
    assert smol == text
    assert text.count("<global-img>") == 1
    return int(text.count("<image>"))


@pytest.mark.slow
@pytest.mark.parametrize(("height", "width"), IDEFICS3_SIZES)
def test_idefics3_sizes(height: int, width: int) -> None:
    """Odd sizes, as arrays and as PNG bytes, split and not, with transformers' rows/cols and
    the processors' ``<image>`` count."""
    array = pattern(height, width, 61)
    png = encode(Image.fromarray(array), "PNG")
    for config in IDEFICS3_CONFIGS:
        ref = run_hf(hf_processor(config), array, input_data_format="channels_last")
        ours = our_processor(config)
        out = ours(array)
        assert_matches(out, ref, f"{config} {height}x{width} array")
        assert_matches(ours(png), ref, f"{config} {height}x{width} bytes")
        assert set(out.tensors()) == set(ref)
        assert out.num_image_tokens == (_idefics3_token_count(ref, 0, 169),)


@pytest.mark.slow
@pytest.mark.parametrize("config", IDEFICS3_CONFIGS)
def test_idefics3_batches_and_tokens(corpus: dict[str, Path], config: str) -> None:
    """A flat batch of mixed sizes and kinds is one sample: every image's tiles and global
    image in order, the (no-op) padding's all-ones mask, rows/cols per image."""
    names = [
        "grace_hopper.jpg",
        "wide-3x600.png",
        "rgba.png",
        "tall-3000x500.jpg",
        "big-1500x2000.jpg",
    ]
    loaded = [hf_load(corpus[n]) for n in names]
    ref = run_hf(hf_processor(config), loaded)
    ours = our_processor(config)
    paths = [str(corpus[n]) for n in names]
    out = ours(paths)
    assert_matches(out, ref, f"{config} batch")
    mixed: list[Any] = [corpus[names[0]].read_bytes(), np.asarray(loaded[1]), loaded[2], *paths[3:]]
    assert_matches(ours(mixed, threads=1), ref, f"{config} mixed inputs")
    assert out.pixel_attention_mask is not None
    assert out.pixel_attention_mask.dtype == np.int64
    assert bool((out.pixel_attention_mask == 1).all())
    want = tuple(_idefics3_token_count(ref, i, 169) for i in range(len(names)))
    assert out.num_image_tokens == want
    assert out.rows is not None
    assert out.cols is not None
    tiles = sum(r * c + (r > 0) or 1 for r, c in zip(out.rows[0], out.cols[0], strict=True))
    assert out.pixel_values is not None
    assert out.pixel_values.shape[1] == tiles


def test_idefics3_family_defaults_and_smolvlm() -> None:
    """The two classes have the same defaults and the same pixels; ours too."""
    a, b = Idefics3ImageProcessorPil(), SmolVLMImageProcessorPil()
    for key in ("size", "max_image_size", "image_mean", "image_std", "do_image_splitting"):
        assert getattr(a, key) == getattr(b, key), key
    assert int(a.resample) == int(b.resample) == 1
    assert a.size["longest_edge"] == 1456
    assert a.max_image_size["longest_edge"] == 364
    ours_a, ours_b = ImageProcessor.for_family("idefics3"), ImageProcessor.for_family("smolvlm")
    assert ours_a.config == ours_b.config
    assert ours_a.config["size"] == {"longest_edge": 1456}
    assert ours_a.config["max_image_size"] == {"longest_edge": 364}
    assert ours_a.config["image_seq_len"] == 169


def test_idefics3_from_pretrained(tmp_path: Path) -> None:
    """The family from every backend's class name; a model directory's processor_config.json
    supplies image_seq_len."""
    classes = (("Idefics3ImageProcessor", "idefics3"), ("SmolVLMImageProcessor", "smolvlm"))
    for base, family in classes:
        for suffix in ("", "Fast", "Pil"):
            ours = ImageProcessor.from_pretrained({"image_processor_type": f"{base}{suffix}"})
            assert ours.family == family
    hub = ImageProcessor.from_pretrained(IDEFICS3_HUB)
    assert hub.config == ImageProcessor.for_family("idefics3").config
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(SMOLVLM_HUB))
    (tmp_path / "processor_config.json").write_text(
        json.dumps({"image_seq_len": 64, "processor_class": "SmolVLMProcessor"})
    )
    ours = ImageProcessor.from_pretrained(tmp_path)
    assert ours.family == "smolvlm"
    assert ours.config["image_seq_len"] == 64
    array = pattern(400, 1300, 62)
    ref = run_hf(hf_processor("smolvlm-hub"), array, input_data_format="channels_last")
    out = ours(array)
    assert_matches(out, ref, "model directory")
    assert out.num_image_tokens == (_idefics3_token_count(ref, 0, 64),)


IDEFICS3_BAD: list[tuple[dict[str, Any], str]] = [
    ({"size": {"height": 100, "width": 100}}, "size"),  # transformers accepts; we refuse
    ({"size": {"longest_edge": 0}}, "size"),
    ({"size": {"shortest_edge": 10}}, "size"),
    ({"max_image_size": {"longest_edge": 0}}, "max_image_size"),
    ({"max_image_size": {"longest_edge": 5000}}, "max_image_size"),
    ({"max_image_size": {"height": 10, "width": 10}}, "max_image_size"),
    ({"max_image_size": 364}, "max_image_size"),
    ({"do_image_splitting": 1}, "do_image_splitting"),
    ({"do_pad": "yes"}, "do_pad"),
    ({"image_seq_len": 0}, "image_seq_len"),
    ({"resample": 9}, "resample"),
]


@pytest.mark.parametrize(("config", "field"), IDEFICS3_BAD, ids=str)
@pytest.mark.parametrize("family", ["idefics3", "smolvlm"])
def test_idefics3_config_errors(family: str, config: dict[str, Any], field: str) -> None:
    with pytest.raises(ProcessorConfigError, match=field) as err:
        ImageProcessor(family, config)  # type: ignore[arg-type]
    assert err.value.field == field


@pytest.mark.parametrize("family", ["idefics3", "smolvlm"])
def test_idefics3_cli(corpus: dict[str, Path], tmp_path: Path, family: str) -> None:
    """``smg-proto preprocess --family idefics3|smolvlm`` writes transformers' tensors."""
    from smg_grpc_proto import cli

    names = ["grace_hopper.jpg", "odd-37x23.png"]
    out = tmp_path / f"{family}.npz"
    paths = [str(corpus[n]) for n in names]
    assert cli.main(["preprocess", *paths, "--family", family, "--out", str(out)]) == 0
    ref = run_hf(hf_classes()[family](), [hf_load(p) for p in paths])
    with np.load(out) as written:
        for key in ("pixel_values", "pixel_attention_mask", "rows", "cols"):
            assert_same(written[key], ref[key], f"cli {key}")
