"""The package's exceptions, in one place.

Every exception derives from :class:`SmgProtoError` and from the builtin that fits the failure, so
callers that catch ``ValueError`` or ``OSError`` keep working. Each carries the offending ``field``
and, where there are numbers involved, ``expected`` and ``actual`` — as attributes and in its
message. They pickle (the attributes survive a round trip), so they can cross process pools.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "IMAGE_DECODE_ERRORS",
    "IMAGE_PROCESSING_ERRORS",
    "AspectRatioError",
    "BatchShapeError",
    "CorruptImageError",
    "DisaggregationError",
    "EmptyImageError",
    "ImageDecodeError",
    "ImageMemoryError",
    "ImageProcessingError",
    "ImageShapeError",
    "ImageTooLargeError",
    "ImageTypeError",
    "InputFileError",
    "MultimodalError",
    "MultimodalLayoutError",
    "MultimodalNotSupportedError",
    "NativeCoreUnavailableError",
    "PlaceholderError",
    "ProcessingLimitError",
    "ProcessingMemoryError",
    "ProcessorConfigError",
    "RemoteArenaFullError",
    "RemoteDescriptorError",
    "RemoteError",
    "RemoteExportRefusedError",
    "RemotePayloadTooLargeError",
    "RemotePeerRefusedError",
    "RemoteStampError",
    "RemoteTimeoutError",
    "RemoteTransferError",
    "RemoteTransportUnavailableError",
    "RemoteUnavailableError",
    "ResizeError",
    "ShmError",
    "SmgProtoError",
    "TensorError",
    "TensorMemoryError",
    "TensorTypeError",
    "TransportNotImplementedError",
    "TruncatedImageError",
    "UnknownImageFormatError",
    "UnsupportedImageError",
    "VideoShapeError",
]


class SmgProtoError(Exception):
    """Base class of every exception raised by smg-grpc-proto."""

    # The keyword arguments of ``__init__``, all kept as attributes: what pickling carries.
    _fields: tuple[str, ...] = ("field", "expected", "actual")

    def __init__(
        self, message: str, *, field: str = "", expected: Any = None, actual: Any = None
    ) -> None:
        super().__init__(message)
        self.field = field
        self.expected = expected
        self.actual = actual

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), str(self), {f: getattr(self, f) for f in self._fields}))


def _rebuild(cls: type[SmgProtoError], message: str, fields: dict[str, Any]) -> SmgProtoError:
    return cls(message, **fields)


class TensorError(SmgProtoError, ValueError):
    """A tensor or its ``TensorData`` message is invalid: dtype, shape, length, payload.

    For a malformed serialized message, ``field`` is the input that was parsed (``"data"`` or
    ``"header"``) and ``offset`` the byte within it where the offending record (or varint)
    starts; ``offset`` is ``None`` otherwise.
    """

    _fields = (*SmgProtoError._fields, "offset")

    def __init__(
        self,
        message: str,
        *,
        field: str = "",
        expected: Any = None,
        actual: Any = None,
        offset: int | None = None,
    ) -> None:
        super().__init__(message, field=field, expected=expected, actual=actual)
        self.offset = offset


class TensorMemoryError(TensorError, MemoryError):
    """A buffer a tensor operation needs (sized by its input) could not be allocated: ``field``
    names what it was for and ``actual`` its size in bytes. Also a ``MemoryError``."""


class TensorTypeError(SmgProtoError, TypeError):
    """An argument of the wrong Python type was passed to the tensor API."""


class ShmError(TensorError):
    """A shared-memory segment is unusable: bad name, size, owner, file type or symlink."""


class InputFileError(SmgProtoError, OSError):
    """A path given as an input is not a regular file (a FIFO, device, directory…) or holds more
    bytes than may be read (``actual`` / ``expected``); refused before any wait or large read."""


class NativeCoreUnavailableError(SmgProtoError, ImportError):
    """A function that needs the native core (``smg_grpc_proto._native``: vision preprocessing,
    image decoding, media hashing) was called where it is absent, in the pure-Python wheel
    (``py3-none-any``), or failed to load. Raised on use, never at import; the message names
    what was called, the platforms the native wheel is published for and how to get it
    elsewhere. ``field`` is the native function that was needed. Also an ``ImportError``."""


class TransportNotImplementedError(SmgProtoError, NotImplementedError):
    """The payload uses a transport this package cannot read: a ``remote`` handle naming a
    transport other than ``"nixl"``, or (as :class:`RemoteTransportUnavailableError`) a NIXL
    handle where NIXL is not installed."""


class RemoteError(SmgProtoError):
    """Base class of the remote (NIXL) tensor transport's failures (``smg_grpc_proto.remote``)."""


class RemoteUnavailableError(RemoteError, ImportError):
    """NIXL cannot be imported (none of ``nixl_cu13``, ``nixl_cu12``, ``nixl``): the message says
    what to install. Raised on use, never at import. Also an ``ImportError``."""


