"""Type stub of the private Rust extension; checked against the binary by mypy stubtest.

Every error the extension raises is a class of :mod:`smg_grpc_proto.errors`, built in Rust with
its ``field``, ``expected``, ``actual`` (and ``offset``, ``format`` or ``index``): tensor
functions raise ``TensorError`` (``TensorTypeError`` for a wrong Python type,
``TensorMemoryError`` for a failed allocation), the resize functions ``ResizeError``
(``ProcessingMemoryError``), ``decode_image`` the ``ImageDecodeError`` subclasses and
``Preprocessor`` the ``ImageProcessingError`` subclasses. Below, ``ValueError``, ``TypeError``
and ``MemoryError`` name the builtin each of those derives from. Argument errors are classes of
``smg_grpc_proto.errors`` too, each with ``field`` naming the argument (``"images[3]"``,
``'config["size"]'``, ``"parts[2]"``, ``"dst"``) and ``expected``/``actual``: a wrong Python
type is ``TensorTypeError`` (tensor functions) or ``ImageTypeError`` (vision and hashing), both
``TypeError``s; an image array of the wrong dtype, shape or layout is ``ImageShapeError``; and
``decode_image``'s ``alpha`` or ``max_pixels`` out of range is ``ProcessorConfigError`` (a
``ValueError`` that is not an ``ImageDecodeError``, so ``except ImageDecodeError`` catches only
images that fail to decode).
"""

from collections.abc import Sequence
from typing import Any, TypeAlias, TypedDict, final, type_check_only

import numpy as np
import numpy.typing as npt

from smg_grpc_proto.build import NativeBuildInfo

__all__ = [
    "DEFAULT_MAX_PIXELS",
    "DecodedImage",
    "PendingTensor",
    "Preprocessor",
    "Tensor",
    "__version__",
    "_error_samples",
    "blake3",
    "buffer_cache",
    "build_info",
    "convert",
    "convert_into",
    "decode_error_kinds",
    "decode_frames",
    "decode_image",
    "dtype_itemsize",
    "encode_frames",
    "families",
    "family_of_model_type",
    "family_of_processor_class",
    "image_format",
    "interpolate_bicubic",
    "jpeg_huffman_stats",
    "keep_freed_memory",
    "media_digest",
    "media_digests",
    "normalise_config",
    "packed_prompt",
    "png_inflate_stats",
    "processor_error_kinds",
    "processor_families",
    "resize",
    "resize_torch",
    "uint32_list",
    "uint32_varints",
]
__version__: str

# Where TensorData messages sit in a message type: a tuple of (field_number, child) pairs, child
# being another plan; or an int, meaning "this message is a TensorData whose payload bytes are
# this field" (1 for SGLang ``data`` and vLLM ``inline``, 3 for TokenSpeed ``inline``). Map
# fields are messages with key = 1 and value = 2. Nested at most 100 levels deep.
_Plan: TypeAlias = int | tuple[tuple[int, "_Plan"], ...]

def build_info() -> NativeBuildInfo: ...
def dtype_itemsize(name: str) -> int:
    """Bytes per element of a wire dtype (``float32`` 4, ``bfloat16`` 2, ``float16`` 2,
    ``int64`` 8, ``uint32`` 4, ``uint8`` 1).

    Raises ``ValueError`` for a name outside that vocabulary.
    """

def convert(src: npt.NDArray[Any], wire_dtype: str) -> bytes:
    """The bytes of ``src`` on the wire as ``wire_dtype``, in a new ``bytes`` object.

    ``src`` must be a C-contiguous numpy array of dtype ``<f4``, ``<f2``, ``<i8``, ``<u4``,
    ``|u1`` or ``<u2`` (bfloat16 bits). Same dtype: a copy. ``float32`` to ``bfloat16`` or
    ``float16``: round to nearest even, overflow to ±Inf, NaN stays a (quiet) NaN with its
    sign. Inputs of 1 MiB or more are converted on several threads; the GIL is released.

    Raises ``TypeError`` if ``src`` is not a numpy array, ``ValueError`` for an unknown or
    unsupported dtype, a conversion not offered, or a non-contiguous array; ``MemoryError``
    naming the bytes when the output cannot be allocated.
    """

