"""Engine adapters: media + prompt -> each engine's multimodal request, and back.

Gateway side: :class:`VisionModel` (an image processor plus the model's placeholder token ids)
prepares media into :class:`PreparedMedia`; each engine module builds that engine's request:

* :mod:`~smg_grpc_proto.engines.vllm` — ``mm_inputs`` with layout keys, hashes, inline or shm;
* :mod:`~smg_grpc_proto.engines.sglang` — ``mm_inputs`` (inline, float32), Generate and Embed;
* :mod:`~smg_grpc_proto.engines.tokenspeed` — one ``MultimodalItem`` per item (bf16 default);
* :mod:`~smg_grpc_proto.engines.trtllm` — the encoded image files;
* :mod:`~smg_grpc_proto.engines.mlx` — text only (its contract carries no media).

Every engine module offers the same three verbs, with the same positional parameters; the
keyword-only options after ``*`` are the engine's own (``transport``, ``dtype``,
``max_tokens``, ...):

=====================  ====  ======  ==========  ============  =========================
verb                   vLLM  SGLang  TokenSpeed  TensorRT-LLM  MLX
=====================  ====  ======  ==========  ============  =========================
``generate_request``   yes   yes     yes         yes           text only; media raises
``fill_mm_inputs``     yes   yes     yes         yes (files)   media raises
``decode_mm_inputs``   yes   yes     yes         yes (files)   always ``()``
``embed_request``      —     yes     —           —             —
=====================  ====  ======  ==========  ============  =========================

* ``generate_request(request_id, input_ids, media=(), *, ...)`` — a
  :class:`~smg_grpc_proto.tensors.TensorMessage` holding the engine's ``GenerateRequest`` for a
  prompt with one anchor token per media item;
* ``fill_mm_inputs(message, media, *, ...)`` — fills the multimodal fields of a request built
  elsewhere whose prompt is in place: expanded (vLLM, SGLang, TokenSpeed: the ranges are read
  back with :func:`placeholder_ranges`) or one anchor per image (TensorRT-LLM);
* ``decode_mm_inputs(request, *, ...)`` — engine side: :class:`DecodedBatch` objects
  (TensorRT-LLM: the encoded files; MLX: ``()``).

``embed_request`` is SGLang's alone: only its ``EmbedRequest`` has a multimodal field. Media an
engine's contract cannot carry (any for MLX, video for SGLang, decoded pixels or video for
TensorRT-LLM) raises :class:`~smg_grpc_proto.errors.MultimodalNotSupportedError`, a
``MultimodalError`` and a ``NotImplementedError``.

Engine side: each module's ``decode_mm_inputs(request)`` returns validated
:class:`DecodedBatch` objects (named tensors, per-item splits, placeholder ranges, hashes);
TensorRT-LLM's returns the encoded files. Every refusal is a
:class:`~smg_grpc_proto.errors.MultimodalError` or :class:`~smg_grpc_proto.errors.TensorError`
naming the field and the numbers.

Helpers the engines share live here, not in an engine module: :func:`expand_placeholders` and
its inverse :func:`placeholder_ranges`, :func:`content_hash` (the 32-byte item hash TokenSpeed
carries) and :func:`image_format` (the native decoder's signature check, which TensorRT-LLM's
builder and decoder apply to every file).

The engine modules load on first use (``from smg_grpc_proto.engines import vllm``), so
importing one engine's adapter loads no other engine's stubs.
"""

from smg_grpc_proto.engines._decoded import DecodedBatch, DecodedItem
from smg_grpc_proto.engines._media import (
    PreparedMedia,
    VisionModel,
    content_hash,
    expand_placeholders,
    image_format,
    placeholder_ranges,
)

__all__ = [
    "VERBS",
    "DecodedBatch",
    "DecodedItem",
    "PreparedMedia",
    "VisionModel",
    "content_hash",
    "expand_placeholders",
    "image_format",
    "placeholder_ranges",
]

#: The verbs every engine module (``vllm``, ``sglang``, ``tokenspeed``, ``trtllm``, ``mlx``)
#: defines, with the same positional parameters.
VERBS = ("generate_request", "fill_mm_inputs", "decode_mm_inputs")