class RemoteTransportUnavailableError(RemoteUnavailableError, TransportNotImplementedError):
    """A received ``remote`` payload cannot be read here because NIXL does not import: the
    message names the field and what to install (``pip install "smg-grpc-proto[nixl]"``).
    Raised by :func:`~smg_grpc_proto.tensors.unpack` and the engines' ``decode_mm_inputs``;
    also a :class:`TransportNotImplementedError` (what a ``remote`` payload raised before the
    transport was implemented) and an ``ImportError``."""


class RemoteDescriptorError(RemoteError, ValueError):
    """A remote descriptor or its ``nbytes`` is malformed: bad magic, wrong length, an ip or port
    that cannot be dialled, a slot key that disagrees with the request, an ``nbytes`` other than
    ``product(shape) x itemsize``. ``field`` names the part at fault. Also a ``ValueError``."""


class RemotePeerRefusedError(RemoteDescriptorError):
    """A remote descriptor names an exporter (``field="ip"`` or ``"port"``) outside the puller's
    ``allowed_peers``: refused before any connection is made. Also a ``ValueError``."""


class RemoteStampError(RemoteError, ValueError):
    """The generation stamps around a pulled slot disagree with the descriptor's ``gen``: the
    exporter recycled the slot (its lease ended: notification or TTL) or the read was torn.
    ``expected`` is the descriptor's gen, ``actual`` the ``(header, trailer)`` stamps read.
    The pulled bytes are discarded. Also a ``ValueError``."""


class RemoteTransferError(RemoteError, OSError):
    """The exporter could not be reached or the NIXL transfer failed: connection refused, the
    metadata exchange failed, the READ ended in error. Also an ``OSError``."""


class RemoteTimeoutError(RemoteTransferError, TimeoutError):
    """A metadata exchange or READ did not finish within its timeout (``expected``: the timeout
    in seconds). Also a ``TimeoutError``."""


class RemoteExportRefusedError(RemoteError):
    """The exporter cannot stage this tensor now; the caller sends it inline instead. Catch this
    base class for the fallback: :class:`RemoteArenaFullError` and
    :class:`RemotePayloadTooLargeError` are its kinds."""


class RemoteArenaFullError(RemoteExportRefusedError):
    """Every slot of the exporter's arena is leased (``expected``: the slot count)."""


class RemotePayloadTooLargeError(RemoteExportRefusedError):
    """The payload plus its 16 bytes of generation stamps exceeds one slot (``expected``: the
    slot size in bytes, ``actual``: the payload's framed size)."""


class MultimodalError(SmgProtoError, ValueError):
    """A multimodal request is inconsistent: what the engine adapters (``smg_grpc_proto.engines``)
    refuse to build or to decode. ``field`` is the message path at fault."""


class PlaceholderError(MultimodalError):
    """Placeholder tokens disagree with the media: anchors per item, ranges outside
    ``input_ids``, overlapping ranges, or a token count other than the model's rule."""


class MultimodalLayoutError(MultimodalError):
    """A tensor's shape disagrees with the batch layout: items on dim 0, flat sizes, grids."""


class DisaggregationError(MultimodalError):
    """A pixel-less multimodal batch (the decode side of a disaggregated prefill/decode request)
    without the KV transfer params it needs: the decoder refuses one that carries side tensors
    but no ``pixel_values`` when the request has neither ``kv_transfer_params_json`` nor
    ``kv_transfer_params`` (``field``: the batch's ``pixel_values``), the builder refuses to make
    one without them, and malformed params (``kv_transfer_params_json`` not a JSON object,
    ``kv_transfer_params`` without host or port) are refused naming their field."""


class MultimodalNotSupportedError(MultimodalError, NotImplementedError):
    """The engine's contract has no field for this media: MLX carries none, SGLang's
    preprocessed input carries images only, TensorRT-LLM carries encoded image files only. The
    message names the engine and what it cannot carry; ``except NotImplementedError`` and
    ``except MultimodalError`` both catch it."""


class ImageDecodeError(SmgProtoError, ValueError):
    """An encoded image could not be decoded (``smg_grpc_proto.vision.decode``).

    ``kind`` names the failure (one subclass per kind, see ``IMAGE_DECODE_ERRORS``) and ``format``
    the image format when it was recognised (``"JPEG"``, ``"PNG"``, ``"GIF"``, ``"BMP"``,
    ``"WEBP"``); ``field``/``expected``/``actual`` carry the numbers (e.g. ``max_pixels``).
    """

    _fields = (*SmgProtoError._fields, "format")

    kind = "image_decode"

    def __init__(
        self,
        message: str,
        *,
        field: str = "",
        expected: Any = None,
        actual: Any = None,
        format: str | None = None,
    ) -> None:
        super().__init__(message, field=field, expected=expected, actual=actual)
        self.format = format


