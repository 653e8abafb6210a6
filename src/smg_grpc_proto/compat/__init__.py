"""Schema compatibility checker: buf's breaking-change rules in Python, over descriptors.

Compare the current schemas with a reference (a directory of ``.proto`` files, a
FileDescriptorSet, a wheel, a ``name==version`` requirement or a git revision)::

    from smg_grpc_proto.compat import check, current_schema, load_schema

    findings = check(current_schema(), load_schema("smg-grpc-proto==0.4.28"), level="wire")
    for f in findings:
        print(f"{f.file}:{f.line}:{f.column}: {f.rule}: {f.message}")

Levels are buf's categories (``wire`` ⊂ ``wire-json`` ⊂ ``package`` ⊂ ``file``) and rule ids
are buf's. No Go binary is needed; compiling ``.proto`` sources needs grpcio-tools
(``pip install "smg-grpc-proto[compat]"``). The command line is ``smg-proto compat``.
"""

from __future__ import annotations

from smg_grpc_proto.compat._model import CompatError, Finding, Level
from smg_grpc_proto.compat.engine import additions, check
from smg_grpc_proto.compat.sources import current_schema, load_schema

__all__ = [
    "CompatError",
    "Finding",
    "Level",
    "additions",
    "check",
    "current_schema",
    "load_schema",
]
