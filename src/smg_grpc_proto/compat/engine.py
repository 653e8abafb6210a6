"""Run the rules of a level over two schemas; list what the current schema adds."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

from google.protobuf import descriptor_pb2

from smg_grpc_proto.compat._model import LEVELS, CompatError, Finding, Level
from smg_grpc_proto.compat.config import is_ignored, validate_ignore
from smg_grpc_proto.compat.rules import Comparison, rules_for
from smg_grpc_proto.compat.schema import MessageInfo, Schema, is_well_known

FileDescriptorSet = descriptor_pb2.FileDescriptorSet


def check(
    current: FileDescriptorSet,
    against: FileDescriptorSet,
    *,
    level: Level = "wire",
    ignore: Mapping[str, Sequence[str]] | None = None,
) -> list[Finding]:
    """Breaking changes of ``current`` relative to ``against`` at ``level``.

    ``ignore`` maps a rule id (or a buf category id such as ``WIRE_JSON``, or ``"*"`` for every
    rule) to the descriptor file names or directory prefixes where its findings are dropped;
    ``"."`` stands for every file. Findings are sorted by file, line, column and rule.
    """
    if level not in LEVELS:
        raise CompatError(f"unknown level {level!r}; expected one of {', '.join(LEVELS)}")
    if ignore:
        validate_ignore(ignore)
    comparison = Comparison(Schema(current), Schema(against))
    findings = []
    for r in rules_for(level):
        for where, message in r.check(comparison):
            finding = Finding(r.id, where.file, where.line, where.column, message)
            if not (ignore and is_ignored(finding, ignore)):
                findings.append(finding)
    return sorted(set(findings), key=Finding.sort_key)


def additions(current: FileDescriptorSet, against: FileDescriptorSet) -> list[str]:
    """Elements of ``current`` that ``against`` lacks, as sorted readable paths.

    Paths use the vocabulary of ``tests/compat/test_wire_compat.py``: ``file.proto`` for a file,
    ``file.proto:pkg.Message`` for a message, enum or service, then ``/field N``,
    ``/oneof name``, ``/value NAME`` and ``/rpc Name`` for their members (an extension is
    ``file.proto:pkg.name``). Messages, enums, services and extensions are matched by full name,
    so moving one between files adds nothing.
    The well-known types' files are never listed.
    """
    new, old = Schema(current), Schema(against)
    return sorted(set(_additions(new, old)))


def _additions(new: Schema, old: Schema) -> Iterator[str]:
    for name in new.files:
        if name not in old.files and not is_well_known(name):
            yield name
    for full, m in new.messages.items():
        if is_well_known(m.file.name) or m.is_map_entry:
            continue
        prefix = f"{m.file.name}:{full}"
        before = old.messages.get(full)
        if before is None:
            yield prefix
        yield from _message_members(prefix, m, before)
    for full, e in new.enums.items():
        if is_well_known(e.file.name):
            continue
        prefix = f"{e.file.name}:{full}"
        previous = old.enums.get(full)
        if previous is None:
            yield prefix
        known = {v.name for v in previous.proto.value} if previous else set()
        yield from (f"{prefix}/value {v.name}" for v in e.proto.value if v.name not in known)
    for full, s in new.services.items():
        if is_well_known(s.file.name):
            continue
        prefix = f"{s.file.name}:{full}"
        prior = old.services.get(full)
        if prior is None:
            yield prefix
        known = {m.name for m in prior.proto.method} if prior else set()
        yield from (f"{prefix}/rpc {m.name}" for m in s.proto.method if m.name not in known)
    for full, x in new.extensions.items():
        if full not in old.extensions and not is_well_known(x.file.name):
            yield f"{x.file.name}:{full}"


def _message_members(prefix: str, m: MessageInfo, before: MessageInfo | None) -> Iterator[str]:
    numbers = set(before.fields) if before else set()
    for number in m.fields:
        if number not in numbers:
            yield f"{prefix}/field {number}"
    oneofs = {name for _, name in before.real_oneofs()} if before else set()
    for _, name in m.real_oneofs():
        if name not in oneofs:
            yield f"{prefix}/oneof {name}"
