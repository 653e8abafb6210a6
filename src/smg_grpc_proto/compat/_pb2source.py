"""Serialized FileDescriptorProtos read out of generated ``_pb2.py`` sources, never imported.

Importing a foreign ``_pb2.py`` would register its files in the process's descriptor pool (and
newer gencode refuses older protobuf runtimes), so the source is parsed instead: the descriptor is
the bytes literal passed to ``AddSerializedFile`` (or, in old gencode, ``serialized_pb=``).
"""

from __future__ import annotations

import ast


def serialized_descriptor(pb2_source: str) -> bytes | None:
    """The serialized FileDescriptorProto embedded in a ``_pb2.py`` source, if any."""
    for node in ast.walk(ast.parse(pb2_source)):
        if not isinstance(node, ast.Call):
            continue
        if (
            isinstance(node.func, ast.Attribute)
            and node.func.attr == "AddSerializedFile"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, bytes)
        ):
            return node.args[0].value
        for keyword in node.keywords:
            if (
                keyword.arg == "serialized_pb"
                and isinstance(keyword.value, ast.Constant)
                and isinstance(keyword.value.value, bytes)
            ):
                return keyword.value.value
    return None
