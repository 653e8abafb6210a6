"""``vision.ImageProcessor`` against transformers' PIL backend, live and bit for bit.

Reference: ``transformers==5.24.0`` (its PIL-backend classes ``Qwen2VLImageProcessorPil``,
``CLIPImageProcessorPil``, ``LlavaImageProcessorPil``, ``SiglipImageProcessorPil``,
``LlavaNextImageProcessorPil``, ``PixtralImageProcessorPil``, ``Gemma3ImageProcessorPil``,
``GotOcr2ImageProcessorPil`` for InternVL, ``Idefics3ImageProcessorPil``,
``SmolVLMImageProcessorPil``, constructed directly with the config as keyword
arguments) with ``pillow==13.0.0`` — both pinned in pyproject's ``test`` dependency group;
other versions skip the module (Pillow 12 resizes differently, so its bytes are not these).
Nothing is frozen from elsewhere: every expected tensor is computed here, in this process, by
transformers.

Every comparison is exact: same dtype, same shape and the same bytes (``tobytes()``) for
``pixel_values`` and every side tensor; a failure reports the largest difference and how many
values differ. Inputs go in every way a user passes them: encoded files (our decoder vs
transformers' ``load_image``: EXIF transpose + ``convert("RGB")``), decoded RGB arrays, raw
1- and 4-channel arrays (transformers' ``convert_to_rgb`` for arrays) and PIL images.

Videos have no PIL backend in transformers (``Qwen2VLVideoProcessor`` needs torchvision); their
reference is the PIL image backend's per-frame ``resize``/``rescale``/``normalize`` followed by
``Qwen2VLVideoProcessor.patchify``'s view/permute transcribed to numpy.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import io
import json
import os
import pickle
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest

transformers = pytest.importorskip("transformers", reason="the reference is transformers")
PIL = pytest.importorskip("PIL", reason="the reference resizer is Pillow")

from PIL import Image, ImageOps  # noqa: E402
from support import images  # noqa: E402
from transformers import (  # noqa: E402
    CLIPImageProcessorPil,
    Gemma3ImageProcessorPil,
    GotOcr2ImageProcessorPil,
    Idefics3ImageProcessorPil,
    LlavaImageProcessorPil,
    LlavaNextImageProcessorPil,
    PixtralImageProcessorPil,
    Qwen2VLImageProcessorPil,
    SiglipImageProcessorPil,
    SmolVLMImageProcessorPil,
)
from transformers.image_transforms import convert_to_rgb  # noqa: E402
from transformers.image_utils import (  # noqa: E402
    IMAGENET_DEFAULT_MEAN,
    IMAGENET_DEFAULT_STD,
    load_image,
)
from transformers.models.gemma3.processing_gemma3 import Gemma3Processor  # noqa: E402
from transformers.models.idefics3.processing_idefics3 import Idefics3Processor  # noqa: E402
from transformers.models.internvl.processing_internvl import InternVLProcessor  # noqa: E402
from transformers.models.llava_next.processing_llava_next import LlavaNextProcessor  # noqa: E402
from transformers.models.smolvlm.processing_smolvlm import (  # noqa: E402
    get_image_prompt_string,
)

from smg_grpc_proto import _native  # noqa: E402
from smg_grpc_proto.errors import (  # noqa: E402
    IMAGE_PROCESSING_ERRORS,
    AspectRatioError,
    BatchShapeError,
    ImageProcessingError,
    ImageShapeError,
    ProcessingLimitError,
    ProcessorConfigError,
    SmgProtoError,
    TruncatedImageError,
    VideoShapeError,
)
from smg_grpc_proto.vision import (  # noqa: E402
    ImageProcessor,
    ProcessorOutput,
    VisionTokens,
    buffer_cache,
)

TRANSFORMERS_VERSION = "5.24.0"
PILLOW_VERSION = "13.0.0"

pytestmark = pytest.mark.skipif(
    (transformers.__version__, PIL.__version__) != (TRANSFORMERS_VERSION, PILLOW_VERSION),
    reason=f"the reference is transformers {TRANSFORMERS_VERSION} with Pillow {PILLOW_VERSION}, "
    f"found {transformers.__version__} with {PIL.__version__}",
)

CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]

# Published preprocessor_config.json files (values as in the model repositories).
QWEN2_HUB = {  # Qwen/Qwen2-VL-7B-Instruct (Qwen2.5-VL-7B-Instruct has the same values)
    "min_pixels": 3136,
    "max_pixels": 12845056,
    "patch_size": 14,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": CLIP_MEAN,
    "image_std": CLIP_STD,
    "image_processor_type": "Qwen2VLImageProcessor",
    "processor_class": "Qwen2VLProcessor",
}
QWEN3_HUB = {  # Qwen/Qwen3-VL-*, Qwen/Qwen3.5-*
    "size": {"longest_edge": 16777216, "shortest_edge": 65536},
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "processor_class": "Qwen3VLProcessor",
    "image_processor_type": "Qwen2VLImageProcessorFast",
}
CLIP_336 = {  # openai/clip-vit-large-patch14-336 (legacy int sizes)
    "crop_size": 336,
    "do_center_crop": True,
    "do_normalize": True,
    "do_resize": True,
    "feature_extractor_type": "CLIPFeatureExtractor",
    "image_mean": CLIP_MEAN,
    "image_std": CLIP_STD,
    "resample": 3,
    "size": 336,
    "image_processor_type": "CLIPImageProcessor",
}
LLAVA_PAD_336 = {  # LLaVA-1.5 with the original "pad" aspect mode
    "crop_size": {"height": 336, "width": 336},
    "size": {"shortest_edge": 336},
    "do_pad": True,
    "image_processor_type": "LlavaImageProcessor",
}
SIGLIP_384 = {  # google/siglip-so400m-patch14-384
    "do_normalize": True,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "resample": 3,
    "rescale_factor": 0.00392156862745098,
    "size": {"height": 384, "width": 384},
    "image_processor_type": "SiglipImageProcessor",
    "processor_class": "SiglipProcessor",
}
LLAVA_NEXT_336 = {  # llava-hf/llava-v1.6-mistral-7b-hf
    "crop_size": {"height": 336, "width": 336},
    "do_center_crop": True,
    "do_normalize": True,
    "do_pad": True,
    "do_rescale": True,
    "do_resize": True,
    "image_grid_pinpoints": [[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]],
    "image_mean": CLIP_MEAN,
    "image_std": CLIP_STD,
    "resample": 3,
    "rescale_factor": 0.00392156862745098,
    "size": {"shortest_edge": 336},
    "image_processor_type": "LlavaNextImageProcessor",
}
PIXTRAL_1540 = {  # the values quoted for Mistral-Small-3.1's preprocessor_config.json
    "crop_size": None,
    "default_to_square": True,
    "do_center_crop": None,
    "do_convert_rgb": True,
    "do_normalize": True,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": CLIP_MEAN,
    "image_std": CLIP_STD,
    "patch_size": {"height": 14, "width": 14},
    "resample": 3,
    "rescale_factor": 0.00392156862745098,
    "size": {"longest_edge": 1540},
    "image_processor_type": "PixtralImageProcessor",
    "processor_class": "PixtralProcessor",
}

GEMMA3_HUB = {  # the values quoted for google/gemma-3-{4b,12b,27b}-it's preprocessor_config.json
    "do_convert_rgb": None,
    "do_normalize": True,
    "do_pan_and_scan": None,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_processor_type": "Gemma3ImageProcessor",
    "image_seq_length": 256,
    "image_std": [0.5, 0.5, 0.5],
    "pan_and_scan_max_num_crops": None,
    "pan_and_scan_min_crop_size": None,
    "pan_and_scan_min_ratio_to_activate": None,
    "processor_class": "Gemma3Processor",
    "resample": 2,
    "rescale_factor": 0.00392156862745098,
    "size": {"height": 896, "width": 896},
}
# What Gemma3Processor hands its image processor when the config says null: its own
# images_kwargs (read from the installed class, not copied).
GEMMA3_PROCESSOR_DEFAULTS = {
    k: v for k, v in Gemma3Processor.images_kwargs.items() if "pan_and_scan" in k
}


def gemma3_hf(**kwargs: Any) -> Any:
    """``Gemma3ImageProcessorPil`` as a published Gemma 3 checkpoint runs it: the hub's size and
    filter, ``Gemma3Processor``'s pan-and-scan defaults, then ``kwargs`` (``None`` keeps the
    default, as our configuration does)."""
    base = {"size": GEMMA3_HUB["size"], "resample": GEMMA3_HUB["resample"]}
    given = {k: v for k, v in kwargs.items() if v is not None}
    return Gemma3ImageProcessorPil(**{**base, **GEMMA3_PROCESSOR_DEFAULTS, **given})


# The values quoted for OpenGVLab/InternVL3-{1B,2B,8B}-hf's preprocessor_config.json.
INTERNVL_HUB = {
    "crop_size": None,
    "crop_to_patches": False,  # InternVLProcessor passes crop_to_patches=True over it
    "data_format": "channels_first",
    "default_to_square": True,
    "do_center_crop": None,
    "do_convert_rgb": True,
    "do_normalize": True,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.485, 0.456, 0.406],
    "image_processor_type": "GotOcr2ImageProcessorFast",
    "image_std": [0.229, 0.224, 0.225],
    "max_patches": 12,
    "min_patches": 1,
    "processor_class": "InternVLProcessor",
    "resample": 3,
    "rescale_factor": 0.00392156862745098,
    "size": {"height": 448, "width": 448},
}
_INTERNVL_FILE_ONLY = ("crop_size", "data_format", "default_to_square", "do_center_crop")
# What InternVLProcessor hands its image processor on every call (read from the installed
# class): crop_to_patches=True.
INTERNVL_PROCESSOR_DEFAULTS = dict(InternVLProcessor.images_kwargs)


def internvl_hf(**kwargs: Any) -> Any:
    """``GotOcr2ImageProcessorPil`` as a published InternVL checkpoint runs it under
    ``InternVLProcessor``: the hub's size, filter and mean/std, the processor's
    ``crop_to_patches``, then ``kwargs`` (``None`` keeps the default, as ours does)."""
    base = {
        "size": INTERNVL_HUB["size"],
        "resample": INTERNVL_HUB["resample"],
        "image_mean": INTERNVL_HUB["image_mean"],
        "image_std": INTERNVL_HUB["image_std"],
    }
    given = {k: v for k, v in kwargs.items() if v is not None and k not in _INTERNVL_FILE_ONLY}
    return GotOcr2ImageProcessorPil(**{**base, **INTERNVL_PROCESSOR_DEFAULTS, **given})


def _with_rows_cols(cls: Any) -> Any:
    """The class, called with ``return_row_col_info=True`` (what ``Idefics3Processor`` and
    ``SmolVLMProcessor`` ask for), so that ``rows``/``cols`` are compared too."""

    def make(**kwargs: Any) -> Any:
        hf = cls(**kwargs)
        return lambda *args, **call: hf(*args, return_row_col_info=True, **call)

    return make


# Shaped as the published Idefics3 and SmolVLM preprocessor_config.json files (the
# sizes of HuggingFaceM4/Idefics3-8B-Llama3 and of the SmolVLM2 checkpoints).
IDEFICS3_HUB = {
    "do_convert_rgb": True,
    "do_image_splitting": True,
    "do_normalize": True,
    "do_pad": True,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_processor_type": "Idefics3ImageProcessor",
    "image_std": [0.5, 0.5, 0.5],
    "max_image_size": {"longest_edge": 364},
    "processor_class": "Idefics3Processor",
    "resample": 1,
    "rescale_factor": 0.00392156862745098,
    "size": {"longest_edge": 1456},
}
SMOLVLM_HUB = {
    **IDEFICS3_HUB,
    "image_processor_type": "SmolVLMImageProcessor",
    "processor_class": "SmolVLMProcessor",
    "max_image_size": {"longest_edge": 512},
    "size": {"longest_edge": 2048},
}
_IDEFICS3_FILE_ONLY = ("do_convert_rgb",)


HF_CLASSES: dict[str, Any] = {
    "qwen2_vl": Qwen2VLImageProcessorPil,
    "qwen2_5_vl": Qwen2VLImageProcessorPil,
    "qwen3_vl": Qwen2VLImageProcessorPil,
    "qwen3_5": Qwen2VLImageProcessorPil,
    "clip": CLIPImageProcessorPil,
    "llava": LlavaImageProcessorPil,
    "siglip": SiglipImageProcessorPil,
    "llava_next": LlavaNextImageProcessorPil,
    "pixtral": PixtralImageProcessorPil,
    "gemma3": gemma3_hf,
    "internvl": internvl_hf,
    "idefics3": _with_rows_cols(Idefics3ImageProcessorPil),
    "smolvlm": _with_rows_cols(SmolVLMImageProcessorPil),
}
_META = ("image_processor_type", "processor_class", "feature_extractor_type")

# name -> (family, config or None for the family's class defaults)
CONFIGS: dict[str, tuple[str, dict[str, Any] | None]] = {
    "qwen2-defaults": ("qwen2_vl", None),
    "qwen2-hub": ("qwen2_vl", QWEN2_HUB),
    "qwen3-hub": ("qwen2_vl", QWEN3_HUB),
    "clip-defaults": ("clip", None),
    "clip-336": ("clip", CLIP_336),
    "llava-pad-336": ("llava", LLAVA_PAD_336),
    "siglip-defaults": ("siglip", None),
    "siglip-384": ("siglip", SIGLIP_384),
    "llava_next-defaults": ("llava_next", None),
    "llava_next-336": ("llava_next", LLAVA_NEXT_336),
    "pixtral-defaults": ("pixtral", None),
    "pixtral-1540": ("pixtral", PIXTRAL_1540),
    "gemma3-defaults": ("gemma3", None),
    "gemma3-hub": ("gemma3", GEMMA3_HUB),
    "gemma3-pas": ("gemma3", {**GEMMA3_HUB, "do_pan_and_scan": True}),
    "internvl-defaults": ("internvl", None),
    # The hub file read alone (no InternVLProcessor): one 448 x 448 image, no tiles.
    "internvl-single": (
        "internvl",
        {k: v for k, v in INTERNVL_HUB.items() if k != "processor_class"},
    ),
    "idefics3-defaults": ("idefics3", None),
    "idefics3-nosplit": ("idefics3", {**IDEFICS3_HUB, "do_image_splitting": False}),
    "smolvlm-hub": ("smolvlm", SMOLVLM_HUB),
}
QWEN_CONFIGS = ("qwen2-defaults", "qwen2-hub", "qwen3-hub")


def hf_processor(name: str) -> Any:
    family, config = CONFIGS[name]
    kwargs = {k: v for k, v in (config or {}).items() if k not in _META}
    return HF_CLASSES[family](**kwargs)


def our_processor(name: str, **kwargs: Any) -> ImageProcessor:
    family, config = CONFIGS[name]
    if config is None:
        return ImageProcessor.for_family(family, **kwargs)  # type: ignore[arg-type]
    return ImageProcessor.from_pretrained(config, **kwargs)


# ---- test images -------------------------------------------------------------------------


def _pattern(height: int, width: int, seed: int) -> np.ndarray:
    """Gradients plus noise: every resampling tap matters."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack(
        [x * 255 // max(width - 1, 1), y * 255 // max(height - 1, 1), (x * 7 + y * 3) % 256],
        axis=-1,
    )
    noise = rng.integers(0, 256, (height, width, 3))
    return ((base * 3 + noise) // 4).astype(np.uint8)


def _encode(image: Image.Image, fmt: str, **params: Any) -> bytes:
    buf = io.BytesIO()
    image.save(buf, fmt, **params)
    return buf.getvalue()


def _exif(orientation: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return exif.tobytes()


def _synthetic() -> dict[str, bytes]:
    rgb = Image.fromarray(_pattern(61, 83, 1))
    alpha = np.fromfunction(lambda y, x: (x * 5 + y * 3) % 256, (61, 83)).astype(np.uint8)
    rgba = Image.fromarray(np.dstack([_pattern(61, 83, 2), alpha]), "RGBA")
    palette = rgb.quantize(64)
    palette_trns = palette.copy()
    palette_trns.info["transparency"] = 3
    gray16 = Image.fromarray(_pattern(45, 70, 3)[..., 0].astype(np.uint16) * 257)
    levels = Image.fromarray((_pattern(40, 52, 17)[..., 0] // 64 * 60).astype(np.uint8))
    bilevel = levels.point(lambda v: 255 if v >= 120 else 0).convert("1")
    gray16_levels = Image.fromarray(np.asarray(levels).astype(np.uint16) * 4)
    photo = Image.open(io.BytesIO(images.grace_hopper()))
    photo.load()
    return {
        "rgb-1x1.png": _encode(Image.fromarray(_pattern(1, 1, 4)), "PNG"),
        "rgb-10x10.png": _encode(Image.fromarray(_pattern(10, 10, 5)), "PNG"),
        "odd-37x23.png": _encode(Image.fromarray(_pattern(37, 23, 6)), "PNG"),
        "odd-259x194.jpg": _encode(Image.fromarray(_pattern(259, 194, 7)), "JPEG", quality=90),
        "wide-3x600.png": _encode(Image.fromarray(_pattern(3, 600, 8)), "PNG"),  # ratio 200
        "tall-601x3.png": _encode(Image.fromarray(_pattern(601, 3, 9)), "PNG"),  # 200.33
        "tall-3000x500.jpg": _encode(Image.fromarray(_pattern(3000, 500, 10)), "JPEG"),
        "big-1500x2000.jpg": _encode(Image.fromarray(_pattern(1500, 2000, 11)), "JPEG"),
        "small-50x80.png": _encode(Image.fromarray(_pattern(50, 80, 12)), "PNG"),
        "gray.jpg": _encode(rgb.convert("L"), "JPEG"),
        "gray.png": _encode(rgb.convert("L"), "PNG"),
        "rgba.png": _encode(rgba, "PNG"),
        "la.png": _encode(rgba.convert("LA"), "PNG"),
        "palette.png": _encode(palette, "PNG"),
        "palette-trns.png": _encode(palette_trns, "PNG", transparency=3),
        "gray16.png": _encode(gray16, "PNG"),
        # Single transparent colours that convert_to_rgb turns white after load_image: a gray
        # in use; "1" and "I;16" ints, which Pillow later compares as (t & 255, 0, 0).
        "l-trns.png": _encode(levels, "PNG", transparency=60),
        "1-trns0.png": _encode(bilevel, "PNG", transparency=0),
        "i16-trns256.png": _encode(gray16_levels, "PNG", transparency=256),
        "progressive.jpg": _encode(photo, "JPEG", progressive=True, quality=85),
        "444.jpg": _encode(photo, "JPEG", subsampling=0, quality=92),
        "exif6.jpg": _encode(photo, "JPEG", exif=_exif(6)),
        "exif8.jpg": _encode(photo.resize((300, 200)), "JPEG", exif=_exif(8)),
        "exif3.png": _encode(rgb, "PNG", exif=_exif(3)),
        "cmyk.jpg": _encode(photo.convert("CMYK"), "JPEG"),
        "palette.gif": _encode(palette, "GIF"),
        "rgb.bmp": _encode(rgb, "BMP"),
        "lossy.webp": _encode(photo, "WEBP", quality=80),
        "alpha.webp": _encode(rgba, "WEBP", lossless=True),
    }


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every test image as a file: three real photographs and the synthetic cases."""
    folder = tmp_path_factory.mktemp("vision")
    files = {"grace_hopper.jpg": images.grace_hopper(), **_synthetic()}
    pillow = images.pillow_test_images()
    for name in (*PHOTOS[1:], *PILLOW_EDGE_CASES):
        files[name] = (pillow / name).read_bytes()
    out = {}
    for name, data in files.items():
        (folder / name).write_bytes(data)
        out[name] = folder / name
    return out


PHOTOS = ["grace_hopper.jpg", "flower.jpg", "flower2.jpg", "hopper_orientation_2.jpg"]
# From Pillow's own test images: transparency in every mode, 16-bit RGB, RGBA, LA.
PILLOW_EDGE_CASES = [
    "1_trns.png",
    "i_trns.png",
    "l_trns.png",
    "p_trns_single.png",
    "rgb_trns.png",
    "tRNS_null_1x1.png",
    "tiff_16bit_RGB_target.png",
    "pil123rgba.png",
    "uncompressed_la.png",
    "transparent.gif",
]
SYNTHETIC = [
    "rgb-1x1.png",
    "rgb-10x10.png",
    "odd-37x23.png",
    "odd-259x194.jpg",
    "wide-3x600.png",
    "tall-3000x500.jpg",
    "big-1500x2000.jpg",
    "small-50x80.png",
    "gray.jpg",
    "gray.png",
    "rgba.png",
    "la.png",
    "palette.png",
    "palette-trns.png",
    "gray16.png",
    "l-trns.png",
    "1-trns0.png",
    "i16-trns256.png",
    "progressive.jpg",
    "444.jpg",
    "exif6.jpg",
    "exif8.jpg",
    "exif3.png",
    "cmyk.jpg",
    "palette.gif",
    "rgb.bmp",
    "lossy.webp",
    "alpha.webp",
]
IMAGE_NAMES = [*PHOTOS, *SYNTHETIC, *PILLOW_EDGE_CASES]

# A 3x600 image resized to a shortest edge of 336 is 336x67200 before the center crop: wider
# than the 65536 pixels per side the resampler accepts.
BEYOND_LIMITS = {("clip-336", "wide-3x600.png")}


# ---- comparison --------------------------------------------------------------------------


def assert_same(got: np.ndarray | None, want: Any, what: str) -> None:
    """Same dtype, shape and bytes; the message says by how much values differ."""
    assert got is not None, f"{what}: missing"
    want = np.asarray(want)
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    if got.tobytes() != want.tobytes():
        diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
        raise AssertionError(
            f"{what}: {int(np.count_nonzero(diff))} of {diff.size} values differ, "
            f"max |delta| = {diff.max()}"
        )


def assert_matches(ours: ProcessorOutput, ref: Any, what: str) -> None:
    for key in ref:
        assert_same(getattr(ours, key), ref[key], f"{what} {key}")


def hf_load(path: Path | str) -> Image.Image:
    """``hf_load(path)``, with the file closed afterwards (``load_image`` of an opened
    image runs the same ``exif_transpose`` and ``convert("RGB")``)."""
    with Image.open(path) as im:
        return load_image(im)


def run_hf(hf: Any, inputs: Any, **kwargs: Any) -> Any:
    return hf(inputs, return_tensors="np", **kwargs)


# ---- parity ------------------------------------------------------------------------------


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("name", IMAGE_NAMES)
def test_files(corpus: dict[str, Path], config: str, name: str) -> None:
    """Encoded files: our decoder + processor vs ``load_image`` + the PIL backend."""
    path = corpus[name]
    hf = hf_processor(config)
    loaded = hf_load(path)
    ref = run_hf(hf, loaded)
    ours = our_processor(config)
    if (config, name) in BEYOND_LIMITS:
        # transformers resizes to a side beyond our resampler's limit (then crops); we refuse.
        with pytest.raises(ProcessingLimitError, match="65536"):
            ours(str(path))
        return
    assert_matches(ours(str(path)), ref, f"{config} {name} path")
    # The RGB transformers processed (after its convert_to_rgb) through the array path.
    decoded = convert_to_rgb(loaded, return_numpy=True)
    assert_matches(ours(decoded), ref, f"{config} {name} array")


@pytest.mark.parametrize(
    "config",
    [
        "qwen2-defaults",
        "clip-336",
        "llava_next-336",
        "pixtral-defaults",
        "gemma3-pas",
        "internvl-defaults",
        "idefics3-defaults",
    ],
)
@pytest.mark.parametrize("name", IMAGE_NAMES)
def test_pil_inputs(corpus: dict[str, Path], config: str, name: str) -> None:
    """PIL images (no EXIF, alpha composited on white by ``convert_to_rgb``) and encoded bytes
    with ``alpha="white"`` (our decoder's compositing) against the same PIL image transposed."""
    path = corpus[name]
    if (config, name) in BEYOND_LIMITS:
        pytest.skip("beyond the resampler's size limit (test_files checks the error)")
    hf = hf_processor(config)
    with Image.open(path) as im:
        im.load()
        assert_matches(our_processor(config)(im), run_hf(hf, im), f"{config} {name} PIL")
        transposed = ImageOps.exif_transpose(im)
    white = our_processor(config, alpha="white")(path.read_bytes())
    assert_matches(white, run_hf(hf, transposed), f"{config} {name} bytes alpha=white")


@pytest.mark.parametrize(
    "config",
    [
        "qwen2-hub",
        "qwen3-hub",
        "siglip-384",
        "llava-pad-336",
        "pixtral-1540",
        "gemma3-hub",
        "internvl-defaults",
        "smolvlm-hub",
    ],
)
@pytest.mark.parametrize("channels", [1, 2, 4])
def test_raw_arrays(config: str, channels: int) -> None:
    """1- and 4-channel arrays: transformers' ``convert_to_rgb`` for numpy (repeat; composite
    ``round(a * rgb + (1 - a) * 255)``); a 2-D array is an ``HxWx1`` one."""
    rgb = _pattern(57, 91, 13)
    alpha = np.fromfunction(lambda y, x: (x * 9 + y * 5) % 256, (57, 91)).astype(np.uint8)
    array = np.dstack([rgb, alpha]) if channels == 4 else rgb[..., :1]
    ref = run_hf(hf_processor(config), array, input_data_format="channels_last")
    ours = our_processor(config)
    got = ours(array[..., 0] if channels == 2 else array)
    assert_matches(got, ref, f"{config} {channels}-channel array")


@pytest.mark.parametrize("config", list(CONFIGS))
def test_batches(corpus: dict[str, Path], config: str) -> None:
    """Images of mixed sizes and kinds in one call (processed in parallel, in order)."""
    names = ["grace_hopper.jpg", "odd-37x23.png", "rgba.png", "small-50x80.png", "exif6.jpg"]
    loaded = [hf_load(corpus[n]) for n in names]
    ref = run_hf(hf_processor(config), loaded)
    ours = our_processor(config)
    paths = [str(corpus[n]) for n in names]
    assert_matches(ours(paths), ref, f"{config} batch")
    assert_matches(ours(paths, threads=1), ref, f"{config} batch, one thread")
    mixed: list[Any] = [corpus[names[0]].read_bytes(), np.asarray(loaded[1]), *paths[2:]]
    assert_matches(ours(mixed), ref, f"{config} mixed inputs")


def test_large_outputs_streamed_and_recycled() -> None:
    """Outputs above 8 MiB are written with streaming stores into buffers recycled from earlier
    calls (stale values from another batch in them): every call still equals transformers, and
    so does a call with recycling off."""
    arrays = [_pattern(1500, 2000, 1), _pattern(700, 900, 2), _pattern(1200, 1600, 3)]
    hf = hf_processor("qwen2-defaults")
    ref = run_hf(hf, [Image.fromarray(a) for a in arrays])
    ref_reversed = run_hf(hf, [Image.fromarray(a) for a in arrays[::-1]])
    assert ref["pixel_values"].nbytes > 8 << 20
    ours = our_processor("qwen2-defaults")
    previous = buffer_cache().limit
    try:
        buffer_cache(256 << 20)
        for round_ in range(3):
            for threads in (1, None):
                assert_matches(ours(arrays, threads=threads), ref, f"round {round_}")
                assert_matches(ours(arrays[::-1], threads=threads), ref_reversed, "reversed")
        # Dropped outputs (and the batch's resized images) are kept for the next call.
        out = ours(arrays)
        held_while_alive = buffer_cache().held
        del out
        assert buffer_cache().held >= held_while_alive + ref["pixel_values"].nbytes
        # Recycling off frees everything and changes no value.
        assert buffer_cache(0) == (256 << 20, 0)
        assert_matches(ours(arrays), ref, "recycling off")
        assert buffer_cache().held == 0
    finally:
        buffer_cache(previous)
    for bad in (-1, 1.5, True, "1"):
        with pytest.raises(ValueError, match="limit"):
            buffer_cache(bad)  # type: ignore[arg-type]


OPTIONS: list[tuple[str, dict[str, Any]]] = [
    ("clip", {"resample": 2}),  # bilinear
    ("clip", {"resample": 1, "size": {"shortest_edge": 100}, "crop_size": 90}),  # lanczos
    ("clip", {"resample": 0}),  # nearest
    ("clip", {"resample": 4, "crop_size": {"height": 300, "width": 250}}),  # box, padded crop
    ("clip", {"resample": 5, "do_center_crop": False, "do_pad": True}),  # hamming, batch pad
    ("clip", {"do_center_crop": False, "do_pad": True, "pad_size": {"height": 600, "width": 700}}),
    ("clip", {"size": {"shortest_edge": 200, "longest_edge": 260}}),
    ("clip", {"size": {"max_height": 150, "max_width": 190}, "crop_size": 120}),
    ("clip", {"rescale_factor": 0.5, "do_normalize": False}),
    ("clip", {"do_rescale": False, "image_mean": [100.0, 110.0, 120.0], "image_std": 50.0}),
    ("llava", {"do_pad": True, "image_mean": [0.2, 0.9, 0.0]}),
    ("siglip", {"size": {"height": 123, "width": 45}, "do_resize": True}),
    ("siglip", {"do_resize": False}),
    ("llava_next", {"image_grid_pinpoints": [[224, 448], [448, 224], [672, 672]]}),
    ("llava_next", {"size": {"height": 200, "width": 200}, "do_center_crop": False}),
    ("qwen2_vl", {"resample": 2, "min_pixels": 20000, "max_pixels": 60000}),
    ("qwen2_vl", {"patch_size": 8, "merge_size": 3, "temporal_patch_size": 3}),
    ("qwen2_vl", {"do_normalize": False}),
    ("qwen2_vl", {"do_rescale": False, "do_normalize": False}),
    ("pixtral", {"size": {"longest_edge": 512}}),
    ("pixtral", {"size": {"longest_edge": 200}, "patch_size": 14}),
    ("pixtral", {"size": {"longest_edge": 150}, "patch_size": {"height": 14, "width": 16}}),
    ("pixtral", {"size": {"height": 100, "width": 230}}),  # separate bounds
    ("pixtral", {"size": 128}),  # an int is {"height": 128, "width": 128} here
    ("pixtral", {"size": [90, 120], "patch_size": 8}),
    ("pixtral", {"size": {"shortest_edge": 10, "longest_edge": 180}}),  # shortest unused
    ("pixtral", {"do_resize": False}),
    ("pixtral", {"do_normalize": False}),
    ("pixtral", {"do_rescale": False, "do_normalize": False}),
    (
        "pixtral",
        {"rescale_factor": 0.5, "image_mean": [0.1, 0.2, 0.3], "image_std": [2.0, 0.4, 0.9]},
    ),
    ("pixtral", {"do_rescale": False, "image_mean": [100.0, 110.0, 120.0], "image_std": 50.0}),
    ("pixtral", {"resample": 2, "size": {"longest_edge": 100}}),  # bilinear
    ("pixtral", {"resample": 1, "size": {"longest_edge": 170}}),  # lanczos
    ("pixtral", {"resample": 0}),  # nearest
    ("pixtral", {"do_center_crop": True, "crop_size": 120}),
    ("pixtral", {"do_center_crop": True, "crop_size": {"height": 300, "width": 90}}),  # padded
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
    ("internvl", {"size": {"height": 224, "width": 224}}),
    ("internvl", {"size": 100}),  # an int is {"height": 100, "width": 100} here
    ("internvl", {"size": [120, 200]}),  # non-square tiles
    ("internvl", {"resample": 0, "size": 64}),  # nearest
    ("internvl", {"resample": 1, "size": 96}),  # lanczos
    ("internvl", {"resample": 2, "size": 128}),  # bilinear
    ("internvl", {"resample": 4, "size": {"height": 50, "width": 70}}),  # box
    ("internvl", {"resample": 5, "size": 130}),  # hamming
    ("internvl", {"do_resize": False}),  # tiling resizes anyway
    ("internvl", {"do_resize": False, "crop_to_patches": False}),
    ("internvl", {"crop_to_patches": False}),
    ("internvl", {"crop_to_patches": False, "size": [150, 90]}),
    ("internvl", {"crop_to_patches": False, "size": 300}),
    ("internvl", {"do_normalize": False, "size": 64}),
    ("internvl", {"do_rescale": False, "do_normalize": False, "size": 64}),
    (
        "internvl",
        {"rescale_factor": 0.5, "image_mean": [0.1, 0.2, 0.3], "image_std": [2.0, 0.4, 0.9]},
    ),
    ("internvl", {"image_mean": CLIP_MEAN, "image_std": CLIP_STD, "size": 384}),  # the class's
    ("internvl", {"min_patches": 4, "size": 64}),
    ("internvl", {"min_patches": 6, "max_patches": 6, "size": 64}),
    ("internvl", {"min_patches": 5, "max_patches": 3, "size": 64}),  # no grid: 1 x 1
    ("internvl", {"max_patches": 1}),  # no tiling
    ("internvl", {"max_patches": 2, "size": 80}),
    ("internvl", {"max_patches": 6, "size": 50}),
    ("internvl", {"max_patches": 40, "size": 32}),
    ("internvl", {"min_patches": 2, "max_patches": 24, "size": [30, 60]}),
    ("idefics3", {"size": {"longest_edge": 500}, "max_image_size": {"longest_edge": 100}}),
    ("idefics3", {"size": {"longest_edge": 333}, "max_image_size": {"longest_edge": 111}}),
    ("idefics3", {"size": {"longest_edge": 99}, "max_image_size": {"longest_edge": 100}}),
    ("idefics3", {"size": {"longest_edge": 4500}, "max_image_size": {"longest_edge": 1000}}),
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
    ("smolvlm", {"size": {"longest_edge": 2048}, "max_image_size": {"longest_edge": 512}}),
    ("smolvlm", {"size": {"longest_edge": 1536}, "max_image_size": {"longest_edge": 384}}),
    ("smolvlm", {"do_image_splitting": False, "max_image_size": {"longest_edge": 384}}),
    ("smolvlm", {"resample": 4, "size": {"longest_edge": 256}}),  # box
    ("smolvlm", {"resample": 5, "size": {"longest_edge": 257}}),  # hamming
]


@pytest.mark.parametrize(("family", "options"), OPTIONS, ids=lambda v: str(v))
def test_options(family: str, options: dict[str, Any]) -> None:
    """Other filters, sizes, crops, paddings and switches, on a batch of two sizes."""
    batch = [_pattern(211, 163, 21), _pattern(97, 244, 22)]
    if options.get("do_resize") is False:
        batch = [_pattern(196, 168, 23)]  # divisible for every layout that needs it
    hf = HF_CLASSES[family](**options)
    ref = run_hf(hf, batch, input_data_format="channels_last")
    ours = ImageProcessor(family, options)(batch)  # type: ignore[arg-type]
    for key in ref:
        want = np.asarray(ref[key])
        if want.dtype == np.uint8:  # no rescale and no normalize: transformers keeps uint8
            want = want.astype(np.float32)
        assert_same(getattr(ours, key), want, f"{family} {options} {key}")


@pytest.mark.parametrize("config", QWEN_CONFIGS)
@pytest.mark.parametrize(("height", "width"), [(1, 201), (201, 1), (2, 401), (3, 601), (1, 1000)])
def test_aspect_ratio_error(config: str, height: int, width: int) -> None:
    """Beyond 200:1, the same error (type and message) as transformers, after the "image N:"
    prefix every processor error carries."""
    array = _pattern(height, width, 14)
    with pytest.raises(ValueError, match="aspect ratio") as hf_error:
        run_hf(hf_processor(config), array, input_data_format="channels_last")
    with pytest.raises(AspectRatioError) as ours:
        our_processor(config)(array)
    assert str(ours.value) == f"image 0: {hf_error.value}"
    assert isinstance(ours.value, ValueError)
    assert isinstance(ours.value, SmgProtoError)
    assert ours.value.index == 0
    # A batch names the offending image.
    with pytest.raises(AspectRatioError) as second:
        our_processor(config)([_pattern(30, 30, 1), array])
    assert str(second.value) == f"image 1: {hf_error.value}"
    assert second.value.index == 1


@pytest.mark.parametrize(("height", "width"), [(1, 200), (200, 1), (3, 600), (5, 1000)])
def test_aspect_ratio_at_the_limit(height: int, width: int) -> None:
    """Exactly 200:1 is accepted by both."""
    array = _pattern(height, width, 15)
    for config in QWEN_CONFIGS:
        ref = run_hf(hf_processor(config), array, input_data_format="channels_last")
        assert_matches(our_processor(config)(array), ref, f"{config} {height}x{width}")


# ---- Qwen details: sizes, tokens, families, videos ----------------------------------------


@pytest.mark.parametrize(
    ("height", "width"),
    [(70, 70), (600, 512), (1000, 3000), (4000, 3000), (1080, 1920), (10, 10), (28, 28)],
)
def test_qwen_sizes_and_tokens(height: int, width: int) -> None:
    """Sizes from the reference table (§5.1) and token counts, via cheap constant images."""
    array = np.full((height, width, 3), 77, np.uint8)
    for config in QWEN_CONFIGS:
        hf = hf_processor(config)
        out = our_processor(config)(array)
        patches = hf.get_number_of_image_patches(height, width, {})
        assert out.image_grid_thw is not None
        assert out.pixel_values is not None
        _, gh, gw = out.image_grid_thw[0].tolist()
        assert gh * gw == patches == out.pixel_values.shape[0]
        assert out.num_image_tokens == (patches // hf.merge_size**2,)


def test_qwen_family_defaults() -> None:
    """``for_family``: Qwen2/2.5 are the class defaults; Qwen3-VL/3.5 (no class of their own)
    the published configs."""
    array = _pattern(300, 411, 16)
    hf = run_hf(Qwen2VLImageProcessorPil(), array, input_data_format="channels_last")
    for family in ("qwen2_vl", "qwen2_5_vl"):
        assert_matches(ImageProcessor.for_family(family)(array), hf, family)
    kwargs = {k: v for k, v in QWEN3_HUB.items() if k not in _META}
    hf3 = run_hf(Qwen2VLImageProcessorPil(**kwargs), array, input_data_format="channels_last")
    for family in ("qwen3_vl", "qwen3_5"):
        assert_matches(ImageProcessor.for_family(family)(array), hf3, family)


def _video_reference(hf: Any, frames: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """PIL-backend frame processing + ``Qwen2VLVideoProcessor.patchify`` in numpy."""
    ps, m, t = hf.patch_size, hf.merge_size, hf.temporal_patch_size
    processed = []
    for frame in frames:
        chw = np.moveaxis(frame, -1, 0)
        chw = hf.resize(chw, size=hf.size, resample=hf.resample, factor=ps * m)
        chw = hf.rescale(chw, hf.rescale_factor)
        processed.append(hf.normalize(chw, hf.image_mean, hf.image_std))
    video = np.stack(processed)[None]  # (1, F, C, H, W)
    if pad := -video.shape[1] % t:
        video = np.concatenate([video, np.repeat(video[:, -1:], pad, axis=1)], axis=1)
    _, f, c, h, w = video.shape
    gt, gh, gw = f // t, h // ps, w // ps
    patches = video.reshape(1, gt, t, c, gh // m, m, ps, gw // m, m, ps)
    patches = patches.transpose(0, 1, 4, 7, 5, 8, 3, 2, 6, 9)
    return patches.reshape(gt * gh * gw, c * t * ps * ps), np.array([[gt, gh, gw]])


@pytest.mark.parametrize("config", QWEN_CONFIGS)
@pytest.mark.parametrize("count", [1, 3, 4])
def test_qwen_video(corpus: dict[str, Path], config: str, count: int) -> None:
    photo = np.asarray(hf_load(corpus["grace_hopper.jpg"]))
    frames = [
        np.ascontiguousarray(photo[i * 7 : i * 7 + 500, i * 5 : i * 5 + 450]) for i in range(count)
    ]
    hf = hf_processor(config)
    pixels, grid = _video_reference(hf, frames)
    ours = our_processor(config)
    out = ours(videos=frames)
    assert_same(out.pixel_values_videos, pixels, f"{config} video of {count}")
    assert_same(out.video_grid_thw, grid, f"{config} video grid")
    assert out.num_video_tokens == (int(grid.prod()) // hf.merge_size**2,)
    # Two videos at once, and images with them.
    small = [_pattern(90, 120, s) for s in range(2)]
    pixels2, grid2 = _video_reference(hf, small)
    both = ours(frames[0], videos=[frames, small])
    assert_same(both.pixel_values_videos, np.concatenate([pixels, pixels2]), f"{config} two videos")
    assert_same(both.video_grid_thw, np.concatenate([grid, grid2]), f"{config} two grids")
    assert_matches(both, run_hf(hf, frames[0], input_data_format="channels_last"), "image too")
    # A still image is a one-frame video padded to T frames: same patches as the image path.
    assert_same(ours(videos=[frames[:1]]).pixel_values_videos, ours(frames[0]).pixel_values, "")


def test_video_errors() -> None:
    ours = ImageProcessor.for_family("qwen2_vl")
    with pytest.raises(VideoShapeError, match="frame 1"):
        ours(videos=[_pattern(60, 60, 1), _pattern(61, 60, 2)])
    with pytest.raises(ProcessorConfigError, match="videos"):
        ImageProcessor.for_family("clip")(videos=[_pattern(60, 60, 1)])


# ---- configuration ----------------------------------------------------------------------


def test_from_pretrained_sources(tmp_path: Path, corpus: dict[str, Path]) -> None:
    """A dict, a JSON file and a model directory give the same processor; nothing downloads."""
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(LLAVA_NEXT_336))
    (tmp_path / "processor_config.json").write_text(
        json.dumps(
            {
                "patch_size": 14,
                "num_additional_image_tokens": 1,
                "vision_feature_select_strategy": "default",
                "processor_class": "LlavaNextProcessor",
            }
        )
    )
    from_dir = ImageProcessor.from_pretrained(tmp_path)
    from_file = ImageProcessor.from_pretrained(tmp_path / "preprocessor_config.json")
    from_dict = ImageProcessor.from_pretrained(LLAVA_NEXT_336)
    assert from_dir.config == from_file.config == from_dict.config
    assert from_dir.family == "llava_next"
    assert from_dict.config["size"] == {"shortest_edge": 336}
    with pytest.raises(FileNotFoundError, match="nothing is downloaded"):
        ImageProcessor.from_pretrained("llava-hf/llava-v1.6-mistral-7b-hf")
    with pytest.raises(ValueError, match="not supported"):
        ImageProcessor.from_pretrained({"image_processor_type": "MllamaImageProcessor"})
    # Token counts as LlavaNextProcessor computes them.
    paths = [str(corpus[n]) for n in ("grace_hopper.jpg", "wide-3x600.png", "small-50x80.png")]
    out = from_dir(paths)
    assert out.image_sizes is not None
    assert out.num_image_tokens is not None
    fake = SimpleNamespace(
        image_processor=SimpleNamespace(
            image_grid_pinpoints=LLAVA_NEXT_336["image_grid_pinpoints"]
        ),
        patch_size=14,
        num_additional_image_tokens=1,
    )
    fake._get_unpadded_features = partial(LlavaNextProcessor._get_unpadded_features, fake)
    for (h, w), tokens in zip(out.image_sizes.tolist(), out.num_image_tokens, strict=True):
        want = LlavaNextProcessor._get_number_of_features(fake, h, w, 336, 336) - 1
        assert tokens == want
    assert from_dict(paths[0]).num_image_tokens is None  # no processor_config: unknown
    llava = ImageProcessor.from_pretrained(
        LLAVA_PAD_336, vision_tokens=VisionTokens(14, 1, "default")
    )
    assert llava(paths[:2]).num_image_tokens == (576, 576)


def test_config_round_trip_and_errors() -> None:
    for family in _native.processor_families():
        p = ImageProcessor.for_family(family)  # type: ignore[arg-type]
        assert ImageProcessor(family, p.config).config == p.config  # type: ignore[arg-type]
    with pytest.raises(ProcessorConfigError, match="family") as err:
        ImageProcessor("florence2", {})  # type: ignore[arg-type]
    assert err.value.field == "family"
    with pytest.raises(ProcessorConfigError, match="patch_size"):
        ImageProcessor("qwen2_vl", {"patch_size": 0})
    assert {"internvl", "idefics3", "smolvlm"} <= set(_native.processor_families())
    with pytest.raises(ProcessorConfigError, match="size"):
        ImageProcessor("clip", {"size": {"height": 10}})
    with pytest.raises(ProcessorConfigError, match="image_mean"):
        ImageProcessor("siglip", {"image_mean": [0.5, 0.5]})
    with pytest.raises(ProcessorConfigError, match="resample"):
        ImageProcessor("clip", {"resample": 7})
    with pytest.raises(ProcessorConfigError, match="crop_size"):
        ImageProcessor("siglip", {"do_center_crop": True})


def test_error_classes_cover_every_native_kind() -> None:
    """One Python class per Rust ``ProcessorError`` variant (``decode`` raises the decoding
    errors), and they pickle."""
    kinds = _native.processor_error_kinds()
    missing = sorted(set(kinds) - set(IMAGE_PROCESSING_ERRORS) - {"decode"})
    assert not missing, f"add to smg_grpc_proto.errors.IMAGE_PROCESSING_ERRORS: {missing}"
    assert sorted(IMAGE_PROCESSING_ERRORS) == sorted(set(kinds) - {"decode"})
    with pytest.raises(ImageProcessingError) as caught:
        ImageProcessor.for_family("qwen2_vl")(_pattern(1, 300, 1))
    exc = caught.value
    again = pickle.loads(pickle.dumps(exc))
    assert type(again) is AspectRatioError
    assert str(again) == str(exc)
    assert (again.field, again.expected, again.actual, again.index) == (
        exc.field,
        exc.expected,
        exc.actual,
        exc.index,
    )


def test_bad_inputs(corpus: dict[str, Path]) -> None:
    ours = ImageProcessor.for_family("clip")
    data = corpus["grace_hopper.jpg"].read_bytes()
    with pytest.raises(TruncatedImageError, match="image 1"):
        ours([data, data[: len(data) // 3]])
    with pytest.raises(TypeError, match="uint8"):
        ours(np.zeros((4, 4, 3), np.float32))
    with pytest.raises(ValueError, match="channels"):
        ours(np.zeros((4, 4, 2), np.uint8))
    with pytest.raises(TypeError, match="PIL image"):
        ours(3.5)
    with pytest.raises(ValueError, match="images"):
        ours()
    # Non-contiguous arrays are copied, not refused.
    photo = np.asarray(hf_load(corpus["grace_hopper.jpg"]))
    flipped = photo[:, ::-1]
    ref = run_hf(hf_processor("clip-defaults"), np.ascontiguousarray(flipped))
    assert_matches(ours(flipped), ref, "non-contiguous")


# ---- the tests can fail -------------------------------------------------------------------


def test_a_wrong_mean_is_caught(corpus: dict[str, Path]) -> None:
    """One float32 ulp off in one channel's mean: the comparison must see it."""
    path = str(corpus["grace_hopper.jpg"])
    ref = run_hf(hf_processor("qwen2-defaults"), hf_load(path))
    mean = list(CLIP_MEAN)
    mean[1] = float(np.nextafter(np.float32(mean[1]), np.float32(1)))
    wrong = ImageProcessor("qwen2_vl", {"image_mean": mean})(path)
    with pytest.raises(AssertionError, match="values differ"):
        assert_matches(wrong, ref, "off-by-one mean")


def test_pass_order_and_alpha_are_caught(corpus: dict[str, Path]) -> None:
    """Pillow 12's pass order on a resize Pillow 13 runs vertically first, and compositing
    alpha where transformers' loader drops it, both differ from the reference."""
    path = str(corpus["tall-3000x500.jpg"])
    ref = run_hf(hf_processor("qwen2-defaults"), hf_load(path))
    assert_matches(ImageProcessor("qwen2_vl")(path), ref, "pillow13")
    with pytest.raises(AssertionError, match="values differ"):
        assert_matches(ImageProcessor("qwen2_vl", {"pass_order": "pillow12"})(path), ref, "")
    rgba = str(corpus["rgba.png"])
    ref = run_hf(hf_processor("clip-defaults"), hf_load(rgba))
    with pytest.raises(AssertionError, match="values differ"):
        assert_matches(ImageProcessor("clip", alpha="white")(rgba), ref, "alpha")


def test_tensor_message(corpus: dict[str, Path]) -> None:
    """The outputs go into a vLLM request through ``tensors.TensorMessage``."""
    from smg_grpc_proto import tensors, vllm_engine_pb2

    out = ImageProcessor.for_family("qwen2_vl")(str(corpus["grace_hopper.jpg"]))
    message = tensors.TensorMessage(vllm_engine_pb2.GenerateRequest(request_id="r"))
    out.attach(message)
    parsed = tensors.parse(tensors.serialize(message), vllm_engine_pb2.GenerateRequest)
    assert_same(parsed["mm_inputs.pixel_values"], out.pixel_values, "pixel_values")
    assert_same(
        parsed["mm_inputs.model_specific_tensors[image_grid_thw]"], out.image_grid_thw, "grid"
    )
    assert set(out.tensors()) == {"pixel_values", "image_grid_thw"}


# ---- Pixtral details: sizes, padding, spatial merge, tokens --------------------------------

PIXTRAL_CONFIGS = ("pixtral-defaults", "pixtral-1540")
# (height, width): tiny, thin, exact patch multiples, just below / at / above the longest edge.
PIXTRAL_SIZES = [
    (1, 1),
    (2, 2000),
    (2000, 2),
    (15, 17),
    (16, 16),
    (32, 48),
    (14, 28),
    (1008, 1024),
    (1023, 1023),
    (1024, 1024),
    (1025, 1025),
    (1024, 1025),
    (1040, 16),
    (1539, 1541),
    (1500, 2000),
    (3000, 500),
]


def _pixtral_kwargs(config: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in config.items() if k not in _META}


def _pixtral_replace_image_token() -> Any:
    """``PixtralProcessor.replace_image_token`` from the installed transformers. Its module
    imports torch (absent here), so the method's source is compiled on its own."""
    spec = importlib.util.find_spec("transformers.models.pixtral")
    assert spec is not None
    assert spec.submodule_search_locations
    path = Path(next(iter(spec.submodule_search_locations))) / "processing_pixtral.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "PixtralProcessor")
    fn = next(
        n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "replace_image_token"
    )
    namespace: dict[str, Any] = {}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), str(path), "exec"), namespace)
    return namespace["replace_image_token"]


def _pixtral_token_count(ref: Any, index: int, patch_size: int, merge: int) -> int:
    """``PixtralProcessor.replace_image_token`` run on transformers' own output."""
    fake = SimpleNamespace(
        patch_size=patch_size,
        spatial_merge_size=merge,
        image_token="[IMG]",
        image_break_token="[IMG_BREAK]",
        image_end_token="[IMG_END]",
    )
    text = _pixtral_replace_image_token()(fake, ref, index)
    return int(text.count("[IMG"))


@pytest.mark.parametrize(("height", "width"), PIXTRAL_SIZES)
def test_pixtral_sizes(height: int, width: int) -> None:
    """Odd sizes, as arrays and as PNG bytes, with the default and the 1540 / patch-14 config."""
    array = _pattern(height, width, 31)
    png = _encode(Image.fromarray(array), "PNG")
    for config in PIXTRAL_CONFIGS:
        ref = run_hf(hf_processor(config), array, input_data_format="channels_last")
        ours = our_processor(config)
        assert_matches(ours(array), ref, f"{config} {height}x{width} array")
        assert_matches(ours(png), ref, f"{config} {height}x{width} bytes")
        patch = ours.config["patch_size"]["height"]
        assert ours(array).num_image_tokens == (_pixtral_token_count(ref, 0, patch, 1),)


@pytest.mark.parametrize(("height", "width"), [(1, 2000), (2000, 1), (1, 1100), (3, 5000)])
def test_pixtral_side_floored_to_zero(height: int, width: int) -> None:
    """A side that ``floor(side / ratio)`` makes 0: transformers fails, we say why."""
    array = _pattern(height, width, 32)
    with pytest.raises(ValueError, match="Size must contain"):  # it asks for a size of 0
        run_hf(hf_processor("pixtral-defaults"), array, input_data_format="channels_last")
    ours = our_processor("pixtral-defaults")
    with pytest.raises(ImageShapeError, match="resized size") as caught:
        ours([_pattern(40, 40, 1), array])
    assert caught.value.index == 1
    assert caught.value.field == "resized size"


@pytest.mark.parametrize("merge", [1, 2])
@pytest.mark.parametrize("config", PIXTRAL_CONFIGS)
def test_pixtral_batches_and_tokens(corpus: dict[str, Path], config: str, merge: int) -> None:
    """A batch of mixed sizes and kinds, padded to the largest; with ``spatial_merge_size``
    the sizes are those ``PixtralProcessor`` gets (it calls the image processor with
    ``patch_size * spatial_merge_size``) and the token counts its ``replace_image_token``'s."""
    names = ["grace_hopper.jpg", "wide-3x600.png", "rgba.png", "tall-3000x500.jpg", "exif6.jpg"]
    loaded = [hf_load(corpus[n]) for n in names]
    family, raw = CONFIGS[config]
    hf = hf_processor(config)
    patch = int(hf.patch_size["height"])
    ref = run_hf(hf, loaded, patch_size=patch * merge) if merge > 1 else run_hf(hf, loaded)
    ours = ImageProcessor(family, {**(raw or {}), "spatial_merge_size": merge})  # type: ignore[arg-type]
    paths = [str(corpus[n]) for n in names]
    out = ours(paths)
    assert_matches(out, ref, f"{config} merge {merge} batch")
    assert set(out.tensors()) == {"pixel_values", "image_sizes"}
    mixed: list[Any] = [corpus[names[0]].read_bytes(), np.asarray(loaded[1]), loaded[2], *paths[3:]]
    assert_matches(ours(mixed, threads=1), ref, f"{config} merge {merge} mixed inputs")
    want = tuple(_pixtral_token_count(ref, i, patch, merge) for i in range(len(names)))
    assert out.num_image_tokens == want


def test_pixtral_padding_switches() -> None:
    """``do_pad`` off: equal sizes stack, mixed sizes fail in both; ``do_resize`` off keeps the
    sizes (and still pads the batch)."""
    same = [_pattern(100, 90, 1), _pattern(100, 90, 2)]
    mixed = [_pattern(100, 90, 3), _pattern(33, 250, 4), _pattern(7, 5, 5)]
    hf = PixtralImageProcessorPil(do_pad=False)
    ours = ImageProcessor("pixtral", {"do_pad": False})
    ref = run_hf(hf, same, input_data_format="channels_last")
    assert_matches(ours(same), ref, "no pad, same sizes")
    with pytest.raises(ValueError, match="inhomogeneous"):
        run_hf(hf, mixed, input_data_format="channels_last")
    with pytest.raises(BatchShapeError, match="do_pad"):
        ours(mixed)
    hf = PixtralImageProcessorPil(do_resize=False)
    ref = run_hf(hf, mixed, input_data_format="channels_last")
    out = ImageProcessor("pixtral", {"do_resize": False})(mixed)
    assert_matches(out, ref, "no resize")
    assert out.image_sizes is not None
    assert out.image_sizes.tolist() == [[100, 90], [33, 250], [7, 5]]
    assert out.num_image_tokens == (6 * 6, 2 * 16, 0)


def test_pixtral_from_pretrained(tmp_path: Path) -> None:
    """The family from every backend's class name; a model directory's processor_config.json
    supplies PixtralProcessor's patch size and spatial merge."""
    for suffix in ("", "Fast", "Pil"):
        ours = ImageProcessor.from_pretrained(
            {"image_processor_type": f"PixtralImageProcessor{suffix}"}
        )
        assert ours.family == "pixtral"
        assert ours.config["spatial_merge_size"] == 1
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(PIXTRAL_1540))
    (tmp_path / "processor_config.json").write_text(
        json.dumps(
            {"patch_size": 14, "spatial_merge_size": 2, "processor_class": "PixtralProcessor"}
        )
    )
    ours = ImageProcessor.from_pretrained(tmp_path)
    assert ours.config["patch_size"] == {"height": 14, "width": 14}
    assert ours.config["spatial_merge_size"] == 2
    array = _pattern(1200, 1700, 33)
    hf = PixtralImageProcessorPil(**_pixtral_kwargs(PIXTRAL_1540))
    ref = run_hf(hf, array, input_data_format="channels_last", patch_size=28)
    out = ours(array)
    assert_matches(out, ref, "model directory")
    assert out.num_image_tokens == (_pixtral_token_count(ref, 0, 14, 2),)
    # The image processor alone (a dict, no processor_config.json) rounds to 14.
    alone = ImageProcessor.from_pretrained(PIXTRAL_1540)(array)
    assert_matches(alone, run_hf(hf, array, input_data_format="channels_last"), "alone")


PIXTRAL_BAD: list[tuple[dict[str, Any], str, bool]] = [
    # (config, the field named, whether transformers rejects it too)
    ({"size": {"shortest_edge": 100}}, "size", True),
    ({"size": {"longest_edge": 0}}, "size", True),
    ({"size": {"max_height": 100, "max_width": 100}}, "size", True),
    ({"size": {"longest_edge": 70000}}, "size", False),
    ({"patch_size": 0}, "patch_size", False),
    ({"patch_size": {"height": 0, "width": 16}}, "patch_size", True),
    ({"patch_size": {"height": 16}}, "patch_size", True),
    ({"patch_size": {"shortest_edge": 16}}, "patch_size", True),
    ({"patch_size": 2000}, "patch_size", False),
    ({"spatial_merge_size": 0}, "spatial_merge_size", False),
    ({"spatial_merge_size": 1.5}, "spatial_merge_size", False),
    ({"do_center_crop": True}, "crop_size", True),
    ({"do_pad": "yes"}, "do_pad", False),
    ({"resample": 9}, "resample", False),
    ({"image_std": [0.5, 0.5]}, "image_std", False),
    ({"do_center_crop": True, "crop_size": {"shortest_edge": 5}}, "crop_size", False),
]


@pytest.mark.parametrize(("config", "field", "hf_rejects"), PIXTRAL_BAD, ids=str)
def test_pixtral_config_errors(config: dict[str, Any], field: str, hf_rejects: bool) -> None:
    with pytest.raises(ProcessorConfigError) as caught:
        ImageProcessor("pixtral", config)
    assert caught.value.field == field
    assert str(caught.value).startswith(f"config {field}:")
    if hf_rejects:
        with pytest.raises(ValueError, match=r"size|crop_size"):
            run_hf(
                PixtralImageProcessorPil(**config),
                _pattern(40, 30, 1),
                input_data_format="channels_last",
            )


def test_pixtral_cli(corpus: dict[str, Path], tmp_path: Path) -> None:
    """``smg-proto preprocess --family pixtral`` writes transformers' tensors."""
    from smg_grpc_proto import cli

    names = ["grace_hopper.jpg", "odd-37x23.png", "small-50x80.png"]
    out = tmp_path / "pixtral.npz"
    paths = [str(corpus[n]) for n in names]
    assert cli.main(["preprocess", *paths, "--family", "pixtral", "--out", str(out)]) == 0
    ref = run_hf(hf_processor("pixtral-defaults"), [hf_load(p) for p in paths])
    with np.load(out) as written:
        for key in ("pixel_values", "image_sizes"):
            assert_same(written[key], ref[key], f"cli {key}")


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


@pytest.mark.parametrize(("height", "width"), GEMMA3_SIZES)
def test_gemma3_sizes(height: int, width: int) -> None:
    """Odd sizes, as arrays and as PNG bytes, pan-and-scan off and on (the processor's
    defaults), with transformers' ``num_crops`` and ``Gemma3Processor``'s token count."""
    array = _pattern(height, width, 41)
    png = _encode(Image.fromarray(array), "PNG")
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
    array = _pattern(height, width, 42)
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
    same = [_pattern(60, 150, 1), _pattern(60, 150, 2)]
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
        ImageProcessor("gemma3", tiny)([same[0], _pattern(2, 9, 3)])
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
        == GEMMA3_PROCESSOR_DEFAULTS["pan_and_scan_min_crop_size"]
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
    array = _pattern(400, 1300, 43)
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
                _pattern(40, 130, 1),
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


# ---- InternVL details: tiles, thumbnail, num_patches, tokens ------------------------------

INTERNVL_CONFIGS = ("internvl-defaults", "internvl-single")
# (height, width): tiny, thin, exact tile multiples, ties of the grid choice (a square image
# goes to 2 x 2 once it covers half of 4 tiles, 634² > 0.5·448²·4 > 633², to 3 x 3 past 950;
# 2:1 to 4 x 2 past 633 x 1266), near-squares, and photos' shapes.
INTERNVL_SIZES = [
    (1, 1),
    (1, 3000),
    (3000, 1),
    (2, 2000),
    (448, 448),
    (448, 896),
    (896, 448),
    (1344, 1344),
    (448, 5376),
    (5376, 448),
    (633, 633),
    (634, 634),
    (950, 950),
    (951, 951),
    (633, 1266),
    (634, 1268),
    (447, 449),
    (1023, 1025),
    (10, 20),
    (500, 1500),
    (1500, 2000),
    (1080, 1920),
]


def _internvl_token_count(ref: Any, index: int, image_seq_length: int) -> int:
    """``InternVLProcessor.replace_image_token`` run on transformers' own output, on a
    processor given just the attributes the method reads (its ``__init__`` needs a real
    tokenizer)."""
    processor = InternVLProcessor.__new__(InternVLProcessor)
    processor.image_seq_length = image_seq_length
    processor.start_image_token = "<img>"
    processor.end_image_token = "</img>"
    processor.image_token = "<IMG_CONTEXT>"
    text = processor.replace_image_token({"num_patches": ref["num_patches"].tolist()}, index)
    assert text.startswith("<img>")
    assert text.endswith("</img>")
    return int(text.count("<IMG_CONTEXT>"))


@pytest.mark.parametrize(("height", "width"), INTERNVL_SIZES)
def test_internvl_sizes(height: int, width: int) -> None:
    """Odd sizes, as arrays and as PNG bytes, tiled and not, with transformers' ``num_patches``
    and ``InternVLProcessor``'s token count."""
    array = _pattern(height, width, 51)
    png = _encode(Image.fromarray(array), "PNG")
    for config in INTERNVL_CONFIGS:
        ref = run_hf(hf_processor(config), array, input_data_format="channels_last")
        ours = our_processor(config)
        out = ours(array)
        assert_matches(out, ref, f"{config} {height}x{width} array")
        assert_matches(ours(png), ref, f"{config} {height}x{width} bytes")
        assert out.num_image_tokens == (_internvl_token_count(ref, 0, 256),)


def test_internvl_grid_ties() -> None:
    """The grid choice and its tie-breaking, against transformers' function, over many
    shapes, tile sizes and tile ranges (through the tiles each image gets)."""
    from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import (
        get_optimal_tiled_canvas,
    )

    cases = [
        ((h, w), (t, t), lo, hi)
        for h, w in [(633, 633), (634, 634), (3, 1), (1, 3), (7, 5), (600, 599), (30, 90)]
        for t in (448, 16)
        for lo, hi in [(1, 12), (2, 6), (3, 40), (1, 2)]
    ]
    for (h, w), (th, tw), lo, hi in cases:
        cols, rows = get_optimal_tiled_canvas((h, w), (th, tw), lo, hi)
        tiles = cols * rows
        out = ImageProcessor(
            "internvl", {"size": {"height": th, "width": tw}, "min_patches": lo, "max_patches": hi}
        )(_pattern(h, w, 52))
        assert out.num_patches is not None
        assert out.num_patches.tolist() == [tiles + (tiles > 1)], (h, w, th, lo, hi)


@pytest.mark.parametrize("config", INTERNVL_CONFIGS)
def test_internvl_batches_and_tokens(corpus: dict[str, Path], config: str) -> None:
    """A batch of mixed sizes and kinds: each image's tiles and thumbnail, in order."""
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
    assert set(out.tensors()) == {"pixel_values", "num_patches"}
    mixed: list[Any] = [corpus[names[0]].read_bytes(), np.asarray(loaded[1]), loaded[2], *paths[3:]]
    assert_matches(ours(mixed, threads=1), ref, f"{config} mixed inputs")
    want = tuple(_internvl_token_count(ref, i, 256) for i in range(len(names)))
    assert out.num_image_tokens == want
    assert out.num_patches is not None
    if config == "internvl-defaults":
        assert int(out.num_patches.sum()) == out.pixel_values.shape[0]  # type: ignore[union-attr]
        assert min(out.num_patches.tolist()) >= 1
    else:
        assert out.num_patches.tolist() == [1] * len(names)


def test_internvl_resize_off() -> None:
    """``do_resize`` off without tiling: equal sizes stack, different ones cannot, in
    transformers or here."""
    same = [_pattern(60, 150, 1), _pattern(60, 150, 2)]
    options = {"do_resize": False, "crop_to_patches": False}
    ref = run_hf(internvl_hf(**options), same, input_data_format="channels_last")
    assert_matches(ImageProcessor("internvl", options)(same), ref, "no resize")
    mixed = [same[0], _pattern(61, 150, 3)]
    with pytest.raises(ValueError, match="inhomogeneous"):
        run_hf(internvl_hf(**options), mixed, input_data_format="channels_last")
    with pytest.raises(BatchShapeError):
        ImageProcessor("internvl", options)(mixed)
    # Without tiling, any size dict (here the shortest edge) as PilBackend.resize reads it.
    edge = {"crop_to_patches": False, "size": {"shortest_edge": 200}}
    for image in (_pattern(97, 244, 4), _pattern(300, 30, 5)):
        ref = run_hf(internvl_hf(**edge), image, input_data_format="channels_last")
        assert_matches(ImageProcessor("internvl", edge)(image), ref, "shortest edge")


def test_internvl_from_pretrained(tmp_path: Path) -> None:
    """The family from every backend's class name; a file of InternVLProcessor's tiles (its
    crop_to_patches over the file's false); a model directory's processor_config.json supplies
    image_seq_length; a file read alone keeps its own crop_to_patches."""
    for suffix in ("", "Fast", "Pil"):
        ours = ImageProcessor.from_pretrained(
            {"image_processor_type": f"GotOcr2ImageProcessor{suffix}"}
        )
        assert ours.family == "internvl"
    hub = ImageProcessor.from_pretrained(INTERNVL_HUB)
    assert hub.config == ImageProcessor.for_family("internvl").config
    assert hub.config["crop_to_patches"] is INTERNVL_PROCESSOR_DEFAULTS["crop_to_patches"]
    assert hub.config["image_mean"] == list(IMAGENET_DEFAULT_MEAN)
    assert hub.config["image_std"] == list(IMAGENET_DEFAULT_STD)
    # The class's own defaults differ from the published checkpoints' (documented).
    bare = GotOcr2ImageProcessorPil()
    assert (bare.size.height, bare.size.width) == (384, 384)
    assert bare.crop_to_patches is False
    assert (bare.min_patches, bare.max_patches, int(bare.resample)) == (1, 12, 3)
    assert list(bare.image_mean) == CLIP_MEAN
    # Keys GotOcr2ImageProcessorPil._preprocess ignores are ignored.
    ignored = ImageProcessor.from_pretrained(
        {**INTERNVL_HUB, "do_center_crop": True, "crop_size": 10, "do_pad": True}
    )
    assert ignored.config == hub.config
    (tmp_path / "preprocessor_config.json").write_text(
        json.dumps({k: v for k, v in INTERNVL_HUB.items() if k != "processor_class"})
    )
    (tmp_path / "processor_config.json").write_text(
        json.dumps({"image_seq_length": 64, "processor_class": "InternVLProcessor"})
    )
    ours = ImageProcessor.from_pretrained(tmp_path)
    assert ours.config["image_seq_length"] == 64
    assert ours.config["crop_to_patches"] is True
    array = _pattern(400, 1300, 53)
    ref = run_hf(internvl_hf(), array, input_data_format="channels_last")
    out = ours(array)
    assert_matches(out, ref, "model directory")
    assert out.num_patches is not None
    assert out.num_patches.tolist() == [4]  # 3 x 1 tiles and the thumbnail
    assert out.num_image_tokens == (_internvl_token_count(ref, 0, 64),) == (256,)
    # The preprocessor config alone, without InternVLProcessor: its own values.
    alone_config = {k: v for k, v in INTERNVL_HUB.items() if k != "processor_class"}
    alone = ImageProcessor.from_pretrained({**alone_config, "image_seq_length": 128})
    assert alone.config["crop_to_patches"] is False
    assert alone(array).num_image_tokens == (128,)


INTERNVL_BAD: list[tuple[dict[str, Any], str, type[BaseException] | None]] = [
    # (config, the field named, what transformers raises on it, if it does)
    ({"min_patches": 0}, "min_patches", None),  # transformers: as 1
    ({"min_patches": -3}, "min_patches", None),
    ({"min_patches": 1.5}, "min_patches", None),
    ({"min_patches": True}, "min_patches", None),
    ({"max_patches": 0}, "max_patches", None),  # transformers: silently no tiling
    ({"max_patches": -1}, "max_patches", None),
    # transformers: a TypeError from range(), unless its lru_cache already holds the grid of an
    # equal key with 12 (12.0 == 12 hashes alike), which this process's earlier cases do.
    ({"max_patches": 12.0}, "max_patches", None),
    ({"max_patches": 4097}, "max_patches", None),  # ours: at most 4096
    ({"crop_to_patches": "yes"}, "crop_to_patches", None),
    ({"crop_to_patches": 1}, "crop_to_patches", None),
    ({"image_seq_length": 0}, "image_seq_length", None),
    ({"image_seq_length": 1.5}, "image_seq_length", None),
    ({"size": {"height": 448}}, "size", ValueError),
    ({"size": {"shortest_edge": 448}}, "size", TypeError),  # tiles need height and width
    ({"size": {"height": 0, "width": 448}}, "size", ValueError),
    ({"size": {"height": 70000, "width": 448}}, "size", None),
    ({"resample": 9}, "resample", None),
    ({"image_mean": [0.5, 0.5]}, "image_mean", None),
    ({"rescale_factor": float("inf")}, "rescale_factor", None),
]


@pytest.mark.parametrize(("config", "field", "hf_error"), INTERNVL_BAD, ids=str)
def test_internvl_config_errors(
    config: dict[str, Any], field: str, hf_error: type[BaseException] | None
) -> None:
    with pytest.raises(ProcessorConfigError) as caught:
        ImageProcessor("internvl", config)
    assert caught.value.field == field
    assert str(caught.value).startswith(f"config {field}:")
    if hf_error is not None:
        with pytest.raises(hf_error):
            run_hf(internvl_hf(**config), _pattern(40, 130, 1), input_data_format="channels_last")


def test_internvl_cli(corpus: dict[str, Path], tmp_path: Path) -> None:
    """``smg-proto preprocess --family internvl`` writes transformers' tensors, num_patches
    too."""
    from smg_grpc_proto import cli

    names = ["grace_hopper.jpg", "odd-37x23.png", "small-50x80.png"]
    out = tmp_path / "internvl.npz"
    paths = [str(corpus[n]) for n in names]
    assert cli.main(["preprocess", *paths, "--family", "internvl", "--out", str(out)]) == 0
    ref = run_hf(hf_processor("internvl-defaults"), [hf_load(p) for p in paths])
    with np.load(out) as written:
        for key in ("pixel_values", "num_patches"):
            assert_same(written[key], ref[key], f"cli {key}")


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


@pytest.mark.parametrize(("height", "width"), IDEFICS3_SIZES)
def test_idefics3_sizes(height: int, width: int) -> None:
    """Odd sizes, as arrays and as PNG bytes, split and not, with transformers' rows/cols and
    the processors' ``<image>`` count."""
    array = _pattern(height, width, 61)
    png = _encode(Image.fromarray(array), "PNG")
    for config in IDEFICS3_CONFIGS:
        ref = run_hf(hf_processor(config), array, input_data_format="channels_last")
        ours = our_processor(config)
        out = ours(array)
        assert_matches(out, ref, f"{config} {height}x{width} array")
        assert_matches(ours(png), ref, f"{config} {height}x{width} bytes")
        assert set(out.tensors()) == set(ref)
        assert out.num_image_tokens == (_idefics3_token_count(ref, 0, 169),)


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
    array = _pattern(400, 1300, 62)
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
    ref = run_hf(HF_CLASSES[family](), [hf_load(p) for p in paths])
    with np.load(out) as written:
        for key in ("pixel_values", "pixel_attention_mask", "rows", "cols"):
            assert_same(written[key], ref[key], f"cli {key}")
