"""The betterproto2 dataclasses (``smg-grpc-proto[dataclasses]``) against the ``_pb2`` stubs.

Every message of every schema, populated with every oneof member in turn, must encode to the very
same bytes with both stubs and parse back equal in both directions; a betterproto2 client must talk
to a grpcio server over loopback.
"""

from __future__ import annotations

import importlib
import pkgutil
from concurrent import futures
from dataclasses import fields as dataclass_fields
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor as _d
from google.protobuf import message_factory
from support.populate import all_messages, oneof_width, populate

from smg_grpc_proto import generated

betterproto2 = pytest.importorskip("betterproto2")
dataclasses_pkg = importlib.import_module("smg_grpc_proto.dataclasses")
message_pool = importlib.import_module("smg_grpc_proto.dataclasses.message_pool")

# betterproto2 writes fields in declaration order, protobuf in field-number order. Our .proto
# files declare fields in number order, except where a oneof's members are not adjacent numbers,
# which no declaration order can fix. For these (message, set oneof member) pairs the bytes differ
# in field order only; they still parse to equal messages both ways (asserted below).
FIELD_ORDER_EXCEPTIONS = {
    ("vllm.grpc.engine.TensorData", "shm"),
    ("vllm.grpc.engine.TensorData", "remote"),
    ("trtllm.GenerateComplete", "matched_token_id"),
}


def _import_all_dataclasses() -> None:
    for info in pkgutil.walk_packages(dataclasses_pkg.__path__, dataclasses_pkg.__name__ + "."):
        importlib.import_module(info.name)


def _dataclass_for(desc: _d.Descriptor) -> Any:
    _import_all_dataclasses()
    return message_pool.default_message_pool.url_to_type[f"type.googleapis.com/{desc.full_name}"]


def _cases() -> list[tuple[str, str, int]]:
    cases = []
    for name in generated.MODULES:
        if name.endswith("_pb2"):
            module = importlib.import_module(f"smg_grpc_proto.generated.{name}")
            for desc in all_messages(module):
                cases += [(name, desc.full_name, v) for v in range(oneof_width(desc))]
    return cases


CASES = _cases()


def _set_oneof_members(msg: Any) -> set[tuple[str, str]]:
    """(message full name, set member) for every oneof set anywhere in the message tree."""
    out = {(msg.DESCRIPTOR.full_name, msg.WhichOneof(o.name)) for o in msg.DESCRIPTOR.oneofs}
    for field, value in msg.ListFields():
        if field.message_type is None:
            continue
        if field.message_type.GetOptions().map_entry:
            values = (
                value.values() if field.message_type.fields_by_name["value"].message_type else []
            )
        elif isinstance(value, (list, tuple)) or hasattr(value, "add"):
            values = value
        else:
            values = [value]
        for item in values:
            out |= _set_oneof_members(item)
    return {(name, member) for name, member in out if member is not None}


def test_corpus_covers_every_message():
    assert len({full for _, full, _ in CASES}) >= 185
    assert len(CASES) > 250  # several variants per message with oneofs


@pytest.mark.parametrize(("module", "full_name", "variant"), CASES)
def test_same_bytes_as_pb2(module, full_name, variant):
    pb_module = importlib.import_module(f"smg_grpc_proto.generated.{module}")
    desc = pb_module.DESCRIPTOR.pool.FindMessageTypeByName(full_name)
    pb_cls = message_factory.GetMessageClass(desc)
    bp_cls = _dataclass_for(desc)

    pb_msg = populate(pb_cls(), variant)
    pb_bytes = pb_msg.SerializeToString(deterministic=True)
    bp_msg = bp_cls.parse(pb_bytes)
    bp_bytes = bytes(bp_msg)

    # Parsing either encoding with either stub gives back the same message.
    assert pb_cls.FromString(bp_bytes) == pb_msg
    assert bp_cls.parse(bp_bytes) == bp_msg

    exceptions = _set_oneof_members(pb_msg) & FIELD_ORDER_EXCEPTIONS
    if exceptions:
        assert bp_bytes != pb_bytes, f"{exceptions} no longer differ: drop the exception"
        assert sorted(bp_bytes) == sorted(pb_bytes)
    else:
        assert bp_bytes == pb_bytes


def test_no_field_shadows_a_message_attribute():
    """betterproto2 breaks when a field shadows a Message method (KvEventBatch.load did)."""
    _import_all_dataclasses()
    reserved = set(dir(betterproto2.Message))
    clashes = [
        f"{cls.__qualname__}.{f.name}"
        for cls in message_pool.default_message_pool.url_to_type.values()
        for f in dataclass_fields(cls)
        if f.name in reserved
    ]
    assert clashes == []
    batch_cls = _dataclass_for(
        importlib.import_module("smg_grpc_proto.generated.common_pb2").KvEventBatch.DESCRIPTOR
    )
    batch = batch_cls.parse(batch_cls(sequence_number=7, load_=None).__bytes__())
    assert batch.sequence_number == 7


def test_betterproto2_client_against_grpcio_server():
    from smg_grpc_proto import vllm_engine_pb2 as pb
    from smg_grpc_proto import vllm_engine_pb2_grpc as pb_grpc
    from smg_grpc_proto.dataclasses.vllm.grpc import engine as dc

    class Engine(pb_grpc.VllmEngineServicer):
        def HealthCheck(self, request, context):
            return pb.HealthCheckResponse(healthy=True, message="serving")

        def Generate(self, request, context):
            for token in request.tokenized.input_ids:
                yield pb.GenerateResponse(chunk=pb.GenerateStreamChunk(token_ids=[token * 2]))
            yield pb.GenerateResponse(
                complete=pb.GenerateComplete(
                    output_ids=list(request.tokenized.input_ids), finish_reason="stop"
                )
            )

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_VllmEngineServicer_to_server(Engine(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = dc.VllmEngineStub(channel)
            health = stub.health_check(dc.HealthCheckRequest())
            assert health == dc.HealthCheckResponse(healthy=True, message="serving")
            request = dc.GenerateRequest(
                request_id="dc-1",
                tokenized=dc.TokenizedInput(original_text="hi", input_ids=[3, 5, 7]),
                sampling_params=dc.SamplingParams(temperature=0.5, max_tokens=3, regex="[a-z]+"),
            )
            responses = list(stub.generate(request))
    finally:
        server.stop(None)
    chunks = [r.chunk.token_ids for r in responses if r.chunk is not None]
    completes = [r.complete for r in responses if r.complete is not None]
    assert chunks == [[6], [10], [14]]
    assert len(completes) == 1
    assert completes[0].output_ids == [3, 5, 7]
    assert completes[0].finish_reason == "stop"
