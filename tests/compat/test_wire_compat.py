"""Our schemas against the published smg-grpc-proto 0.4.28, property by property.

Every wire- or API-relevant property of every file, message, field, oneof, enum, service and
method in 0.4.28 must be present and equal in ours. Elements we add beyond 0.4.28 must be listed
in the "Additions beyond 0.4.28" table of protos/README.md.

0.4.28's descriptors are read from the committed snapshot ``protos/releases/0.4.28.binpb`` (no
network). With ``SMG_TEST_DOWNLOAD=1`` they are read from the published wheel instead
(downloaded once into the wheel cache), after checking that it holds exactly the snapshot's
files; ``tests/release/test_release.py`` checks that equality on every run as well.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2
from support.descriptors import file_descriptors
from support.upstream import upstream_package

ROOT = Path(__file__).resolve().parents[2]
OURS = ROOT / "src" / "smg_grpc_proto" / "generated"
SNAPSHOT = ROOT / "protos" / "releases" / "0.4.28.binpb"
FILES = [
    "common.proto",
    "sglang_scheduler.proto",
    "sglang_encoder.proto",
    "vllm_engine.proto",
    "trtllm_service.proto",
    "mlx_engine.proto",
    "tokenspeed_scheduler.proto",
    "tokenspeed_encoder.proto",
]

F = descriptor_pb2.FieldDescriptorProto


def _default_json_name(name: str) -> str:
    parts = name.split("_")
    return parts[0] + "".join(p[:1].upper() + p[1:] for p in parts[1:])


def _field_props(msg: descriptor_pb2.DescriptorProto, f: F) -> dict[str, object]:
    real_oneof = f.HasField("oneof_index") and not f.proto3_optional
    return {
        "name": f.name,
        "type": F.Type.Name(f.type),
        "type_name": f.type_name,
        "label": F.Label.Name(f.label),
        "proto3_optional": f.proto3_optional,
        "oneof": msg.oneof_decl[f.oneof_index].name if real_oneof else None,
        "json_name": f.json_name or _default_json_name(f.name),
        "default_value": f.default_value if f.HasField("default_value") else None,
        "options": f.options.SerializeToString(deterministic=True),
    }


def _ranges(rs: object) -> list[tuple[int, int]]:
    return sorted((r.start, r.end) for r in rs)  # type: ignore[attr-defined]


def _message_props(
    prefix: str, msg: descriptor_pb2.DescriptorProto
) -> Iterator[tuple[str, object]]:
    path = f"{prefix}.{msg.name}"
    yield f"{path}", "message"
    yield f"{path}#reserved_ranges", _ranges(msg.reserved_range)
    yield f"{path}#reserved_names", sorted(msg.reserved_name)
    yield f"{path}#extension_ranges", _ranges(msg.extension_range)
    yield f"{path}#options", msg.options.SerializeToString(deterministic=True)
    for oneof in msg.oneof_decl:
        members = sorted(
            f.number
            for f in msg.field
            if f.HasField("oneof_index") and msg.oneof_decl[f.oneof_index].name == oneof.name
        )
        yield f"{path}/oneof {oneof.name}", members
    for f in msg.field:
        for key, value in _field_props(msg, f).items():
            yield f"{path}/field {f.number}#{key}", value
    for nested in msg.nested_type:
        yield from _message_props(path, nested)
    for enum in msg.enum_type:
        yield from _enum_props(path, enum)


def _enum_props(
    prefix: str, enum: descriptor_pb2.EnumDescriptorProto
) -> Iterator[tuple[str, object]]:
    path = f"{prefix}.{enum.name}"
    yield f"{path}", "enum"
    yield f"{path}#reserved_ranges", _ranges(enum.reserved_range)
    yield f"{path}#reserved_names", sorted(enum.reserved_name)
    yield f"{path}#options", enum.options.SerializeToString(deterministic=True)
    for v in enum.value:
        yield f"{path}/value {v.name}", v.number


def properties(fd: descriptor_pb2.FileDescriptorProto) -> dict[str, object]:
    """Flatten a file into ``path -> value`` for every wire- or API-relevant property."""
    props: dict[str, object] = {
        f"{fd.name}#package": fd.package,
        f"{fd.name}#syntax": fd.syntax or "proto2",
        f"{fd.name}#dependencies": sorted(fd.dependency),
        f"{fd.name}#options": fd.options.SerializeToString(deterministic=True),
    }
    prefix = f"{fd.name}:{fd.package}"
    for msg in fd.message_type:
        props.update(_message_props(prefix, msg))
    for enum in fd.enum_type:
        props.update(_enum_props(prefix, enum))
    for svc in fd.service:
        spath = f"{prefix}.{svc.name}"
        props[spath] = "service"
        for m in svc.method:
            props[f"{spath}/rpc {m.name}"] = (
                m.input_type,
                m.output_type,
                m.client_streaming,
                m.server_streaming,
                m.options.SerializeToString(deterministic=True),
            )
    return props


def documented_additions() -> set[str]:
    """Property paths listed in protos/README.md under "Additions beyond 0.4.28"."""
    text = (ROOT / "protos" / "README.md").read_text()
    section = text.split("## Additions beyond 0.4.28", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `([^`]+)` \|", section, flags=re.MULTILINE))


def snapshot_descriptors() -> dict[str, descriptor_pb2.FileDescriptorProto]:
    """0.4.28's own files from the committed snapshot (without the google/protobuf imports)."""
    fds = descriptor_pb2.FileDescriptorSet.FromString(SNAPSHOT.read_bytes())
    return {f.name: f for f in fds.file if not f.name.startswith("google/protobuf/")}


