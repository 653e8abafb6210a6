"""Shared by ``tests/vision/test_<family>.py``: ``vision.ImageProcessor`` against transformers'
PIL backend, live and bit for bit.

Reference: ``transformers==5.24.0`` (its PIL-backend classes ``Qwen2VLImageProcessorPil``,
``CLIPImageProcessorPil``, ``LlavaImageProcessorPil``, ``SiglipImageProcessorPil``,
``LlavaNextImageProcessorPil``, ``PixtralImageProcessorPil``, ``Gemma3ImageProcessorPil``,
``GotOcr2ImageProcessorPil`` for InternVL, ``Idefics3ImageProcessorPil``,
``SmolVLMImageProcessorPil``, constructed directly with the config as keyword
arguments) with ``pillow==13.0.0`` — both pinned in pyproject's ``test`` dependency group;
other versions skip the modules (Pillow 12 resizes differently, so its bytes are not these).
Nothing is frozen from elsewhere: every expected tensor is computed in the test process, by
transformers.

Every comparison is exact: same dtype, same shape and the same bytes (``tobytes()``) for
``pixel_values`` and every side tensor; a failure reports the largest difference and how many
values differ. Inputs go in every way a user passes them: encoded files (our decoder vs
transformers' ``load_image``: EXIF transpose + ``convert("RGB")``), decoded RGB arrays, raw
1- and 4-channel arrays (transformers' ``convert_to_rgb`` for arrays) and PIL images.

This module imports neither transformers nor Pillow at import time: each family's test module
skips itself first (``pytest.importorskip``, then :func:`reference_mark`), and everything here
that needs them imports them when called. The shared ``corpus`` fixture (every test image as a
file, built by :func:`build_corpus`) is in ``tests/vision/conftest.py``.
"""

from __future__ import annotations

import functools
import io
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

from smg_grpc_proto.errors import ProcessingLimitError
from smg_grpc_proto.vision import ImageProcessor, ProcessorOutput
from support import images

if TYPE_CHECKING:
    from PIL import Image

os.environ.setdefault("HF_HUB_OFFLINE", "1")

TRANSFORMERS_VERSION = "5.24.0"
PILLOW_VERSION = "13.0.0"


def reference_mark() -> pytest.MarkDecorator:
    """The ``pytestmark`` of every parity module: skip unless the pinned reference versions are
    installed (call it after ``pytest.importorskip("transformers")`` and ``("PIL")``)."""
    import PIL
    import transformers

    found = (transformers.__version__, PIL.__version__)
    return pytest.mark.skipif(
        found != (TRANSFORMERS_VERSION, PILLOW_VERSION),
        reason=f"the reference is transformers {TRANSFORMERS_VERSION} with Pillow "
        f"{PILLOW_VERSION}, found {found[0]} with {found[1]}",
    )


# ---- published configurations -----------------------------------------------------------

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
# Qwen/Qwen3-Omni-30B-A3B-{Instruct,Thinking,Captioner}: the image keys of their shared
# preprocessor_config.json (its Whisper keys are the audio feature extractor's).
QWEN3_OMNI_HUB = {
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "min_pixels": 3136,
    "max_pixels": 12845056,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "image_processor_type": "Qwen2VLImageProcessor",
    "feature_extractor_type": "WhisperFeatureExtractor",
    "processor_class": "Qwen3OmniMoeProcessor",
}
# Qwen3OmniMoeProcessor.videos_kwargs: the size it passes to its video processor on every call.
QWEN3_OMNI_VIDEO_SIZE = {"shortest_edge": 128 * 32 * 32, "longest_edge": 768 * 32 * 32}
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

# Gemma 4's preprocessor_config.json as Gemma4ImageProcessorPil's class defaults write it (the
# published checkpoints ship these values: patch 16, 280 soft tokens, pooling kernel 3, BICUBIC,
# rescale only).
GEMMA4_FILE = {
    "do_convert_rgb": True,
    "do_normalize": False,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.0, 0.0, 0.0],
    "image_std": [1.0, 1.0, 1.0],
    "image_processor_type": "Gemma4ImageProcessor",
    "max_soft_tokens": 280,
    "patch_size": 16,
    "pooling_kernel_size": 3,
    "processor_class": "Gemma4Processor",
    "resample": 3,
    "rescale_factor": 0.00392156862745098,
}

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
# meta-llama/Llama-3.2-11B-Vision(-Instruct)'s preprocessor_config.json: tiles of 560, at most
# 4, BILINEAR, the OpenAI CLIP mean/std.
MLLAMA_HUB = {
    "do_convert_rgb": True,
    "do_normalize": True,
    "do_pad": True,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": CLIP_MEAN,
    "image_processor_type": "MllamaImageProcessor",
    "image_std": CLIP_STD,
    "max_image_tiles": 4,
    "processor_class": "MllamaProcessor",
    "resample": 2,
    "rescale_factor": 0.00392156862745098,
    "size": {"height": 560, "width": 560},
}

