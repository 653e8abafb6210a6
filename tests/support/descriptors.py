"""FileDescriptorProtos of a folder of generated ``_pb2.py`` files, read without importing them.

The parsing itself is the package's (``smg_grpc_proto.compat._pb2source``); this only maps a
folder to ``{file name: FileDescriptorProto}`` for the tests.
"""

from __future__ import annotations

from pathlib import Path

from google.protobuf import descriptor_pb2

from smg_grpc_proto.compat._pb2source import serialized_descriptor


def file_descriptors(generated_dir: Path) -> dict[str, descriptor_pb2.FileDescriptorProto]:
    """Every FileDescriptorProto embedded in ``generated_dir/*_pb2.py``, keyed by file name."""
    out = {}
    for path in sorted(generated_dir.glob("*_pb2.py")):
        data = serialized_descriptor(path.read_text())
        if data is None:
            raise ValueError(f"{path}: no serialized descriptor found")
        fdp = descriptor_pb2.FileDescriptorProto.FromString(data)
        out[fdp.name] = fdp
    return out