def convert_into(
    src: npt.NDArray[Any] | PendingTensor, dst: npt.NDArray[np.uint8], wire_dtype: str
) -> None:
    """Like :func:`convert`, written into ``dst`` (e.g. a shared-memory mapping).

    ``dst`` must be a writable, C-contiguous ``uint8`` array of exactly the converted size and
    must not overlap ``src``; ``ValueError`` names both sizes otherwise. A
    :class:`PendingTensor` is written straight into ``dst`` as ``float32`` or ``bfloat16``
    (the same values rounded to nearest even), a constant ``int64`` one as ``int64``; any other
    ``wire_dtype`` raises ``ValueError``.
    """

def packed_prompt(
    input_ids: list[int],
    anchors: Sequence[int],
    counts: Sequence[Sequence[int]],
    field: int,
) -> tuple[bytes, list[list[tuple[int, int]]]] | None:
    """``input_ids`` with each occurrence of ``anchors[m]`` expanded to a run of
    ``counts[m][k]`` copies of it (its ``k``-th item's token count), as the whole record of the
    packed ``repeated uint32`` field number ``field`` (tag, length, varints) for protobuf to merge
    into a message, and per media each item's ``(offset, length)`` in the expanded ids.

    ``None`` when an id, an anchor or a count is not an ``int`` within range, when two media
    share an anchor, when an anchor occurs other than once per item, when a count is 0 or when
    ``field`` is not a field number: the caller's general path raises the error.
    :class:`~smg_grpc_proto.errors.TensorTypeError` (``field="input_ids"``) when ``input_ids``
    is not a list; :class:`~smg_grpc_proto.errors.TensorMemoryError` when the record cannot be
    allocated.
    """

def uint32_list(values: list[int]) -> bytes | None:
    """The little-endian uint32 bytes of ``values``, a list of ``int`` each in ``0..2**32 - 1``
    (a prompt's token ids), read in one pass without numpy's type discovery; ``None`` as soon as
    an item is not exactly an ``int`` or lies outside that range (numpy's path then names it).

    :class:`~smg_grpc_proto.errors.TensorTypeError` (``field="values"``) for anything but a
    ``list``; :class:`~smg_grpc_proto.errors.TensorMemoryError` when the bytes cannot be
    allocated.
    """

def uint32_varints(values: bytes) -> bytes:
    """The minimal varints of ``values`` (little-endian uint32s) one after the other: the payload
    of a packed ``repeated uint32`` field (a request's token ids), for protobuf to parse in C.

    :class:`~smg_grpc_proto.errors.TensorError` (``field="values"``) when ``values`` is not a
    whole number of 4-byte items; :class:`~smg_grpc_proto.errors.TensorTypeError` for anything
    but ``bytes``.
    """

def decode_frames(data: bytes, plan: _Plan, nonce: bytes) -> tuple[bytes, list[tuple[int, int]]]:
    """Split a serialized message into a small header and its tensor payload spans.

    Walks ``data`` as a message of type ``plan``: every TensorData payload record is replaced
    by the 20-byte token ``nonce + u32_le(i)`` (``i`` counts payloads in encounter order) and
    enclosing length prefixes are re-encoded; everything else is copied verbatim. Returns the
    header (a valid serialization of the same message with tokens as payloads) and, per token,
    ``(offset, length)`` of the original payload within ``data``.

    ``nonce`` must be 16 bytes. Raises ``ValueError`` naming the byte offset for malformed wire
    data (truncation, invalid wire type or field number, groups), for a malformed plan, and for
    a ``data`` beyond the 2 GiB protobuf limit; ``TypeError`` for a plan of the wrong shape.
    """