# GLM-4.1V / GLM-4.6V: a preprocessor_config.json with the class's keys and a 9 633 792-pixel
# ceiling (the value GLM-4.1V's published file is reported to carry: not checked offline here).
GLM4V_HUB = {
    "size": {"shortest_edge": 12544, "longest_edge": 9633792},
    "patch_size": 14,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": CLIP_MEAN,
    "image_std": CLIP_STD,
    "image_processor_type": "Glm4vImageProcessor",
    "processor_class": "Glm4vProcessor",
}
# GLM-5-next with a small token budget (every photo is cut into the budget and padded), and
# the keys its class reads but does not use (size, patch_expand_factor).
GLM5_NEXT_SMALL = {
    "min_image_tokens": 64,
    "max_image_tokens": 300,
    "size": {"longest_edge": 1},
    "patch_expand_factor": 1,
    "image_processor_type": "Glm5NextImageProcessor",
}


# ---- the reference processors (transformers imported on first use) --------------------------


@functools.cache
def gemma3_processor_defaults() -> dict[str, Any]:
    """What ``Gemma3Processor`` hands its image processor when the config says null: its own
    ``images_kwargs`` (read from the installed class, not copied)."""
    from transformers.models.gemma3.processing_gemma3 import Gemma3Processor

    return {k: v for k, v in Gemma3Processor.images_kwargs.items() if "pan_and_scan" in k}


def gemma3_hf(**kwargs: Any) -> Any:
    """``Gemma3ImageProcessorPil`` as a published Gemma 3 checkpoint runs it: the hub's size and
    filter, ``Gemma3Processor``'s pan-and-scan defaults, then ``kwargs`` (``None`` keeps the
    default, as our configuration does)."""
    from transformers import Gemma3ImageProcessorPil

    base = {"size": GEMMA3_HUB["size"], "resample": GEMMA3_HUB["resample"]}
    given = {k: v for k, v in kwargs.items() if v is not None}
    return Gemma3ImageProcessorPil(**{**base, **gemma3_processor_defaults(), **given})


@functools.cache
def internvl_processor_defaults() -> dict[str, Any]:
    """What ``InternVLProcessor`` hands its image processor on every call (read from the
    installed class): ``crop_to_patches=True``."""
    from transformers.models.internvl.processing_internvl import InternVLProcessor

    return dict(InternVLProcessor.images_kwargs)


def internvl_hf(**kwargs: Any) -> Any:
    """``GotOcr2ImageProcessorPil`` as a published InternVL checkpoint runs it under
    ``InternVLProcessor``: the hub's size, filter and mean/std, the processor's
    ``crop_to_patches``, then ``kwargs`` (``None`` keeps the default, as ours does)."""
    from transformers import GotOcr2ImageProcessorPil

    base = {
        "size": INTERNVL_HUB["size"],
        "resample": INTERNVL_HUB["resample"],
        "image_mean": INTERNVL_HUB["image_mean"],
        "image_std": INTERNVL_HUB["image_std"],
    }
    given = {k: v for k, v in kwargs.items() if v is not None and k not in _INTERNVL_FILE_ONLY}
    return GotOcr2ImageProcessorPil(**{**base, **internvl_processor_defaults(), **given})


def _with_rows_cols(cls: Any) -> Any:
    """The class, called with ``return_row_col_info=True`` (what ``Idefics3Processor`` and
    ``SmolVLMProcessor`` ask for), so that ``rows``/``cols`` are compared too."""

    def make(**kwargs: Any) -> Any:
        hf = cls(**kwargs)
        return lambda *args, **call: hf(*args, return_row_col_info=True, **call)

    return make


