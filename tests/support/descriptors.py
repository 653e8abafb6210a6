"""Read serialized FileDescriptorProtos out of generated ``_pb2.py`` files without importing them.

Importing a foreign ``_pb2.py`` would register its files in the default descriptor pool (and the
upstream 0.4.28 gencode refuses protobuf runtimes older than 6.33.5), so we parse the source
instead: the serialized descriptor is the bytes literal passed to ``AddSerializedFile``.
"""

from __future__ import annotations

import ast
from pathlib import Path

from google.protobuf import descriptor_pb2


def serialized_descriptor(pb2_source: str) -> bytes:
    for node in ast.walk(ast.parse(pb2_source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "AddSerializedFile"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, bytes)
        ):
            return node.args[0].value
    raise ValueError("no AddSerializedFile(b'...') call found")


def file_descriptors(generated_dir: Path) -> dict[str, descriptor_pb2.FileDescriptorProto]:
    """Every FileDescriptorProto embedded in ``generated_dir/*_pb2.py``, keyed by file name."""
    out = {}
    for path in sorted(generated_dir.glob("*_pb2.py")):
        fdp = descriptor_pb2.FileDescriptorProto.FromString(serialized_descriptor(path.read_text()))
        out[fdp.name] = fdp
    return out
