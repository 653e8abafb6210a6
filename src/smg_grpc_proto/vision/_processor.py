"""``ImageProcessor``: transformers' image processors (PIL backend), bit-exact, in Rust.

``ImageProcessor.from_pretrained(source)`` reads a transformers ``preprocessor_config.json`` (a
file, a local model directory or a dict; nothing is downloaded) and ``ImageProcessor.for_family``
starts from a family's transformers class defaults. Calling the processor runs decoding,
resizing, rescaling, normalisation and patching natively, with the GIL released and the images
of a batch spread over the cores; the outputs equal, byte for byte, those of the PIL backend
class (``Qwen2VLImageProcessorPil``, ``CLIPImageProcessorPil``, ``LlavaImageProcessorPil``,
``SiglipImageProcessorPil``, ``LlavaNextImageProcessorPil``, ``PixtralImageProcessorPil``,
``Gemma3ImageProcessorPil``, ``GotOcr2ImageProcessorPil`` for InternVL,
``Idefics3ImageProcessorPil``, ``SmolVLMImageProcessorPil``) of transformers 5.24.0 with
Pillow 13.0.0. Three references exist only on torch, and are matched bit for bit with torch
2.14.1 / torchvision 0.29.1 on CPU (tested against committed goldens): Llama 4 and
Phi-4-multimodal (transformers' torchvision classes ``Llama4ImageProcessor`` and
``Phi4MultimodalImageProcessor``) and Phi-3-vision (the hub's ``Phi3VImageProcessor``).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from smg_grpc_proto._core import native as _native
from smg_grpc_proto.vision import _config, _inputs, _tokens
from smg_grpc_proto.vision._config import Family
from smg_grpc_proto.vision._decode import DEFAULT_MAX_PIXELS

__all__ = ["DeferredOutput", "ImageProcessor", "ProcessorOutput"]

F32Array = npt.NDArray[np.float32]
#: float32, or bfloat16 (``ml_dtypes.bfloat16`` when installed; else widened to float32, exactly)
#: for Llama 4.
PixelArray = npt.NDArray[Any]
I64Array = npt.NDArray[np.int64]


# Every tensor a ProcessorOutput can hold, by transformers' name, in the order tensors() gives.
TENSOR_NAMES = (
    "pixel_values",
    "image_pixel_values",
    "image_grid_thw",
    "image_grid_hw",
    "image_sizes",
    "image_attention_mask",
    "aspect_ratios",
    "num_crops",
    "num_patches",
    "pixel_attention_mask",
    "rows",
    "cols",
    "aspect_ratio_ids",
    "aspect_ratio_mask",
    "num_tiles",
    "image_position_ids",
    "num_soft_tokens_per_image",
    "pixel_values_videos",
    "video_grid_thw",
    "video_second_per_grid",
)


@dataclass(frozen=True)
class ProcessorOutput:
    """The tensors of one call, under transformers' names, and the placeholder token counts."""

    pixel_values: PixelArray | None = None
    """Qwen: ``(sum of patches, 3 * T * ps * ps)``; CLIP/LLaVA/SigLIP: ``(B, 3, H, W)``;
    LLaVA-NeXT: ``(B, tiles, 3, H, W)``; Pixtral: ``(B, 3, H, W)``, each image padded at the
    bottom and right with ``0.0`` to the batch's largest height and width; Gemma 3:
    ``(B + sum(num_crops), 3, H, W)``, each image followed by its pan-and-scan crops; InternVL:
    ``(sum(num_patches), 3, H, W)``, each image's tiles in row-major order, then its thumbnail
    when it has more than one tile; Idefics3/SmolVLM: ``(1, sum of tiles, 3, m, m)`` (the images
    are one sample, as a flat list is for transformers), each image's ``rows x cols`` tiles in
    row-major order, then its global image when it is split; Llama 4: ``(sum of tiles, 3, 336,
    336)`` **bfloat16**, each image's tiles in row-major order, then its global tile when it has
    more than one; Phi-3-vision: ``(B, num_crops + 1, 3, 336, 336)``, the global image, the HD
    tiles, zero crops; Gemma 4: ``(B, max_patches, 3 * ps * ps)``, each image's patches in
    row-major order (each patch channels-last), zero patches up to ``max_patches``. ``None``
    when the call had only videos (and for Phi-4-multimodal, whose pixels are
    :attr:`image_pixel_values`)."""
    image_grid_thw: I64Array | None = None
    """Qwen: ``(B, 3)`` = ``[1, grid_h, grid_w]`` per image."""
    image_sizes: I64Array | None = None
    """LLaVA-NeXT: ``(B, 2)`` = each image's original ``(height, width)``; Pixtral: each image's
    processed ``(height, width)`` (before the batch padding); Phi-3-vision, Phi-4-multimodal:
    the padded HD image's ``(height, width)``."""
    pixel_values_videos: F32Array | None = None
    """Qwen and GLM videos: ``(sum of patches, 3 * T * ps * ps)``."""
    video_grid_thw: I64Array | None = None
    """Qwen and GLM videos: ``(V, 3)`` = ``[grid_t, grid_h, grid_w]`` per video."""
    num_image_tokens: tuple[int, ...] | None = None
    """Placeholder tokens per image (``None`` when the family needs :class:`VisionTokens`)."""
    num_video_tokens: tuple[int, ...] | None = None
    """Placeholder tokens per video (Qwen)."""
    num_crops: I64Array | None = None
    """Gemma 3: ``(B,)`` = pan-and-scan crops per image (all 0 with ``do_pan_and_scan`` off);
    last, so that positional construction keeps its meaning."""
    num_patches: I64Array | None = None
    """InternVL: ``(B,)`` = tiles per image, the thumbnail included (1 without tiling)."""
    pixel_attention_mask: I64Array | None = None
    """Idefics3/SmolVLM with ``do_pad``: ``(1, sum of tiles, m, m)`` int64, 1 for a pixel, 0 for
    padding (all 1 for one sample)."""
    rows: I64Array | None = None
    """Idefics3/SmolVLM: ``(1, B)`` = tile rows per image (0 when not split)."""
    cols: I64Array | None = None
    """Idefics3/SmolVLM: ``(1, B)`` = tile columns per image (0 when not split)."""
    aspect_ratios: I64Array | None = None
    """Llama 4: ``(B, 2)`` = tile rows and columns of each image's canvas."""
    image_pixel_values: F32Array | None = None
    """Phi-4-multimodal: ``(B, n, 3, 448, 448)``, per image the global image then its HD crops in
    row-major order, zero crops up to the batch's largest ``n``."""
    image_attention_mask: F32Array | None = None
    """Phi-4-multimodal: ``(B, n, 32, 32)`` float32, 1 over image patches and 0 over whole
    patches of padding (all 1 for the global image and the padding crops)."""
    aspect_ratio_ids: I64Array | None = None
    """Llama 3.2 Vision: ``(1, B)`` = each image's canvas, its index from 1 in the tile
    arrangements of at most ``max_image_tiles`` tiles."""
    aspect_ratio_mask: I64Array | None = None
    """Llama 3.2 Vision: ``(1, B, max_image_tiles)`` int64, 1 for each tile an image has."""
    num_tiles: I64Array | None = None
    """Llama 3.2 Vision: ``(1, B)`` = tiles per image (transformers' nested list, as a tensor)."""
    image_position_ids: I64Array | None = None
    """Gemma 4: ``(B, max_patches, 2)`` = each patch's ``(x, y)`` in the patch grid, ``(-1, -1)``
    for the padding patches (vLLM's ``pixel_position_ids``)."""
    num_soft_tokens_per_image: I64Array | None = None
    """Gemma 4: ``(B,)`` = soft tokens per image (patches / ``pooling_kernel_size ** 2``)."""
    image_grid_hw: I64Array | None = None
    """Nemotron-H-Omni: ``(B, 2)`` = each image's patch grid ``(h, w)``; its ``h * w`` rows of
    ``pixel_values`` follow the previous image's."""
    video_second_per_grid: F32Array | None = None
    """Qwen3-Omni videos: ``(V,)`` float32 = ``temporal_patch_size / fps`` per video (the
    processor's M-RoPE timing; ``fps`` is the configuration's, 1.0 unless given)."""

    def tensors(self) -> dict[str, npt.NDArray[Any]]:
        """Every tensor that is set, by transformers' name (what the model's forward takes)."""
        return {n: v for n in TENSOR_NAMES if (v := getattr(self, n)) is not None}

    def attach(
        self,
        message: Any,
        at: str = "mm_inputs",
        *,
        modality: Literal["image", "video"] = "image",
        dtype: str | None = None,
    ) -> None:
        """Attach the tensors to a :class:`smg_grpc_proto.tensors.TensorMessage`: the pixels as
        ``{at}.pixel_values`` (converted to ``dtype``, e.g. ``"bfloat16"``) and the side tensors
        as ``{at}.model_specific_tensors[name]`` — the layout of vLLM's and SGLang's
        ``MultimodalInputs``. ``modality="video"`` attaches ``pixel_values_videos`` and
        ``video_grid_thw`` (set the message's ``modality`` to VIDEO as well)."""
        tensors = self.tensors()
        primary = "pixel_values_videos" if modality == "video" else "pixel_values"
        if primary not in tensors and "image_pixel_values" in tensors:
            tensors["pixel_values"] = tensors.pop("image_pixel_values")
        if primary not in tensors:
            raise ValueError(f"this output has no {modality} tensors ({primary})")
        message.attach(f"{at}.pixel_values", tensors.pop(primary), dtype=dtype)
        keep = (
            ("video_grid_thw", "video_second_per_grid")
            if modality == "video"
            else (
                "image_grid_thw",
                "image_grid_hw",
                "image_sizes",
                "image_attention_mask",
                "aspect_ratios",
                "num_crops",
                "num_patches",
                "pixel_attention_mask",
                "rows",
                "cols",
                "aspect_ratio_ids",
                "aspect_ratio_mask",
                "num_tiles",
                "image_position_ids",
                "num_soft_tokens_per_image",
            )
        )
        for name in keep:
            if name in tensors:
                message.attach(f"{at}.model_specific_tensors[{name}]", tensors[name])