def encode_frames(
    header: bytes,
    plan: _Plan,
    nonce: bytes,
    sources: Sequence[tuple[npt.NDArray[Any] | PendingTensor, str]],
) -> bytes:
    """The inverse of :func:`decode_frames`: write the tensors into the header.

    A :class:`PendingTensor` source is computed straight into its place as ``float32`` or
    ``bfloat16`` (the same values rounded to nearest even: half the bytes), a constant ``int64``
    one as ``int64``.

    Every TensorData payload of ``header`` that is a token ``nonce + u32_le(i)`` is replaced by
    ``sources[i]`` = ``(array, wire_dtype)`` converted as by :func:`convert`, written straight
    into the output (one pass over each tensor's bytes, in parallel for tensors of 1 MiB or
    more, GIL released); enclosing lengths are re-encoded. Other payloads are kept verbatim.

    Raises ``ValueError`` for a token index without a source, an output beyond the 2 GiB
    protobuf limit, malformed wire data or plan, or an unusable source array (message prefixed
    ``sources[i]``); ``TypeError`` for arguments of the wrong type; ``MemoryError`` naming the
    bytes when the output cannot be allocated.
    """

def resize(
    image: npt.NDArray[np.uint8],
    width: int,
    height: int,
    filter: str,
    pass_order: str,
    region: tuple[float, float, float, float] | None,
    threads: int,
) -> bytearray:
    """Pillow 13.0.0's ``Image.resize((width, height), filter, box=region, reducing_gap=None)``
    of a C-contiguous uint8 array ``(H, W)`` or ``(H, W, C)``, C in 1, 3, 4, byte for byte.
    ``filter``: ``nearest``, ``box``, ``bilinear``, ``hamming``, ``bicubic``, ``lanczos``.

    Returns ``height * width * C`` new bytes (row-major, channels interleaved). ``pass_order``
    ``"pillow12"`` selects the order of Pillow <= 12.2 (always horizontal first); ``threads`` 0
    picks one per core for large images. The GIL is released while resizing.

    Raises ``TypeError`` if ``image`` is not a numpy array, ``ValueError`` for a non-uint8,
    non-contiguous or badly shaped array, a channel count other than 1, 3, 4, a non-positive or
    too large size (65536 per side, 2**31 - 1 bytes), an unknown filter or pass order, or a box
    Pillow rejects; ``MemoryError`` naming the bytes and the buffer when one cannot be
    allocated.
    """

def resize_torch(
    image: npt.NDArray[np.uint8],
    width: int,
    height: int,
    filter: str,
    threads: int,
) -> bytearray:
    """torch 2.14.1's antialiased uint8 resize on CPU (``torchvision.transforms.v2.functional.
    resize(t, [height, width], interpolation, antialias=True)`` of the CHW tensor ``t`` of
    ``image``), bit for bit, for a C-contiguous uint8 array ``(H, W)`` or ``(H, W, C)``, C in 1,
    3, 4. ``filter``: ``bilinear`` or ``bicubic``.

    Returns ``height * width * C`` new bytes, interleaved like the input. The GIL is released.
    Raises like :func:`resize`.
    """

def interpolate_bicubic(planes: npt.NDArray[np.float32], height: int, width: int) -> bytearray:
    """``torch.nn.functional.interpolate(x[None], (height, width), mode="bicubic",
    align_corners=False)[0]`` on CPU (torch 2.14.1), bit for bit, for a C-contiguous float32
    array ``(C, H, W)``; returns the ``C * height * width`` float32 values' bytes.

    Raises ``TypeError`` for a non-array, ``ValueError`` for another dtype, layout or rank, an
    empty input, or a non-positive or too large size; ``MemoryError`` naming the bytes and the
    buffer when one cannot be allocated.
    """

DEFAULT_MAX_PIXELS: int

@final
class DecodedImage:
    """RGB pixels owned by the extension; ``numpy.asarray`` views them without a copy."""

    @property
    def height(self) -> int: ...
    @property
    def width(self) -> int: ...
    @property
    def __array_interface__(self) -> dict[str, Any]: ...

