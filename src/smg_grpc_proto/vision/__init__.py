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
"""

from smg_grpc_proto.vision._decode import DEFAULT_MAX_PIXELS, ImageSource, decode
from smg_grpc_proto.vision._resample import PassOrder, Resample, resize

__all__ = ["DEFAULT_MAX_PIXELS", "ImageSource", "PassOrder", "Resample", "decode", "resize"]