@dataclass(frozen=True)
class DeferredOutput:
    """What :meth:`ImageProcessor.deferred` returns: a :class:`ProcessorOutput` whose largest
    tensors are not written yet.

    ``ready`` holds every computed tensor and the token counts (the ``pending`` names are
    ``None`` there); ``pending`` maps transformers' name (``pixel_values``,
    ``pixel_values_videos``; Idefics3/SmolVLM also ``pixel_attention_mask``, all ones) to a
    :class:`smg_grpc_proto._native.PendingTensor`, which
    :meth:`smg_grpc_proto.tensors.TensorMessage.attach` accepts like an array and writes
    straight into the request. :meth:`materialize` gives the complete output.
    """

    ready: ProcessorOutput
    pending: Mapping[str, _native.PendingTensor]

    def materialize(self) -> ProcessorOutput:
        """The complete output: each pending tensor written into a new array."""
        arrays: dict[str, Any] = {n: _as_array(p.materialize()) for n, p in self.pending.items()}
        return dataclasses.replace(self.ready, **arrays)


def _as_array(tensor: Any) -> npt.NDArray[Any]:
    """A native output tensor as numpy, without a copy (bfloat16: its bits viewed as
    ``ml_dtypes.bfloat16``, or widened exactly to float32 when ml_dtypes is missing)."""
    array = np.asarray(tensor)
    if tensor.dtype != "bfloat16":
        return array
    try:
        import ml_dtypes
    except ImportError:
        # The bits moved into the high half of a float32, in one pass (a shift of a widened
        # copy would take two passes and a temporary: 4.5x slower for Llama 4's tiles).
        widened = np.empty(array.shape, np.uint32)
        np.left_shift(array, 16, out=widened, dtype=np.uint32)
        return widened.view(np.float32)
    return array.view(ml_dtypes.bfloat16)