@functools.cache
def hf_classes() -> dict[str, Any]:
    """Family -> the reference constructor (a transformers class, or one of the wrappers above
    that runs it as the published checkpoints do)."""
    from transformers import (
        CLIPImageProcessorPil,
        Gemma4ImageProcessorPil,
        Glm4vImageProcessorPil,
        Glm5NextImageProcessorPil,
        Glm46VImageProcessorPil,
        Idefics3ImageProcessorPil,
        LlavaImageProcessorPil,
        LlavaNextImageProcessorPil,
        MllamaImageProcessorPil,
        PixtralImageProcessorPil,
        Qwen2VLImageProcessorPil,
        SiglipImageProcessorPil,
        SmolVLMImageProcessorPil,
    )

    return {
        "qwen2_vl": Qwen2VLImageProcessorPil,
        "qwen2_5_vl": Qwen2VLImageProcessorPil,
        "qwen3_vl": Qwen2VLImageProcessorPil,
        "qwen3_5": Qwen2VLImageProcessorPil,
        "qwen3_omni_moe": Qwen2VLImageProcessorPil,
        "clip": CLIPImageProcessorPil,
        "llava": LlavaImageProcessorPil,
        "siglip": SiglipImageProcessorPil,
        "llava_next": LlavaNextImageProcessorPil,
        "pixtral": PixtralImageProcessorPil,
        "gemma3": gemma3_hf,
        "gemma4": Gemma4ImageProcessorPil,
        "internvl": internvl_hf,
        "idefics3": _with_rows_cols(Idefics3ImageProcessorPil),
        "smolvlm": _with_rows_cols(SmolVLMImageProcessorPil),
        "mllama": MllamaImageProcessorPil,
        "glm4v": Glm4vImageProcessorPil,
        "glm46v": Glm46VImageProcessorPil,
        "glm5_next": Glm5NextImageProcessorPil,
    }


META = ("image_processor_type", "processor_class", "feature_extractor_type")