def decode_image(
    data: bytes, apply_exif: bool, max_pixels: int | None, alpha: str, threads: int = 1
) -> DecodedImage:
    """Decode a JPEG, PNG, GIF, BMP or WebP file to RGB (``height x width x 3`` bytes).

    ``alpha`` is ``"white"`` or ``"drop"``; ``threads`` the threads the decode may use (0: one
    per core). Failures raise the ``ImageDecodeError`` subclass
    of their kind (``smg_grpc_proto.errors.IMAGE_DECODE_ERRORS``), with ``field``, ``expected``,
    ``actual`` and ``format``; a bad ``alpha`` or an out-of-range ``max_pixels`` raises
    ``ProcessorConfigError`` and a non-int ``max_pixels`` ``ImageTypeError``.
    """

def jpeg_huffman_stats() -> dict[str, int]:
    """JPEG scans whose Huffman decoding the Rust decoder took since the process started:
    ``inline`` (on the calling thread), ``helper`` (on a helper thread: ``decode_image(...,
    threads=0 or >= 2)``), ``shared`` (of those, with the calling thread decoding some restart
    intervals too), ``progressive`` (scans of progressive files, on the calling thread),
    ``progressive_rows`` (calls that decoded the rest of a block row of a progressive scan of
    one component), ``resumed`` (images where libjpeg-turbo took a scan over at the MCU where
    the Rust decoder stopped on an anomaly, decoding only the rest of that scan) and ``retried``
    (images given back to libjpeg-turbo on an anomaly where it could not: decoded again by
    libjpeg alone)."""

def png_inflate_stats() -> dict[str, int]:
    """PNG images since the process started whose image data our inflate took (``ours``: a
    whole, valid stream filling the image, of at least 2 KiB compressed), and those left to
    zlib-rs (``zlib``)."""

def image_format(data: bytes) -> str | None:
    """The format ``decode_image`` recognises from the signature at the start of ``data`` (16
    bytes suffice), lower-case (``"jpeg"``, ``"png"``, ``"gif"``, ``"bmp"``, ``"webp"``), or
    ``None``; nothing is decoded."""

def decode_error_kinds() -> list[str]:
    """The kind of every decoding failure, one per Rust ``DecodeError`` variant."""

@final
class Tensor:
    """An output tensor owned by the extension; ``numpy.asarray`` views it without a copy."""

    @property
    def shape(self) -> list[int]: ...
    @property
    def dtype(self) -> str:
        """``"float32"``, ``"int64"`` or ``"bfloat16"`` (exposed to numpy as its ``uint16``
        bits)."""

    @property
    def __array_interface__(self) -> dict[str, Any]: ...

@final
class PendingTensor:
    """A ``pixel_values`` (or ``pixel_values_videos``) not written yet: the batch decoded,
    resized and laid out; or an ``int64`` tensor of one constant value (Idefics3's
    ``pixel_attention_mask``). :func:`encode_frames` and :func:`convert_into` write it straight
    into its destination (as ``float32`` or ``bfloat16``; a constant one as ``int64``);
    :meth:`materialize` into a new :class:`Tensor`."""

    @property
    def name(self) -> str: ...
    @property
    def shape(self) -> list[int]: ...
    def reshaped(self, shape: list[int]) -> PendingTensor:
        """The same values under another shape of as many elements (a view: nothing is
        written; both write the same bytes)."""
    @property
    def dtype(self) -> str:
        """``"float32"`` (the values computed; ``bfloat16`` on the wire rounds them), or
        ``"int64"`` for a tensor of one constant value."""

    @property
    def nbytes(self) -> int: ...
    def materialize(self) -> Tensor:
        """The values written into a new tensor (each call writes them again)."""

@type_check_only
class Published(TypedDict):
    """A family's published checkpoints (``Preprocessor.published``)."""

    image: int
    video: int | None
    vision_tokens: tuple[int, int, str] | None
    count_tensor: str | None