_MAX_U64 = 2**64 - 1  # the native limit's type


class ImageProcessor:
    """A transformers image processor (PIL backend, or torch for Llama 4 and Phi) of one family
    and configuration.

    ``family`` is one of ``qwen2_vl``, ``qwen2_5_vl``, ``qwen3_vl``, ``qwen3_5``, ``clip``,
    ``llava``, ``siglip``, ``llava_next``, ``pixtral``, ``gemma3``, ``internvl``, ``idefics3``,
    ``smolvlm``, ``llama4``, ``phi4_multimodal``, ``phi3_v``; ``config`` holds transformers
    config keys overriding the family's class defaults. Encoded inputs (bytes, paths) become
    what transformers' processors make of a path (``alpha="load_image"``): ``load_image``
    applies the EXIF orientation (``apply_exif``) and ``convert("RGB")`` (alpha dropped; a
    single transparent colour is kept and ``convert_to_rgb`` turns its pixels white).
    ``alpha="white"`` composites alpha onto white instead, as ``convert_to_rgb`` does for an
    ``Image.open``-ed image; ``alpha="drop"`` is plain ``convert("RGB")``. ``max_pixels``
    rejects larger encoded images before decoding (``None``: no limit). ``threads``: ``None``
    (or ``0``) uses every core the batch's work pays for (a thread per 64 Ki decoded pixels and
    per 2 MiB of output: a few small images stay on the calling thread); ``N`` uses up to ``N``.
    ``vision_tokens`` lets CLIP/LLaVA/SigLIP/LLaVA-NeXT count placeholder tokens.
    """

    def __init__(
        self,
        family: Family,
        config: Mapping[str, Any] | None = None,
        *,
        threads: int | None = None,
        apply_exif: bool = True,
        alpha: Literal["load_image", "white", "drop"] = "load_image",
        max_pixels: int | None = DEFAULT_MAX_PIXELS,
        vision_tokens: _tokens.VisionTokens | None = None,
    ) -> None:
        normalised = _config.normalise(family, config or {}) if family in _config.FAMILIES else {}
        native_tokens = vision_tokens.native() if vision_tokens is not None else None
        self._native = _native.Preprocessor(family, normalised, native_tokens)
        if alpha not in ("load_image", "white", "drop"):
            raise ValueError(f"alpha must be 'load_image', 'white' or 'drop', got {alpha!r}")
        if max_pixels is not None and (isinstance(max_pixels, bool) or max_pixels < 0):
            raise TypeError(f"max_pixels must be a non-negative int or None, got {max_pixels!r}")
        if max_pixels is not None and max_pixels > _MAX_U64:
            raise ValueError(f"max_pixels must lie in 0..{_MAX_U64} (or be None), got {max_pixels}")
        self.family: Family = family
        self.threads = threads
        self.apply_exif = bool(apply_exif)
        self.alpha: Literal["load_image", "white", "drop"] = alpha
        self.max_pixels = max_pixels
        self._vision_tokens = vision_tokens
        self._config: dict[str, Any] = self._native.config()

    @property
    def vision_tokens(self) -> _tokens.VisionTokens | None:
        """The vision-tower settings the CLIP-like families count tokens with (fixed at
        construction: the native processor counts them)."""
        return self._vision_tokens

    @property
    def config(self) -> dict[str, Any]:
        """The complete configuration (defaults included), in the native processor's keys."""
        return copy.deepcopy(self._config)

    def __repr__(self) -> str:
        return f"ImageProcessor({self.family!r}, {self._config!r})"

    @classmethod
    def for_family(cls, family: Family, **kwargs: Any) -> ImageProcessor:
        """The family's transformers class defaults (Qwen3-VL/3.5, which reuse Qwen2-VL's
        class, get the values of their published configs: patch 16, mean/std 0.5,
        65 536 to 16 777 216 pixels; Gemma 3 gets its published 896 x 896 and
        ``Gemma3Processor``'s pan-and-scan defaults; InternVL its published 448 x 448, ImageNet
        mean/std and ``InternVLProcessor``'s ``crop_to_patches``; Idefics3 and SmolVLM, whose
        classes share their defaults, 1456 and tiles of 364, ``image_seq_len`` 169); ``kwargs``
        go to the constructor."""
        return cls(family, None, **kwargs)

    @classmethod
    def from_pretrained(
        cls,
        source: Mapping[str, Any] | str | os.PathLike[str],
        *,
        family: Family | None = None,
        **kwargs: Any,
    ) -> ImageProcessor:
        """From a transformers ``preprocessor_config.json``: its path, a local model directory
        holding it, or its contents as a dict. The family comes from ``image_processor_type``
        unless given; a directory's ``processor_config.json`` supplies ``vision_tokens`` and, for
        Pixtral, the ``patch_size`` and ``spatial_merge_size`` that ``PixtralProcessor`` passes
        to its image processor (its defaults 16 and 1 when the file lacks them), for Gemma 3
        and InternVL their processor's ``image_seq_length`` (over the preprocessor config's), for
        Idefics3/SmolVLM their processor's ``image_seq_len``, for Llama 4 ``Llama4Processor``'s
        ``patch_size`` and ``pixel_shuffle_ratio``. An
        InternVL config whose ``processor_class`` (or the directory's) is ``InternVLProcessor``
        gets ``crop_to_patches = True``: that processor passes it on every call, over the
        file's value (the published files say ``false``)."""
        chosen, raw = _config.from_hf(source, family)
        data: Any = None
        keys = _config.processor_keys(chosen)
        wanted = bool(keys) or "vision_tokens" not in kwargs
        if wanted and not isinstance(source, Mapping):
            directory = Path(source) if Path(source).is_dir() else Path(source).parent
            processor_config = directory / "processor_config.json"
            if processor_config.is_file():
                with open(processor_config, encoding="utf-8") as f:
                    data = json.load(f)
        if isinstance(data, dict):
            # The family's processor settings (rust/src/processors/<family>.rs, `Hf`), e.g.
            # Pixtral's patch_size/spatial_merge_size, Gemma 3's image_seq_length.
            for key, default in keys:
                if default is not None:
                    raw[key] = data.get(key, default)
                elif data.get(key) is not None:
                    raw[key] = data[key]
            if not keys and "vision_tokens" not in kwargs:
                kwargs["vision_tokens"] = _tokens.VisionTokens.from_processor_config(data)
        forces = _config.processor_forces(chosen)
        if forces is not None:
            owner, key, value = forces
            owners = (
                raw.get("processor_class"),
                data.get("processor_class") if isinstance(data, dict) else None,
            )
            if owner in owners:
                # e.g. InternVLProcessor.images_kwargs = {"crop_to_patches": True}: passed to the
                # image processor on every call, so it wins over the preprocessor config's value.
                raw[key] = value
        return cls(chosen, raw, **kwargs)

    def __call__(
        self,
        images: Any = None,
        *,
        videos: Any = None,
        threads: int | None = None,
    ) -> ProcessorOutput:
        """Process ``images`` (one image or a list: encoded bytes, paths, uint8 ``HxW[xC]``
        arrays, PIL images) and/or ``videos`` (Qwen, GLM: a list of frames, or a list of videos)."""
        values = self._values(images, videos, threads, deferred=False)
        return self._output(values)

    def deferred(
        self,
        images: Any = None,
        *,
        videos: Any = None,
        threads: int | None = None,
    ) -> DeferredOutput:
        """Like calling the processor, but ``pixel_values`` (and ``pixel_values_videos``) are
        left unwritten: everything is decoded, resized, checked and laid out, and the values are
        written only where they are needed — straight into a serialized request by
        :func:`smg_grpc_proto.tensors.serialize`, or into a shared-memory segment — so the
        largest tensor of a request is written once and never copied. So do the Qwen families,
        GLM, MiniMax-M3-VL, LLaVA-NeXT, Gemma 3, Gemma 4, InternVL, Llama 3.2 Vision and
        Idefics3/SmolVLM
        (whose ``pixel_attention_mask``, all ones, is left unwritten too); the other families
        compute everything now."""
        values = self._values(images, videos, threads, deferred=True)
        pending = {k: v for k, v in values.items() if isinstance(v, _native.PendingTensor)}
        ready = self._output({k: v for k, v in values.items() if k not in pending})
        return DeferredOutput(ready, pending)

    def _values(self, images: Any, videos: Any, threads: int | None, *, deferred: bool) -> Any:
        if images is None and videos is None:
            raise ValueError("pass images, videos or both")
        n_threads = threads if threads is not None else (self.threads or 0)
        if isinstance(n_threads, bool) or n_threads < 0:
            raise ValueError(f"threads must be a non-negative int, got {n_threads!r}")
        args = (n_threads, self.apply_exif, self.alpha, self.max_pixels)
        values: dict[str, Any] = {}
        if images is not None:
            keep_alpha = bool(self._native.keeps_alpha)
            items = [
                _inputs.to_native(item, f"images[{i}]", keep_alpha)
                for i, item in enumerate(_inputs.flatten_images(images))
            ]
            images_method: Any = self._native.images_deferred if deferred else self._native.images
            values.update(self._run(images_method, items, args))
        if videos is not None:
            batch = [
                [_inputs.to_native(f, f"videos[{v}][{i}]") for i, f in enumerate(frames)]
                for v, frames in enumerate(_inputs.flatten_videos(videos))
            ]
            videos_method: Any = self._native.videos_deferred if deferred else self._native.videos
            values.update(self._run(videos_method, batch, args))
        return values

    def _output(self, values: dict[str, npt.NDArray[Any]]) -> ProcessorOutput:
        return ProcessorOutput(
            pixel_values=values.get("pixel_values"),
            aspect_ratios=values.get("aspect_ratios"),
            image_pixel_values=values.get("image_pixel_values"),
            image_attention_mask=values.get("image_attention_mask"),
            image_grid_thw=values.get("image_grid_thw"),
            image_grid_hw=values.get("image_grid_hw"),
            image_sizes=values.get("image_sizes"),
            num_crops=values.get("num_crops"),
            num_patches=values.get("num_patches"),
            pixel_attention_mask=values.get("pixel_attention_mask"),
            rows=values.get("rows"),
            cols=values.get("cols"),
            aspect_ratio_ids=values.get("aspect_ratio_ids"),
            aspect_ratio_mask=values.get("aspect_ratio_mask"),
            num_tiles=values.get("num_tiles"),
            image_position_ids=values.get("image_position_ids"),
            num_soft_tokens_per_image=values.get("num_soft_tokens_per_image"),
            pixel_values_videos=values.get("pixel_values_videos"),
            video_grid_thw=values.get("video_grid_thw"),
            video_second_per_grid=values.get("video_second_per_grid"),
            num_image_tokens=_counts(values.get("num_image_tokens")),
            num_video_tokens=_counts(values.get("num_video_tokens")),
        )

    @staticmethod
    def _run(method: Any, items: Any, args: tuple[int, bool, str, int | None]) -> dict[str, Any]:
        tensors = method(items, *args)
        return {
            name: tensor if isinstance(tensor, _native.PendingTensor) else _as_array(tensor)
            for name, tensor in tensors
        }


def _counts(tokens: npt.NDArray[Any] | None) -> tuple[int, ...] | None:
    """The native processor's token counts (``num_image_tokens``, ``num_video_tokens``)."""
    return None if tokens is None else tuple(int(n) for n in tokens.tolist())
