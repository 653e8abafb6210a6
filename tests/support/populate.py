"""Fill any protobuf message with non-default values, deterministically, by walking its descriptor.

Used by the runtime-matrix smoke script (which runs in foreign virtual environments, so this file
imports nothing but protobuf) and by the betterproto2 equivalence tests.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor as _d
from google.protobuf.message import Message

_SCALARS: dict[int, Any] = {
    _d.FieldDescriptor.TYPE_DOUBLE: -1.25e300,
    _d.FieldDescriptor.TYPE_FLOAT: 3.5,
    _d.FieldDescriptor.TYPE_INT64: -(2**62) - 7,
    _d.FieldDescriptor.TYPE_UINT64: 2**64 - 3,
    _d.FieldDescriptor.TYPE_INT32: -(2**30) - 5,
    _d.FieldDescriptor.TYPE_UINT32: 2**32 - 9,
    _d.FieldDescriptor.TYPE_SINT32: -77,
    _d.FieldDescriptor.TYPE_SINT64: -(2**40),
    _d.FieldDescriptor.TYPE_FIXED32: 2**31 + 1,
    _d.FieldDescriptor.TYPE_FIXED64: 2**63 + 1,
    _d.FieldDescriptor.TYPE_SFIXED32: -(2**31),
    _d.FieldDescriptor.TYPE_SFIXED64: -(2**63),
    _d.FieldDescriptor.TYPE_BOOL: True,
    _d.FieldDescriptor.TYPE_STRING: "héllo ✓ \u4e16",
    _d.FieldDescriptor.TYPE_BYTES: b"\x00\xffbytes\x00",
}

# Well-known types whose fields have semantic ranges (betterproto2 maps them to datetime etc.).
_WELL_KNOWN: dict[str, dict[str, int]] = {
    "google.protobuf.Timestamp": {"seconds": 1_700_000_000, "nanos": 123_456_000},
    "google.protobuf.Duration": {"seconds": 42, "nanos": 5_000},
}


def oneof_width(descriptor: _d.Descriptor, depth: int = 0, max_depth: int = 3) -> int:
    """How many variants are needed so that every member of every oneof is chosen once."""
    width = 1
    for oneof in descriptor.oneofs:
        if not _is_synthetic(oneof):
            width = max(width, len(oneof.fields))
    if depth < max_depth:
        for field in descriptor.fields:
            if field.message_type is not None:
                width = max(width, oneof_width(field.message_type, depth + 1, max_depth))
    return width


def _is_synthetic(oneof: _d.OneofDescriptor) -> bool:
    # proto3 `optional` fields live in a one-member oneof whose name starts with "_".
    return (
        len(oneof.fields) == 1
        and oneof.name.startswith("_")
        and oneof.name[1:] == oneof.fields[0].name
    )


def _value(field: _d.FieldDescriptor, index: int) -> Any:
    if field.type == _d.FieldDescriptor.TYPE_ENUM:
        values = field.enum_type.values
        return values[(len(values) - 1 - index) % len(values)].number or values[-1].number
    value = _SCALARS[field.type]
    if index and field.type in (_d.FieldDescriptor.TYPE_STRING, _d.FieldDescriptor.TYPE_BYTES):
        return value + (str(index) if isinstance(value, str) else bytes([index]))
    if index and field.type not in (_d.FieldDescriptor.TYPE_BOOL,):
        return value - index if value > 0 else value + index
    return value


def _map_key(field: _d.FieldDescriptor, index: int) -> Any:
    if field.type == _d.FieldDescriptor.TYPE_STRING:
        return f"key{index}"
    if field.type == _d.FieldDescriptor.TYPE_BOOL:
        return bool(index)
    return index + 1


def populate(msg: Message, variant: int = 0, depth: int = 0, max_depth: int = 3) -> Message:
    """Set every field of ``msg`` (recursively up to ``max_depth``); returns ``msg``.

    ``variant`` selects which member of each oneof is set (member ``variant % len(members)``).
    """
    desc = msg.DESCRIPTOR
    if desc.full_name in _WELL_KNOWN:
        for name, val in _WELL_KNOWN[desc.full_name].items():
            setattr(msg, name, val)
        return msg
    chosen = set()
    for oneof in desc.oneofs:
        if _is_synthetic(oneof):
            chosen.add(oneof.fields[0].name)
        else:
            chosen.add(oneof.fields[variant % len(oneof.fields)].name)
    for field in desc.fields:
        if field.containing_oneof is not None and field.name not in chosen:
            continue
        container = getattr(msg, field.name)
        is_map = field.message_type is not None and field.message_type.GetOptions().map_entry
        if is_map:
            key_f = field.message_type.fields_by_name["key"]
            val_f = field.message_type.fields_by_name["value"]
            # One entry only: map order on the wire is unspecified and differs between runtimes
            # even with deterministic=True (upb and pure Python sort int keys differently).
            for i in range(1):
                key = _map_key(key_f, i)
                if val_f.message_type is not None:
                    if depth < max_depth:
                        populate(container[key], variant, depth + 1, max_depth)
                    else:
                        container[key].SetInParent()
                else:
                    container[key] = _value(val_f, i)
        elif _is_repeated(field):
            for i in range(2):
                if field.message_type is not None:
                    item = container.add()
                    if depth < max_depth:
                        populate(item, variant + i, depth + 1, max_depth)
                else:
                    container.append(_value(field, i))
        elif field.message_type is not None:
            sub = getattr(msg, field.name)
            sub.SetInParent()
            if depth < max_depth:
                populate(sub, variant, depth + 1, max_depth)
        else:
            setattr(msg, field.name, _value(field, 0))
    return msg


def _is_repeated(field: _d.FieldDescriptor) -> bool:
    # FieldDescriptor.label was removed in protobuf 7.34; is_repeated arrived in 5.29 / 6.x.
    is_repeated = getattr(field, "is_repeated", None)
    if is_repeated is not None:
        return bool(is_repeated)
    return bool(field.label == _d.FieldDescriptor.LABEL_REPEATED)


def all_messages(module: Any) -> list[_d.Descriptor]:
    """Every message type of a ``_pb2`` module, nested ones included, map entries excluded."""
    out: list[_d.Descriptor] = []

    def walk(desc: _d.Descriptor) -> None:
        if desc.GetOptions().map_entry:
            return
        out.append(desc)
        for nested in desc.nested_types:
            walk(nested)

    for desc in module.DESCRIPTOR.message_types_by_name.values():
        walk(desc)
    return out