@type_check_only
class ReplacementSpec(TypedDict):
    """A family's prompt replacement rule and engine layout (``Preprocessor.replacement_spec``)."""

    grid: list[str]
    anchor: str
    embed: str
    tokens: list[str]
    defaults: dict[str, int]
    flat: list[str]
    sizes: str
    per_sample: bool
    joins: list[str]
    """Text pieces (named like ``tokens``, ids in ``defaults``) that the processor's tokenizer
    writes as one token where they meet at a replacement's edge (Gemma 3's newline runs)."""

@final
class Preprocessor:
    """A model image processor (``rust/src/processors``): a family's transformers class
    defaults overridden by normalised config keys (:func:`normalise_config`).

    Failures raise the ``ImageProcessingError`` subclass of their kind
    (``smg_grpc_proto.errors.IMAGE_PROCESSING_ERRORS``) with ``field``, ``expected``,
    ``actual`` and ``index``, or, for an image that fails to decode, the ``ImageDecodeError``
    subclass of its kind.
    """

    def __new__(
        cls,
        family: str,
        config: dict[str, Any],
        vision_tokens: tuple[int, int, str | None] | None = None,
    ) -> Preprocessor: ...
    @property
    def family(self) -> str: ...
    @property
    def keeps_alpha(self) -> bool:
        """Whether PIL images with transparency data are handed over as RGBA arrays (Inkling2's
        processor composites alpha onto its checkerboard itself)."""
    def config(self) -> dict[str, Any]:
        """Every key of the configuration and its value (defaults included)."""

    def replacement_spec(self) -> ReplacementSpec | None:
        """For a family whose image anchor becomes more than a run of one token (Llama 4, the
        tiled families): its grid tensors, anchor and embedding tokens, every token of the
        replacement and their published ids, the tensors engines take flat and the name of
        their sizes tensor, whether the outputs carry a sample dimension of 1, and the text
        pieces that merge across a replacement's edge. ``None`` for the other families."""

    def published(self) -> Published | None:
        """The placeholder tokens of the family's published checkpoints when its replacement is
        a run of one token (image, video, the CLIP-like tower's token rule, and the per-image
        count tensor an engine model takes); ``None`` for a family with a structured
        replacement (its ids are in ``replacement_spec()["defaults"]``)."""

    def prompt_replacement(
        self, grid: Sequence[int], token_ids: Sequence[tuple[str, int]]
    ) -> tuple[list[int], list[bool], int]:
        """One image's replacement from its grid row: the token ids, which of them take
        embeddings, and the rows of the primary tensor the image owns."""

    def images(
        self,
        images: Sequence[bytes | npt.NDArray[np.uint8]],
        threads: int,
        apply_exif: bool,
        alpha: str,
        max_pixels: int | None,
    ) -> list[tuple[str, Tensor]]:
        """Process encoded ``bytes`` and uint8 ``HxW``/``HxWxC`` (C = 1, 3, 4) arrays: the
        tensors by transformers' names, then ``num_image_tokens`` (int64, one per image) when
        the family can count its placeholder tokens.

        ``threads`` 0 uses every core the work pays for (a few small images stay on one);
        ``alpha`` (encoded inputs) is ``"load_image"`` (transformers' path loading), ``"white"``
        (``convert_to_rgb``) or ``"drop"``.
        """

    def videos(
        self,
        videos: Sequence[Sequence[bytes | npt.NDArray[np.uint8]]],
        threads: int,
        apply_exif: bool,
        alpha: str,
        max_pixels: int | None,
    ) -> list[tuple[str, Tensor]]:
        """Process videos (lists of frames); Qwen families only. ``num_video_tokens`` (int64,
        one per video) follows the tensors."""

    def images_deferred(
        self,
        images: Sequence[bytes | npt.NDArray[np.uint8]],
        threads: int,
        apply_exif: bool,
        alpha: str,
        max_pixels: int | None,
    ) -> list[tuple[str, Tensor | PendingTensor]]:
        """:meth:`images`, ``pixel_values`` left as a :class:`PendingTensor` where the family
        plans it (Qwen, GLM, MiniMax-M3-VL, LLaVA-NeXT, Gemma 3, Gemma 4, InternVL, Idefics3,
        Llama 3.2 Vision), and
        Idefics3's ``pixel_attention_mask`` (all ones) too."""

    def videos_deferred(
        self,
        videos: Sequence[Sequence[bytes | npt.NDArray[np.uint8]]],
        threads: int,
        apply_exif: bool,
        alpha: str,
        max_pixels: int | None,
    ) -> list[tuple[str, Tensor | PendingTensor]]:
        """:meth:`videos`, ``pixel_values_videos`` left as a :class:`PendingTensor`."""

