"""The remote descriptor codec and slot framing: pure Python, no NIXL."""

from __future__ import annotations

import pickle
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smg_grpc_proto.errors import RemoteDescriptorError, RemoteStampError
from smg_grpc_proto.remote import (
    DESCRIPTOR_MAGIC,
    FRAME_BYTES,
    RemoteDescriptor,
    check_nbytes,
    decode_descriptor,
    encode_descriptor,
    frame_stamps,
    read_stamps,
    verify_stamps,
)

u64 = st.integers(0, (1 << 64) - 1)
i64 = st.integers(-(1 << 63), (1 << 63) - 1)
ports = st.integers(1, 0xFFFF)
ips = st.one_of(st.ip_addresses(v=4), st.ip_addresses(v=6)).map(str)
descriptors = st.builds(RemoteDescriptor, u64, u64, i64, ports, ips)


def _gateway_bytes(addr: int, gen: int, key: int, port: int, ip: str) -> bytes:
    """The gateway's layout, spelled out field by field (mm_rdma's RdmaExporter::export)."""
    return (
        b"SMGRDMA1"
        + addr.to_bytes(8, "little")
        + gen.to_bytes(8, "little")
        + key.to_bytes(8, "little", signed=True)
        + port.to_bytes(2, "little")
        + ip.encode()
    )


@settings(max_examples=300, deadline=None)
@given(descriptors)
def test_round_trip_and_gateway_layout(desc):
    data = encode_descriptor(desc)
    assert data == _gateway_bytes(desc.slot_addr, desc.gen, desc.slot_key, desc.port, desc.ip)
    assert decode_descriptor(data) == desc
    assert decode_descriptor(data, slot_key=desc.slot_key) == desc
    assert desc.notification == str(desc.slot_key).encode()


@settings(max_examples=200, deadline=None)
@given(u64, u64, i64, ports, ips)
def test_legacy_form_takes_the_key_from_the_request(addr, gen, key, port, ip):
    data = addr.to_bytes(8, "little") + gen.to_bytes(8, "little") + struct.pack("<H", port)
    data += ip.encode()
    if data.startswith(DESCRIPTOR_MAGIC):  # astronomically unlikely; not the legacy form then
        return
    desc = decode_descriptor(data, slot_key=key)
    assert (desc.slot_addr, desc.gen, desc.slot_key, desc.port, desc.ip, desc.legacy) == (
        addr,
        gen,
        key,
        port,
        ip,
        True,
    )
    with pytest.raises(RemoteDescriptorError, match="no slot key was given") as info:
        decode_descriptor(data)
    assert info.value.field == "descriptor"


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=300), st.one_of(st.none(), i64))
def test_arbitrary_bytes_decode_or_raise_a_descriptor_error(data, key):
    failure: RemoteDescriptorError | None = None
    try:
        desc = decode_descriptor(data, slot_key=key)
    except RemoteDescriptorError as exc:
        failure = exc
    if failure is not None:
        assert failure.field in {"descriptor", "ip", "port", "slot_key"}
        assert str(failure)
    else:
        assert 1 <= desc.port <= 0xFFFF
        if not desc.legacy:
            assert encode_descriptor(desc) == bytes(data)


@settings(max_examples=200, deadline=None)
@given(descriptors, st.data())
def test_every_truncation_is_refused(desc, data):
    raw = encode_descriptor(desc)
    cut = data.draw(st.integers(0, len(raw) - 1))
    short = raw[:cut]
    if cut > 8 + 26:  # a shorter ip can still be a valid address ("1.2.3.45" -> "1.2.3.4")
        return
    with pytest.raises(RemoteDescriptorError):
        decode_descriptor(short)