@pytest.fixture(scope="module")
def upstream() -> dict[str, descriptor_pb2.FileDescriptorProto]:
    committed = snapshot_descriptors()
    if os.environ.get("SMG_TEST_DOWNLOAD") != "1":
        return committed
    published = file_descriptors(upstream_package() / "generated")
    assert published == committed, f"{SNAPSHOT} differs from the published 0.4.28 wheel"
    return published


@pytest.fixture(scope="module")
def ours() -> dict[str, descriptor_pb2.FileDescriptorProto]:
    return file_descriptors(OURS)


def test_same_descriptor_file_names(upstream, ours):
    assert sorted(upstream) == sorted(FILES)
    assert sorted(ours) == sorted(FILES)


@pytest.mark.parametrize("name", FILES)
def test_wire_and_api_identical_to_0_4_28(name, upstream, ours):
    theirs, mine = properties(upstream[name]), properties(ours[name])
    missing = sorted(k for k in theirs if k not in mine)
    changed = sorted(
        f"{k}: 0.4.28 {theirs[k]!r} != ours {mine[k]!r}"
        for k in theirs
        if k in mine and theirs[k] != mine[k]
    )
    allowed = documented_additions()
    undocumented = sorted(k for k in mine if k not in theirs and k.split("#")[0] not in allowed)
    assert not missing, f"{name}: removed relative to 0.4.28:\n" + "\n".join(missing)
    assert not changed, f"{name}: changed relative to 0.4.28:\n" + "\n".join(changed)
    assert not undocumented, f"{name}: additions not documented in protos/README.md:\n" + "\n".join(
        undocumented
    )


def test_comparison_detects_a_renumbered_field(upstream):
    """The comparison itself must fail on the classic upstream mistake: a renumbered field."""
    fd = descriptor_pb2.FileDescriptorProto()
    fd.CopyFrom(upstream["vllm_engine.proto"])
    tensor = next(m for m in fd.message_type if m.name == "TensorData")
    shape = next(f for f in tensor.field if f.name == "shape")
    shape.number = 6
    theirs, mine = properties(upstream["vllm_engine.proto"]), properties(fd)
    assert "vllm_engine.proto:vllm.grpc.engine.TensorData/field 2#name" not in mine
    assert {k for k in theirs if k not in mine} == {
        f"vllm_engine.proto:vllm.grpc.engine.TensorData/field 2#{p}"
        for p in (
            "name",
            "type",
            "type_name",
            "label",
            "proto3_optional",
            "oneof",
            "json_name",
            "default_value",
            "options",
        )
    }


def test_comparison_detects_a_streaming_flip_and_oneof_move(upstream):
    fd = descriptor_pb2.FileDescriptorProto()
    fd.CopyFrom(upstream["sglang_scheduler.proto"])
    fd.service[0].method[0].server_streaming = not fd.service[0].method[0].server_streaming
    resp = next(m for m in fd.message_type if m.name == "GenerateResponse")
    for f in resp.field:
        f.ClearField("oneof_index")
    theirs, mine = properties(upstream["sglang_scheduler.proto"]), properties(fd)
    diffs = {k for k in theirs if theirs[k] != mine.get(k)}
    assert "sglang_scheduler.proto:sglang.grpc.scheduler.SglangScheduler/rpc Generate" in diffs
    assert "sglang_scheduler.proto:sglang.grpc.scheduler.GenerateResponse/field 2#oneof" in diffs