def media_digest(
    parts: list[bytes | npt.NDArray[Any]] | tuple[bytes | npt.NDArray[Any], ...],
) -> bytes:
    """The 32-byte BLAKE3 digest of ``parts`` (bytes and C-contiguous arrays, raw memory), each
    preceded by its length as a little-endian u64. The GIL is released while hashing. Any other
    part (or a non-contiguous array) raises ``ImageTypeError`` naming ``parts[i]``."""

def media_digests(
    batches: list[list[bytes | npt.NDArray[Any]]] | tuple[list[bytes | npt.NDArray[Any]], ...],
    threads: int = 0,
) -> list[bytes]:
    """:func:`media_digest` of each list of parts, on up to ``threads`` threads (0: one per
    core; a small batch stays on the calling thread) with the GIL released. Errors as
    :func:`media_digest`'s, naming ``batches[i][j]``."""

def blake3(data: bytes) -> bytes:
    """The plain 32-byte BLAKE3 hash of ``data``; the GIL is released while hashing."""

def buffer_cache(limit: int | None = None) -> tuple[int, int]:
    """The buffer cache: set its limit in bytes (0: off); ``(previous limit, held)``."""

def keep_freed_memory(max_bytes: int) -> bool:
    """glibc: allocations up to ``max_bytes`` from the heap, freed memory kept (process-wide);
    ``False`` where the allocator is not glibc's or refuses the value."""

def processor_error_kinds() -> list[str]:
    """The kind of every processing failure, one per Rust ``ProcessorError`` variant."""

def processor_families() -> list[str]:
    """The family names ``Preprocessor`` accepts."""

def _error_samples() -> list[tuple[str, Exception]]:
    """For the tests: one sample of every variant of every native error enum, converted to the
    exception the extension raises for it, as ``("Enum::Variant", exception)``. Raises
    ``RuntimeError`` when a variant has no sample."""

def families() -> list[
    tuple[str, list[str], list[str], list[tuple[str, int | None]], tuple[str, str, bool] | None]
]:
    """Every family in registry order: ``(name, image_classes, video_classes, processor_keys,
    processor_forces)``: the transformers image and video processor classes that name it
    (without the ``Fast``/``Pil`` suffix), the ``(key, default)`` settings it reads from a
    model's ``processor_config.json`` (none: the file gives ``VisionTokens``), and the
    ``(processor_class, key, value)`` that processor class forces, if any."""

def family_of_model_type(model_type: str) -> str | None:
    """The family a ``config.json`` ``model_type`` names (its own name or an alias its module
    lists, e.g. ``qwen4_exp`` -> ``qwen3_5``), or ``None``."""

def family_of_processor_class(name: str) -> str | None:
    """The family a transformers ``processor_class`` names over its image processor class (e.g.
    ``Qwen3OmniMoeProcessor`` -> ``qwen3_omni_moe``), or ``None``."""

def normalise_config(family: str, config: dict[str, Any]) -> dict[str, Any]:
    """The keys of a transformers ``preprocessor_config.json`` that ``family`` uses, in the form
    ``Preprocessor`` takes (each family's reading is in ``rust/src/processors/<family>.rs``).
    Raises ``ProcessorConfigError`` for an unknown family or a value that is no size."""