def test_errors_name_the_field_and_numbers():
    good = _gateway_bytes(4096, 7, 42, 18515, "127.0.0.1")
    with pytest.raises(RemoteDescriptorError) as info:
        decode_descriptor(good[:20])
    assert (info.value.field, info.value.expected, info.value.actual) == ("descriptor", 35, 20)
    with pytest.raises(RemoteDescriptorError, match="slot_key=42 disagrees") as info:
        decode_descriptor(good, slot_key=43)
    assert (info.value.expected, info.value.actual) == (43, 42)
    with pytest.raises(RemoteDescriptorError, match="not an IPv4 or IPv6") as info:
        decode_descriptor(_gateway_bytes(4096, 7, 42, 18515, "gateway.local"))
    assert info.value.field == "ip"
    with pytest.raises(RemoteDescriptorError, match="not UTF-8") as info:
        decode_descriptor(good[:-9] + b"\xff\xfe")
    assert info.value.field == "ip"
    with pytest.raises(RemoteDescriptorError, match="port=0") as info:
        decode_descriptor(_gateway_bytes(4096, 7, 42, 0, "127.0.0.1"))
    assert info.value.field == "port"
    with pytest.raises(RemoteDescriptorError, match="more than") as info:
        decode_descriptor(good + b"9" * 300)
    with pytest.raises(RemoteDescriptorError, match="must be bytes"):
        decode_descriptor("SMGRDMA1...")  # type: ignore[arg-type]
    with pytest.raises(RemoteDescriptorError, match="outside") as info:
        RemoteDescriptor(1 << 64, 0, 0, 1, "127.0.0.1")
    assert info.value.field == "slot_addr"
    # Errors survive pickling with their fields (process pools).
    back = pickle.loads(pickle.dumps(info.value))
    assert (type(back), back.field, back.actual) == (RemoteDescriptorError, "slot_addr", 1 << 64)
    assert isinstance(back, ValueError)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 9), max_size=4), st.sampled_from([1, 2, 4, 8]), st.integers(-2, 2))
def test_check_nbytes(shape, itemsize, delta):
    expected = int(np.prod(shape, dtype=np.int64)) * itemsize
    nbytes = expected + delta
    if delta == 0:
        assert check_nbytes(nbytes, shape, itemsize) == nbytes
    elif nbytes >= 0:
        with pytest.raises(RemoteDescriptorError) as info:
            check_nbytes(nbytes, shape, itemsize)
        assert (info.value.field, info.value.expected, info.value.actual) == (
            "nbytes",
            expected,
            nbytes,
        )
        assert f"nbytes={nbytes}" in str(info.value)
        assert str(expected) in str(info.value)


@settings(max_examples=200, deadline=None)
@given(u64, st.binary(max_size=64), u64)
def test_stamps(gen, payload, other):
    desc = RemoteDescriptor(0, gen, 5, 1, "127.0.0.1")
    framed = frame_stamps(gen) + payload + frame_stamps(gen)
    assert len(framed) == len(payload) + FRAME_BYTES
    assert read_stamps(framed, len(payload)) == (gen, gen)
    verify_stamps(framed, len(payload), desc)
    if other == gen:
        return
    for bad in (
        frame_stamps(other) + payload + frame_stamps(gen),  # recycled: new header
        frame_stamps(gen) + payload + frame_stamps(other),  # torn: trailer not yet written
    ):
        with pytest.raises(RemoteStampError) as info:
            verify_stamps(bad, len(payload), desc)
        assert info.value.expected == gen
        assert other in info.value.actual


def test_short_framed_read_is_refused():
    with pytest.raises(RemoteDescriptorError, match="less than nbytes=10"):
        read_stamps(b"\0" * 25, 10)


def test_without_nixl_the_error_says_what_to_install(monkeypatch):
    import sys

    from smg_grpc_proto.errors import RemoteUnavailableError
    from smg_grpc_proto.remote import RemoteExporter, RemotePuller, _nixl, nixl_available

    monkeypatch.setattr(_nixl, "_api", None)
    for name in ("nixl_cu13", "nixl_cu13._api", "nixl_cu12", "nixl_cu12._api", "nixl", "nixl._api"):
        monkeypatch.setitem(sys.modules, name, None)  # makes `import name` raise ImportError
    assert not nixl_available()
    for make in (RemotePuller, RemoteExporter):
        with pytest.raises(RemoteUnavailableError, match=r'pip install "smg-grpc-proto\[nixl\]"'):
            make()
    with pytest.raises(ImportError, match=r"nixl_cu12\._api"):
        _nixl.load_nixl()