class UnknownImageFormatError(ImageDecodeError):
    """The data is not a JPEG, PNG, GIF, BMP or WebP file (or is empty)."""

    kind = "unknown_format"


class UnsupportedImageError(ImageDecodeError):
    """The format is known but uses a feature that is not decoded (e.g. 12-bit JPEG)."""

    kind = "unsupported"


class TruncatedImageError(ImageDecodeError):
    """The data ends before the image is complete."""

    kind = "truncated"


class CorruptImageError(ImageDecodeError):
    """The data is malformed."""

    kind = "corrupt"


class EmptyImageError(ImageDecodeError):
    """The header declares a width or height of zero."""

    kind = "zero_size"


class ImageTooLargeError(ImageDecodeError):
    """The header declares more pixels than ``max_pixels`` (a possible decompression bomb)."""

    kind = "too_many_pixels"


class ImageMemoryError(ImageDecodeError, MemoryError):
    """The pixel buffers could not be allocated (``actual``: their size in bytes). Also a
    ``MemoryError``."""

    kind = "out_of_memory"


IMAGE_DECODE_ERRORS: dict[str, type[ImageDecodeError]] = {
    cls.kind: cls
    for cls in (
        UnknownImageFormatError,
        UnsupportedImageError,
        TruncatedImageError,
        CorruptImageError,
        EmptyImageError,
        ImageTooLargeError,
        ImageMemoryError,
    )
}
"""Each decoding failure kind (one per Rust ``DecodeError`` variant) and its exception class."""


class ImageTypeError(SmgProtoError, TypeError):
    """An argument of the wrong Python type was passed to the vision or media-hashing API: an
    image or frame that is neither ``bytes`` nor a numpy array, a batch that is not a list, a
    processor configuration key or value of a type it cannot hold, a non-contiguous array given
    to ``media_digest``. ``field`` names the argument (``"images[3]"``, ``'config["size"]'``,
    ``"parts[2]"``); ``expected`` says what it takes and ``actual`` what it got (a type name, or
    the value's ``repr``). Also a ``TypeError``."""


class ImageProcessingError(SmgProtoError, ValueError):
    """A model image processor rejected its configuration, an image or a batch
    (``smg_grpc_proto.vision.ImageProcessor``).

    ``kind`` names the failure (one subclass per kind, see ``IMAGE_PROCESSING_ERRORS``);
    ``index`` is the position of the image (or, for videos, of the video) at fault, when one is;
    ``field``/``expected``/``actual`` carry the values. Images that fail to decode raise the
    ``ImageDecodeError`` subclasses instead.
    """

    _fields = (*SmgProtoError._fields, "index")

    kind = "image_processing"

    def __init__(
        self,
        message: str,
        *,
        field: str = "",
        expected: Any = None,
        actual: Any = None,
        index: int | None = None,
    ) -> None:
        super().__init__(message, field=field, expected=expected, actual=actual)
        self.index = index


class AspectRatioError(ImageProcessingError):
    """An image more than 200 times wider than tall or the reverse (Qwen's ``smart_resize``);
    the message is transformers'."""

    kind = "aspect_ratio"


class ProcessorConfigError(ImageProcessingError):
    """A configuration value out of range, of the wrong type, or an unknown family."""

    kind = "config"


class ImageShapeError(ImageProcessingError):
    """An image that cannot be processed: empty, a channel count other than 1, 3 or 4, or a
    size the configuration cannot patchify."""

    kind = "image_shape"


class ProcessingLimitError(ImageProcessingError):
    """An image side or an output tensor beyond the size limits."""

    kind = "too_large"


class ProcessingMemoryError(ImageProcessingError, MemoryError):
    """A buffer the inputs need (within the size limits) could not be allocated: ``field`` names
    what it was for and ``actual`` its size in bytes. Also a ``MemoryError``."""

    kind = "out_of_memory"


class VideoShapeError(ImageProcessingError):
    """The frames of one video differ in size."""

    kind = "video_shape"


class BatchShapeError(ImageProcessingError):
    """Processed images of different shapes that must be stacked into one tensor."""

    kind = "batch_shape"


class ResizeError(ImageProcessingError):
    """The resampler refused a resize."""

    kind = "resample"


IMAGE_PROCESSING_ERRORS: dict[str, type[ImageProcessingError]] = {
    cls.kind: cls
    for cls in (
        AspectRatioError,
        ProcessorConfigError,
        ImageShapeError,
        ProcessingLimitError,
        VideoShapeError,
        BatchShapeError,
        ResizeError,
        ProcessingMemoryError,
    )
}
"""Each processing failure kind (one per Rust ``ProcessorError`` variant except ``decode``,
which raises the ``IMAGE_DECODE_ERRORS`` classes) and its exception class."""
