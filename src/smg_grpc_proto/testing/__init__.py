"""Reference servicers: a deterministic toy engine behind every engine contract.

They are the example of a correct servicer for engine maintainers and the peer for gateway and
client tests. One module per engine (:mod:`~smg_grpc_proto.testing.vllm`, ``sglang``,
``tokenspeed``, ``trtllm``, ``mlx``) holds a ``grpc.aio`` servicer subclassing the generated
``*Servicer`` and an ``add_to_server`` that registers it with the zero-copy ``Generate``
deserializer. The toy model (:class:`ToyModel`) generates tokens from a hash of the prompt and
of the decoded multimodal tensors, so a test computes the exact expected output of any request
with :func:`expected_output` and :func:`mm_digest`::

    with ReferenceServer("vllm", model=ToyModel(token_delay_s=0.01)) as server:
        stub = vllm_engine_pb2_grpc.VllmEngineStub(grpc.insecure_channel(server.target))

From a shell: ``python -m smg_grpc_proto.testing --engine vllm --port 0 --model-dir DIR``.
"""

from smg_grpc_proto.testing._server import ENGINES, ReferenceServer, make_servicer, serve
from smg_grpc_proto.testing._toy import (
    TOKENIZER_FILES,
    ToyModel,
    ToyOutput,
    expected_output,
    images_digest,
    mm_digest,
    toy_embedding,
)

__all__ = [
    "ENGINES",
    "TOKENIZER_FILES",
    "ReferenceServer",
    "ToyModel",
    "ToyOutput",
    "expected_output",
    "images_digest",
    "make_servicer",
    "mm_digest",
    "serve",
    "toy_embedding",
]
