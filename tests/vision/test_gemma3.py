"""Gemma 3 (``Gemma3ImageProcessorPil`` as ``Gemma3Processor`` runs it): ``vision.ImageProcessor``
against transformers, live and bit for bit — every input kind and option, pan-and-scan,
``num_crops`` and token counts, configuration errors, the CLI. The reference, the test images
and the comparison: ``support/parity.py``.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from support.parity import (
    CLIP_MEAN,
    CLIP_STD,
    GEMMA3_HUB,
    IMAGE_CASES,
    assert_matches,
    assert_same,
    check_batches,
    check_files,
    check_options,
    check_pil_inputs,
    check_raw_arrays,
    configs_of,
    encode,
    gemma3_hf,
    gemma3_processor_defaults,
    hf_load,
    hf_processor,
    our_processor,
    pattern,
    reference_mark,
    run_hf,
)

from smg_grpc_proto.errors import (
    BatchShapeError,
    ImageShapeError,
    ProcessorConfigError,
)
from smg_grpc_proto.vision import ImageProcessor

pytest.importorskip("transformers", reason="the reference is transformers")
pytest.importorskip("PIL", reason="the reference resizer is Pillow")

from PIL import Image
from transformers.models.gemma3.processing_gemma3 import Gemma3Processor

pytestmark = reference_mark()


# ---- parity on every input kind (the checks are support.parity's) ------------------------


@pytest.mark.parametrize("config", configs_of("gemma3"))
@pytest.mark.parametrize("name", IMAGE_CASES)
def test_files(corpus: dict[str, Path], config: str, name: str) -> None:
    """Encoded files: our decoder + processor vs ``load_image`` + the PIL backend."""
    check_files(corpus, config, name)


@pytest.mark.parametrize("config", ["gemma3-pas"])
@pytest.mark.parametrize("name", IMAGE_CASES)
def test_pil_inputs(corpus: dict[str, Path], config: str, name: str) -> None:
    """PIL images and encoded bytes with ``alpha="white"``."""
    check_pil_inputs(corpus, config, name)


@pytest.mark.parametrize("config", ["gemma3-hub"])
@pytest.mark.parametrize("channels", [1, 2, 4])
def test_raw_arrays(config: str, channels: int) -> None:
    """1- and 4-channel arrays (transformers' ``convert_to_rgb`` for numpy)."""
    check_raw_arrays(config, channels)


@pytest.mark.slow
@pytest.mark.parametrize("config", configs_of("gemma3"))
def test_batches(corpus: dict[str, Path], config: str) -> None:
    """Images of mixed sizes and kinds in one call (processed in parallel, in order)."""
    check_batches(corpus, config)


OPTIONS: list[tuple[str, dict[str, Any]]] = [
    ("gemma3", {"size": {"height": 224, "width": 224}}),  # the class's own default size
    ("gemma3", {"size": 300}),  # an int is {"height": 300, "width": 300} here
    ("gemma3", {"size": [120, 200], "resample": 3}),  # bicubic
    ("gemma3", {"resample": 1, "size": 100}),  # lanczos
    ("gemma3", {"resample": 0}),  # nearest
    ("gemma3", {"resample": 4, "size": {"height": 50, "width": 70}}),  # box
    ("gemma3", {"resample": 5, "size": 130}),  # hamming
    ("gemma3", {"do_resize": False}),
    ("gemma3", {"do_normalize": False, "size": 64}),
    ("gemma3", {"do_rescale": False, "do_normalize": False, "size": 64}),
    (
        "gemma3",
        {"rescale_factor": 0.5, "image_mean": [0.1, 0.2, 0.3], "image_std": [2.0, 0.4, 0.9]},
    ),
    ("gemma3", {"image_mean": CLIP_MEAN, "image_std": CLIP_STD, "size": 336}),
    ("gemma3", {"do_pan_and_scan": True}),  # crops below 256: none
    ("gemma3", {"do_pan_and_scan": True, "pan_and_scan_min_crop_size": 40, "size": 64}),
    ("gemma3", {"do_pan_and_scan": True, "pan_and_scan_min_crop_size": 100, "size": 80}),
    (
        "gemma3",
        {
            "do_pan_and_scan": True,
            "pan_and_scan_min_crop_size": 30,
            "pan_and_scan_max_num_crops": 2,
            "pan_and_scan_min_ratio_to_activate": 2.0,
            "size": 50,
        },
    ),
    (
        "gemma3",
        {
            "do_pan_and_scan": True,
            "pan_and_scan_min_crop_size": 1,
            "pan_and_scan_min_ratio_to_activate": 1.0,
            "resample": 3,
            "size": 32,
        },
    ),
    (
        "gemma3",
        {
            "do_pan_and_scan": True,
            "pan_and_scan_max_num_crops": 1,
            "pan_and_scan_min_crop_size": 50,
        },
    ),
    ("gemma3", {"do_pan_and_scan": True, "pan_and_scan_min_ratio_to_activate": 3}),  # an int
    # Unbounded integers: no cap on the count; a minimum crop no image reaches.
    (
        "gemma3",
        {
            "do_pan_and_scan": True,
            "pan_and_scan_min_crop_size": 9,
            "pan_and_scan_max_num_crops": 10**9,
            "size": 24,
        },
    ),
    ("gemma3", {"do_pan_and_scan": True, "pan_and_scan_min_crop_size": 10**12}),
    (
        "gemma3",
        {
            "do_pan_and_scan": True,
            "pan_and_scan_min_crop_size": 20,
            "pan_and_scan_max_num_crops": 9,
        },
    ),
]


@pytest.mark.parametrize(("family", "options"), OPTIONS, ids=lambda v: str(v))
def test_options(family: str, options: dict[str, Any]) -> None:
    """Other filters, sizes, crops, paddings and switches, on a batch of two sizes."""
    check_options(family, options)


# ---- Gemma 3 details: pan-and-scan, num_crops, tokens -------------------------------------

GEMMA3_CONFIGS = ("gemma3-hub", "gemma3-pas")
# (height, width): tiny, thin, exactly the size, around the 1.2 ratio, around the 256 crops.
GEMMA3_SIZES = [
    (1, 1),
    (1, 3000),
    (3000, 1),
    (2, 2000),
    (896, 896),
    (895, 897),
    (500, 599),
    (500, 601),
    (256, 512),
    (255, 512),
    (300, 700),
    (300, 1000),  # three crops, the last clipped to 332 columns
    (1000, 300),
    (1024, 255),
    (300, 3000),
    (3000, 500),
    (1500, 2000),
]


def _gemma3_token_count(ref: Any, index: int, image_seq_length: int) -> int:
    """``Gemma3Processor.replace_image_token`` run on transformers' own output: its
    ``__init__`` builds the image sequence from a stand-in tokenizer (then refuses it as not a
    real tokenizer, after the attributes the method needs are set)."""
    tokenizer = SimpleNamespace(
        boi_token="<start_of_image>",
        eoi_token="<end_of_image>",
        image_token="<image_soft_token>",
        boi_token_id=255999,
    )
    processor = Gemma3Processor.__new__(Gemma3Processor)
    with contextlib.suppress(TypeError):
        Gemma3Processor.__init__(
            processor,
            image_processor=gemma3_hf(),
            tokenizer=tokenizer,
            image_seq_length=image_seq_length,
        )
    text = processor.replace_image_token({"num_crops": ref["num_crops"].tolist()}, index)
    return int(text.count("<image_soft_token>"))


@pytest.mark.slow
@pytest.mark.parametrize(("height", "width"), GEMMA3_SIZES)
def test_gemma3_sizes(height: int, width: int) -> None:
    """Odd sizes, as arrays and as PNG bytes, pan-and-scan off and on (the processor's
    defaults), with transformers' ``num_crops`` and ``Gemma3Processor``'s token count."""
    array = pattern(height, width, 41)
    png = encode(Image.fromarray(array), "PNG")
    for config in GEMMA3_CONFIGS:
        ref = run_hf(hf_processor(config), array, input_data_format="channels_last")
        ours = our_processor(config)
        out = ours(array)
        assert_matches(out, ref, f"{config} {height}x{width} array")
        assert_matches(ours(png), ref, f"{config} {height}x{width} bytes")
        assert out.num_image_tokens == (_gemma3_token_count(ref, 0, 256),)


@pytest.mark.parametrize(
    ("height", "width", "min_crop"), [(2, 9, 2), (1, 1, 1), (9, 2, 2), (3, 40, 1)]
)
def test_gemma3_empty_crops(height: int, width: int, min_crop: int) -> None:
    """With a tiny minimum crop, the last window starts past the image: numpy gives an empty
    crop and Pillow resizes it to black. We do the same."""
    array = pattern(height, width, 42)
    options = {
        "do_pan_and_scan": True,
        "pan_and_scan_min_crop_size": min_crop,
        "pan_and_scan_min_ratio_to_activate": 1.0,
        "pan_and_scan_max_num_crops": 40,
        "size": 16,
    }
    ref = run_hf(gemma3_hf(**options), array, input_data_format="channels_last")
    out = ImageProcessor("gemma3", options)(array)
    assert_matches(out, ref, f"{height}x{width} empty crops")
    assert int(out.num_crops[0]) >= 2  # type: ignore[index]


@pytest.mark.slow
@pytest.mark.parametrize("config", GEMMA3_CONFIGS)
def test_gemma3_batches_and_tokens(corpus: dict[str, Path], config: str) -> None:
    """A batch of mixed sizes and kinds: each image followed by its own crops, in order."""
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
    assert set(out.tensors()) == {"pixel_values", "num_crops"}
    mixed: list[Any] = [corpus[names[0]].read_bytes(), np.asarray(loaded[1]), loaded[2], *paths[3:]]
    assert_matches(ours(mixed, threads=1), ref, f"{config} mixed inputs")
    want = tuple(_gemma3_token_count(ref, i, 256) for i in range(len(names)))
    assert out.num_image_tokens == want
    if config == "gemma3-pas":
        assert out.num_crops is not None
        # 3 x 600 would make crops 3 high, below 256; 1500 x 2000 is a 1.33 landscape.
        assert out.num_crops.tolist() == [0, 0, 0, 4, 2]


def test_gemma3_resize_off() -> None:
    """``do_resize`` off: equal sizes stack; crops (smaller than their image) cannot, in
    transformers or here."""
    same = [pattern(60, 150, 1), pattern(60, 150, 2)]
    hf = gemma3_hf(do_resize=False)
    ref = run_hf(hf, same, input_data_format="channels_last")
    assert_matches(ImageProcessor("gemma3", {"do_resize": False})(same), ref, "no resize")
    options = {"do_resize": False, "do_pan_and_scan": True, "pan_and_scan_min_crop_size": 20}
    with pytest.raises(ValueError, match="inhomogeneous"):
        run_hf(gemma3_hf(**options), same, input_data_format="channels_last")
    with pytest.raises(BatchShapeError, match="crops"):
        ImageProcessor("gemma3", options)(same)
    # An empty crop (see test_gemma3_empty_crops) cannot be kept unresized.
    tiny = {**options, "pan_and_scan_min_crop_size": 2, "pan_and_scan_max_num_crops": 9}
    with pytest.raises(ImageShapeError, match="pan-and-scan crop") as caught:
        ImageProcessor("gemma3", tiny)([same[0], pattern(2, 9, 3)])
    assert caught.value.index == 1


def test_gemma3_from_pretrained(tmp_path: Path) -> None:
    """The family from every backend's class name; the hub file's nulls keep the processor's
    defaults; a model directory's processor_config.json supplies image_seq_length."""
    for suffix in ("", "Fast", "Pil"):
        ours = ImageProcessor.from_pretrained(
            {"image_processor_type": f"Gemma3ImageProcessor{suffix}"}
        )
        assert ours.family == "gemma3"
    hub = ImageProcessor.from_pretrained(GEMMA3_HUB)
    assert hub.config == ImageProcessor.for_family("gemma3").config
    assert (
        hub.config["pan_and_scan_min_crop_size"]
        == gemma3_processor_defaults()["pan_and_scan_min_crop_size"]
    )
    # Keys Gemma3ImageProcessorPil._preprocess ignores are ignored.
    ignored = ImageProcessor.from_pretrained(
        {**GEMMA3_HUB, "do_center_crop": True, "crop_size": 10, "do_pad": True}
    )
    assert ignored.config == hub.config
    (tmp_path / "preprocessor_config.json").write_text(
        json.dumps({**GEMMA3_HUB, "do_pan_and_scan": True})
    )
    (tmp_path / "processor_config.json").write_text(
        json.dumps({"image_seq_length": 64, "processor_class": "Gemma3Processor"})
    )
    ours = ImageProcessor.from_pretrained(tmp_path)
    assert ours.config["image_seq_length"] == 64
    array = pattern(400, 1300, 43)
    ref = run_hf(hf_processor("gemma3-pas"), array, input_data_format="channels_last")
    out = ours(array)
    assert_matches(out, ref, "model directory")
    assert out.num_crops is not None
    assert out.num_crops.tolist() == [3]
    assert out.num_image_tokens == (_gemma3_token_count(ref, 0, 64),) == (256,)
    # The preprocessor config alone: its own image_seq_length.
    alone = ImageProcessor.from_pretrained({**GEMMA3_HUB, "image_seq_length": 128})(array)
    assert alone.num_image_tokens == (128,)


GEMMA3_BAD: list[tuple[dict[str, Any], str, type[BaseException] | None]] = [
    # (config, the field named, what transformers raises on it with pan-and-scan, if it does)
    ({"pan_and_scan_min_crop_size": 0}, "pan_and_scan_min_crop_size", ZeroDivisionError),
    ({"pan_and_scan_min_crop_size": -5}, "pan_and_scan_min_crop_size", None),
    ({"pan_and_scan_min_crop_size": 256.5}, "pan_and_scan_min_crop_size", None),
    ({"pan_and_scan_max_num_crops": 0}, "pan_and_scan_max_num_crops", ZeroDivisionError),
    ({"pan_and_scan_max_num_crops": -1}, "pan_and_scan_max_num_crops", None),
    ({"pan_and_scan_max_num_crops": 2.5}, "pan_and_scan_max_num_crops", None),
    ({"pan_and_scan_max_num_crops": True}, "pan_and_scan_max_num_crops", None),
    (
        {"pan_and_scan_min_ratio_to_activate": "1.2"},
        "pan_and_scan_min_ratio_to_activate",
        TypeError,
    ),
    (
        {"pan_and_scan_min_ratio_to_activate": float("nan")},
        "pan_and_scan_min_ratio_to_activate",
        None,
    ),
    (
        {"pan_and_scan_min_ratio_to_activate": [1.2]},
        "pan_and_scan_min_ratio_to_activate",
        TypeError,
    ),
    ({"do_pan_and_scan": "yes"}, "do_pan_and_scan", None),
    ({"image_seq_length": 0}, "image_seq_length", None),
    ({"size": {"height": 896}}, "size", ValueError),
    ({"size": {"height": 0, "width": 896}}, "size", ValueError),
    ({"size": {"height": 70000, "width": 896}}, "size", None),
    ({"resample": 9}, "resample", None),
    ({"image_mean": [0.5, 0.5]}, "image_mean", None),
    ({"rescale_factor": float("inf")}, "rescale_factor", None),
]


@pytest.mark.parametrize(("config", "field", "hf_error"), GEMMA3_BAD, ids=str)
def test_gemma3_config_errors(
    config: dict[str, Any], field: str, hf_error: type[BaseException] | None
) -> None:
    with pytest.raises(ProcessorConfigError) as caught:
        ImageProcessor("gemma3", config)
    assert caught.value.field == field
    assert str(caught.value).startswith(f"config {field}:")
    if hf_error is not None:
        with pytest.raises(hf_error):
            run_hf(
                gemma3_hf(**config),
                pattern(40, 130, 1),
                input_data_format="channels_last",
                do_pan_and_scan=True,
            )


def test_gemma3_cli(corpus: dict[str, Path], tmp_path: Path) -> None:
    """``smg-proto preprocess --family gemma3`` writes transformers' tensors, num_crops too."""
    from smg_grpc_proto import cli

    names = ["grace_hopper.jpg", "odd-37x23.png", "small-50x80.png"]
    out = tmp_path / "gemma3.npz"
    paths = [str(corpus[n]) for n in names]
    assert cli.main(["preprocess", *paths, "--family", "gemma3", "--out", str(out)]) == 0
    ref = run_hf(hf_processor("gemma3-defaults"), [hf_load(p) for p in paths])
    with np.load(out) as written:
        for key in ("pixel_values", "num_crops"):
            assert_same(written[key], ref[key], f"cli {key}")
