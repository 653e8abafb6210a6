"""Vision preprocessing in Rust, bit-exact with transformers' PIL backend.

Available today:

* :func:`decode`: JPEG, PNG, GIF, BMP and WebP bytes (or a path) to an RGB ``uint8`` array, equal
  byte for byte to what transformers' loader gets from Pillow 13.0.0 (``Image.open``,
  ``ImageOps.exif_transpose``, ``convert_to_rgb``), with a pixel limit checked before allocating
  and the GIL released.
* :func:`resize`: Pillow 13.0.0's ``Image.resize`` on numpy ``uint8`` arrays, byte for byte
  (nearest, box, bilinear, hamming, bicubic, lanczos; Pillow 13's pass order by default, the
  order of Pillow <= 12.2 on request), with the GIL released and SIMD/threads that never change
  a byte.
* :func:`resize_torch` and :func:`interpolate_bicubic`: torch 2.14.1's CPU antialiased ``uint8``
  resize (bilinear, bicubic) and float bicubic interpolation, bit for bit.
* :class:`ImageProcessor`: the image processors of all sixteen families — Qwen2-VL,
  Qwen2.5-VL, Qwen3-VL, Qwen3.5, CLIP, LLaVA-1.5, SigLIP, LLaVA-NeXT, Pixtral, Gemma 3,
  InternVL, Idefics3 and SmolVLM bit-exact with transformers' PIL backend; Llama 4,
  Phi-4-multimodal and Phi-3-vision bit-exact with their torch references (:data:`Family`
  names them all) — (``from_pretrained(preprocessor_config.json | model dir | dict)`` or
  ``for_family(name)``);
  a batch of images (bytes, paths, arrays, PIL images) or Qwen and GLM videos in, a
  :class:`ProcessorOutput` of numpy tensors and placeholder token counts out;
  :meth:`ImageProcessor.deferred` leaves Qwen's ``pixel_values`` to be written straight into a
  request (:class:`DeferredOutput`).
* :func:`buffer_cache`: the limit of the cache of large buffers (outputs, decoded images) that
  calls recycle.
"""

from smg_grpc_proto.vision._cache import BufferCache, buffer_cache
from smg_grpc_proto.vision._config import Family
from smg_grpc_proto.vision._decode import DEFAULT_MAX_PIXELS, ImageSource, decode
from smg_grpc_proto.vision._glm_video import (
    GlmVideoMetadata,
    glm_sample_frames,
    glm_video_replacement,
    glm_video_text,
    glm_video_timestamps,
)
from smg_grpc_proto.vision._processor import DeferredOutput, ImageProcessor, ProcessorOutput
from smg_grpc_proto.vision._resample import (
    PassOrder,
    Resample,
    TorchResample,
    interpolate_bicubic,
    resize,
    resize_torch,
)
from smg_grpc_proto.vision._tokens import VisionTokens

__all__ = [
    "DEFAULT_MAX_PIXELS",
    "BufferCache",
    "DeferredOutput",
    "Family",
    "GlmVideoMetadata",
    "ImageProcessor",
    "ImageSource",
    "PassOrder",
    "ProcessorOutput",
    "Resample",
    "TorchResample",
    "VisionTokens",
    "buffer_cache",
    "decode",
    "glm_sample_frames",
    "glm_video_replacement",
    "glm_video_text",
    "glm_video_timestamps",
    "interpolate_bicubic",
    "resize",
    "resize_torch",
]