def qwen_video_reference(
    hf: Any, frames: list[np.ndarray], size: dict[str, int] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """A Qwen video as transformers makes it with the PIL backend's arithmetic: ``hf``'s
    (``Qwen2VLImageProcessorPil``) per-frame ``resize``/``rescale``/``normalize`` at ``size``
    (default ``hf.size``), then ``Qwen2VLVideoProcessor.patchify``'s view/permute in numpy
    (transformers has no PIL video backend). ``(pixel_values_videos, video_grid_thw)``."""
    from transformers.image_utils import SizeDict

    ps, m, t = hf.patch_size, hf.merge_size, hf.temporal_patch_size
    bounds = hf.size if size is None else SizeDict(**size)
    processed = []
    for frame in frames:
        chw = np.moveaxis(frame, -1, 0)
        chw = hf.resize(chw, size=bounds, resample=hf.resample, factor=ps * m)
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


# name -> (family, config or None for the family's class defaults)
CONFIGS: dict[str, tuple[str, dict[str, Any] | None]] = {
    "qwen2-defaults": ("qwen2_vl", None),
    "qwen2-hub": ("qwen2_vl", QWEN2_HUB),
    "qwen3-hub": ("qwen2_vl", QWEN3_HUB),
    "qwen3_omni-hub": ("qwen3_omni_moe", QWEN3_OMNI_HUB),
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
    "gemma4-defaults": ("gemma4", None),
    "gemma4-file": ("gemma4", GEMMA4_FILE),
    "gemma4-70": ("gemma4", {**GEMMA4_FILE, "max_soft_tokens": 70}),
    "gemma4-1120": ("gemma4", {**GEMMA4_FILE, "max_soft_tokens": 1120}),
    "internvl-defaults": ("internvl", None),
    # The hub file read alone (no InternVLProcessor): one 448 x 448 image, no tiles.
    "internvl-single": (
        "internvl",
        {k: v for k, v in INTERNVL_HUB.items() if k != "processor_class"},
    ),
    "idefics3-defaults": ("idefics3", None),
    "idefics3-nosplit": ("idefics3", {**IDEFICS3_HUB, "do_image_splitting": False}),
    "smolvlm-hub": ("smolvlm", SMOLVLM_HUB),
    "mllama-defaults": ("mllama", None),
    "mllama-hub": ("mllama", MLLAMA_HUB),
    "glm4v-defaults": ("glm4v", None),
    "glm4v-hub": ("glm4v", GLM4V_HUB),
    "glm46v-defaults": ("glm46v", None),
    "glm5_next-defaults": ("glm5_next", None),
    "glm5_next-small": ("glm5_next", GLM5_NEXT_SMALL),
}


def configs_of(*families: str) -> list[str]:
    """The names in ``CONFIGS`` of the given families, in ``CONFIGS`` order."""
    return [name for name, (family, _) in CONFIGS.items() if family in families]


def hf_processor(name: str) -> Any:
    family, config = CONFIGS[name]
    kwargs = {k: v for k, v in (config or {}).items() if k not in META}
    return hf_classes()[family](**kwargs)


def our_processor(name: str, **kwargs: Any) -> ImageProcessor:
    family, config = CONFIGS[name]
    if config is None:
        return ImageProcessor.for_family(family, **kwargs)  # type: ignore[arg-type]
    return ImageProcessor.from_pretrained(config, **kwargs)


# ---- test images -------------------------------------------------------------------------


def pattern(height: int, width: int, seed: int) -> np.ndarray:
    """Gradients plus noise: every resampling tap matters."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack(
        [x * 255 // max(width - 1, 1), y * 255 // max(height - 1, 1), (x * 7 + y * 3) % 256],
        axis=-1,
    )
    noise = rng.integers(0, 256, (height, width, 3))
    return ((base * 3 + noise) // 4).astype(np.uint8)


def encode(image: Image.Image, fmt: str, **params: Any) -> bytes:
    """``image`` saved as ``fmt`` (a Pillow format name) with ``params``."""
    buf = io.BytesIO()
    image.save(buf, fmt, **params)
    return buf.getvalue()


def exif(orientation: int) -> bytes:
    """An EXIF block holding just the orientation tag."""
    from PIL import Image

    data = Image.Exif()
    data[0x0112] = orientation
    return data.tobytes()


def synthetic() -> dict[str, bytes]:
    """The synthetic test files, by name: sizes, modes, formats, EXIF orientations."""
    from PIL import Image

    rgb = Image.fromarray(pattern(61, 83, 1))
    alpha = np.fromfunction(lambda y, x: (x * 5 + y * 3) % 256, (61, 83)).astype(np.uint8)
    rgba = Image.fromarray(np.dstack([pattern(61, 83, 2), alpha]), "RGBA")
    palette = rgb.quantize(64)
    palette_trns = palette.copy()
    palette_trns.info["transparency"] = 3
    gray16 = Image.fromarray(pattern(45, 70, 3)[..., 0].astype(np.uint16) * 257)
    levels = Image.fromarray((pattern(40, 52, 17)[..., 0] // 64 * 60).astype(np.uint8))
    bilevel = levels.point(lambda v: 255 if v >= 120 else 0).convert("1")
    gray16_levels = Image.fromarray(np.asarray(levels).astype(np.uint16) * 4)
    photo = Image.open(io.BytesIO(images.grace_hopper()))
    photo.load()
    return {
        "rgb-1x1.png": encode(Image.fromarray(pattern(1, 1, 4)), "PNG"),
        "rgb-10x10.png": encode(Image.fromarray(pattern(10, 10, 5)), "PNG"),
        "odd-37x23.png": encode(Image.fromarray(pattern(37, 23, 6)), "PNG"),
        "odd-259x194.jpg": encode(Image.fromarray(pattern(259, 194, 7)), "JPEG", quality=90),
        "wide-3x600.png": encode(Image.fromarray(pattern(3, 600, 8)), "PNG"),  # ratio 200
        "tall-601x3.png": encode(Image.fromarray(pattern(601, 3, 9)), "PNG"),  # 200.33
        "tall-3000x500.jpg": encode(Image.fromarray(pattern(3000, 500, 10)), "JPEG"),
        "big-1500x2000.jpg": encode(Image.fromarray(pattern(1500, 2000, 11)), "JPEG"),
        "small-50x80.png": encode(Image.fromarray(pattern(50, 80, 12)), "PNG"),
        "gray.jpg": encode(rgb.convert("L"), "JPEG"),
        "gray.png": encode(rgb.convert("L"), "PNG"),
        "rgba.png": encode(rgba, "PNG"),
        "la.png": encode(rgba.convert("LA"), "PNG"),
        "palette.png": encode(palette, "PNG"),
        "palette-trns.png": encode(palette_trns, "PNG", transparency=3),
        "gray16.png": encode(gray16, "PNG"),
        # Single transparent colours that convert_to_rgb turns white after load_image: a gray
        # in use; "1" and "I;16" ints, which Pillow later compares as (t & 255, 0, 0).
        "l-trns.png": encode(levels, "PNG", transparency=60),
        "1-trns0.png": encode(bilevel, "PNG", transparency=0),
        "i16-trns256.png": encode(gray16_levels, "PNG", transparency=256),
        "progressive.jpg": encode(photo, "JPEG", progressive=True, quality=85),
        "444.jpg": encode(photo, "JPEG", subsampling=0, quality=92),
        "exif6.jpg": encode(photo, "JPEG", exif=exif(6)),
        "exif8.jpg": encode(photo.resize((300, 200)), "JPEG", exif=exif(8)),
        "exif3.png": encode(rgb, "PNG", exif=exif(3)),
        "cmyk.jpg": encode(photo.convert("CMYK"), "JPEG"),
        "palette.gif": encode(palette, "GIF"),
        "rgb.bmp": encode(rgb, "BMP"),
        "lossy.webp": encode(photo, "WEBP", quality=80),
        "alpha.webp": encode(rgba, "WEBP", lossless=True),
    }


def build_corpus(folder: Path) -> dict[str, Path]:
    """Every test image as a file in ``folder``: three real photographs and the synthetic
    cases (the ``corpus`` fixture of ``tests/vision/conftest.py``)."""
    files = {"grace_hopper.jpg": images.grace_hopper(), **synthetic()}
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
# The developer run (``-m "not slow"``) keeps these of the matrix: an odd size, alpha, an EXIF
# orientation, a palette with transparency; the rest (the photographs too) are marked slow.
FAST_IMAGES = ("odd-37x23.png", "rgba.png", "exif3.png", "palette-trns.png")
IMAGE_CASES = [
    pytest.param(name, marks=() if name in FAST_IMAGES else pytest.mark.slow)
    for name in IMAGE_NAMES
]

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
    """``load_image(path)``, with the file closed afterwards (``load_image`` of an opened
    image runs the same ``exif_transpose`` and ``convert("RGB")``)."""
    from PIL import Image
    from transformers.image_utils import load_image

    with Image.open(path) as im:
        return load_image(im)


def run_hf(hf: Any, inputs: Any, **kwargs: Any) -> Any:
    return hf(inputs, return_tensors="np", **kwargs)


# ---- the checks every family runs (its test module parametrizes them) ------------------------


def check_files(corpus: dict[str, Path], config: str, name: str) -> None:
    """Encoded files: our decoder + processor vs ``load_image`` + the PIL backend."""
    from transformers.image_transforms import convert_to_rgb

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


def check_pil_inputs(corpus: dict[str, Path], config: str, name: str) -> None:
    """PIL images (no EXIF, alpha composited on white by ``convert_to_rgb``) and encoded bytes
    with ``alpha="white"`` (our decoder's compositing) against the same PIL image transposed."""
    from PIL import Image, ImageOps

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


def check_raw_arrays(config: str, channels: int) -> None:
    """1- and 4-channel arrays: transformers' ``convert_to_rgb`` for numpy (repeat; composite
    ``round(a * rgb + (1 - a) * 255)``); a 2-D array is an ``HxWx1`` one."""
    rgb = pattern(57, 91, 13)
    alpha = np.fromfunction(lambda y, x: (x * 9 + y * 5) % 256, (57, 91)).astype(np.uint8)
    array = np.dstack([rgb, alpha]) if channels == 4 else rgb[..., :1]
    ref = run_hf(hf_processor(config), array, input_data_format="channels_last")
    ours = our_processor(config)
    got = ours(array[..., 0] if channels == 2 else array)
    assert_matches(got, ref, f"{config} {channels}-channel array")


def check_batches(corpus: dict[str, Path], config: str) -> None:
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


def check_options(family: str, options: dict[str, Any]) -> None:
    """Other filters, sizes, crops, paddings and switches, on a batch of two sizes."""
    batch = [pattern(211, 163, 21), pattern(97, 244, 22)]
    if options.get("do_resize") is False:
        batch = [pattern(196, 168, 23)]  # divisible for every layout that needs it
    hf = hf_classes()[family](**options)
    ref = run_hf(hf, batch, input_data_format="channels_last")
    ours = ImageProcessor(family, options)(batch)  # type: ignore[arg-type]
    for key in ref:
        want = np.asarray(ref[key])
        if want.dtype == np.uint8:  # no rescale and no normalize: transformers keeps uint8
            want = want.astype(np.float32)
        assert_same(getattr(ours, key), want, f"{family} {options} {key}")
