"""Engine adapters: media + prompt -> each engine's multimodal request, and back.

Gateway side: :class:`VisionModel` (an image processor plus the model's placeholder token ids)
prepares media into :class:`PreparedMedia`; each engine module builds that engine's request:

* :mod:`~smg_grpc_proto.engines.vllm` — ``mm_inputs`` with layout keys, hashes, inline or shm;
* :mod:`~smg_grpc_proto.engines.sglang` — ``mm_inputs`` (inline, float32), Generate and Embed;
* :mod:`~smg_grpc_proto.engines.tokenspeed` — one ``MultimodalItem`` per item (bf16 default);
* :mod:`~smg_grpc_proto.engines.trtllm` — the encoded image files;
* :mod:`~smg_grpc_proto.engines.mlx` — text only (its contract carries no media).

Engine side: each module's ``decode_mm_inputs(request)`` returns validated
:class:`DecodedBatch` objects (named tensors, per-item splits, placeholder ranges, hashes);
TensorRT-LLM's returns the encoded files. Every refusal is a
:class:`~smg_grpc_proto.errors.MultimodalError` or :class:`~smg_grpc_proto.errors.TensorError`
naming the field and the numbers.

The engine modules load on first use (``from smg_grpc_proto.engines import vllm``), so
importing one engine's adapter loads no other engine's stubs.
"""

from smg_grpc_proto.engines._decoded import DecodedBatch, DecodedItem
from smg_grpc_proto.engines._media import PreparedMedia, VisionModel, expand_placeholders

__all__ = [
    "DecodedBatch",
    "DecodedItem",
    "PreparedMedia",
    "VisionModel",
    "expand_placeholders",
]
