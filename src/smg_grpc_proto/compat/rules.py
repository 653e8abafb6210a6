"""buf's v2 breaking-change rules, one function per rule id, over a :class:`Comparison`.

Each rule function yields ``(Where, message)`` pairs; :func:`rule` registers it under its buf
rule id together with the categories (levels) it belongs to. Rules know nothing about output
formats or ignores: :mod:`.engine` turns what they yield into findings.

Matching follows buf: files by name; messages, enums, services and extensions by full name for
every "same …" rule (so a message moved to another file is still compared field by field);
per-file deletion rules (``file`` level) by package-relative name within a file of the same name;
per-package deletion rules (``package`` level) by full name within a package of the same name;
fields and enum values by number; oneofs and RPCs by name. Locations come from the current
schema: the changed part of an element when it is declared (e.g. a field's type), else the
element, else (for deletions) the nearest enclosing element that still exists.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Protocol, TypeVar

from google.protobuf import descriptor_pb2

from smg_grpc_proto.compat._model import Level
from smg_grpc_proto.compat.schema import (
    CPP_FEATURES_NUMBER,
    ENUM_CLOSED,
    ENUM_FEATURES,
    ENUM_OPTIONS,
    ENUM_VALUE,
    FEATURE_ENUM_TYPE,
    FEATURE_JSON_FORMAT,
    FEATURE_UTF8_VALIDATION,
    FIELD_DEFAULT,
    FIELD_FEATURES,
    FIELD_JSON_NAME,
    FIELD_LABEL,
    FIELD_NAME,
    FIELD_OPTIONS,
    FIELD_TYPE,
    FIELD_TYPE_NAME,
    FILE_EDITION,
    FILE_OPTIONS,
    FILE_PACKAGE,
    FILE_SYNTAX,
    JAVA_FEATURES_NUMBER,
    JAVA_UTF8_VERIFY,
    JSON_ALLOW,
    JSON_LEGACY_BEST_EFFORT,
    LANGUAGE_STRING_TYPE,
    LANGUAGE_UTF8_VALIDATION,
    METHOD_INPUT,
    METHOD_OPTIONS,
    METHOD_OUTPUT,
    MSG_FEATURES,
    MSG_OPTIONS,
    PRESENCE_IMPLICIT,
    PRESENCE_LEGACY_REQUIRED,
    SERVICE_METHOD,
    UTF8_VERIFY,
    VALUE_NUMBER,
    EnumInfo,
    FieldInfo,
    FileInfo,
    MessageInfo,
    Path,
    Schema,
    ServiceInfo,
    is_well_known,
)

FieldProto = descriptor_pb2.FieldDescriptorProto
FileOptions = descriptor_pb2.FileOptions
MethodOptions = descriptor_pb2.MethodOptions

WIRE_RULES_URL = "https://developers.google.com/protocol-buffers/docs/proto3#updating"
JSON_RULES_URL = "https://developers.google.com/protocol-buffers/docs/proto3#json"


# ------------------------------------------------------------------------------------ registry


@dataclass(frozen=True)
class Where:
    """A location in a schema file; ``line``/``column`` are 1-based, ``None`` when unknown."""

    file: str
    line: int | None = None
    column: int | None = None


Issue = tuple[Where, str]
RuleCheck = Callable[["Comparison"], Iterable[Issue]]


@dataclass(frozen=True)
class Rule:
    """A registered rule: its buf id, the levels that run it, and its check."""

    id: str
    categories: frozenset[Level]
    purpose: str
    check: RuleCheck


RULES: dict[str, Rule] = {}
"""Every implemented rule by buf rule id, in registration order."""

_CATEGORY_CODES: dict[str, Level] = {"F": "file", "P": "package", "WJ": "wire-json", "W": "wire"}


def rule(rule_id: str, categories: str, purpose: str) -> Callable[[RuleCheck], RuleCheck]:
    """Register a rule; ``categories`` uses buf's initials, e.g. ``"F P WJ W"``."""

    def register(check: RuleCheck) -> RuleCheck:
        levels = frozenset(_CATEGORY_CODES[code] for code in categories.split())
        RULES[rule_id] = Rule(rule_id, levels, purpose, check)
        return check

    return register


def rules_for(level: Level) -> list[Rule]:
    """The rules a level runs (those of buf's category of the same name)."""
    return [r for r in RULES.values() if level in r.categories]


# ------------------------------------------------------------------------------------ pairing


class Element(Protocol):
    """What every indexed element has: a file and a full name."""

    @property
    def file(self) -> FileInfo: ...

    @property
    def full_name(self) -> str: ...


_E = TypeVar("_E", bound=Element)


def _pairs(old: Mapping[str, _E], new: Mapping[str, _E]) -> list[tuple[_E, _E]]:
    return [
        (o, new[name]) for name, o in old.items() if name in new and not is_well_known(o.file.name)
    ]


@dataclass(frozen=True)
class FieldPair:
    """A field (or extension) of the reference and its counterpart in the current schema."""

    old: FieldInfo
    new: FieldInfo

    @property
    def label(self) -> str:
        """How messages name the field: ``Field "1" with name "x" on message "M"``."""
        if self.new.is_extension:
            return f'Extension "{self.new.full_name}" with number "{self.new.number}"'
        owner = self.new.message.nested_name if self.new.message else ""
        return f'Field "{self.new.number}" with name "{self.new.name}" on message "{owner}"'


@dataclass(frozen=True)
class MethodPair:
    """An RPC of the reference and its counterpart (same service, same name)."""

    service: ServiceInfo
    index: int
    old: descriptor_pb2.MethodDescriptorProto
    new: descriptor_pb2.MethodDescriptorProto

    @property
    def path(self) -> Path:
        return (*self.service.path, SERVICE_METHOD, self.index)

    @property
    def label(self) -> str:
        return f'RPC "{self.new.name}" on service "{self.service.proto.name}"'


class Comparison:
    """The current schema against a reference, with the pairings the rules iterate over."""

    def __init__(self, new: Schema, old: Schema) -> None:
        self.new = new
        self.old = old

    @cached_property
    def files(self) -> list[tuple[FileInfo, FileInfo]]:
        return [
            (o, self.new.files[name])
            for name, o in self.old.files.items()
            if name in self.new.files and not is_well_known(name)
        ]

    @cached_property
    def messages(self) -> list[tuple[MessageInfo, MessageInfo]]:
        return _pairs(self.old.messages, self.new.messages)

    @cached_property
    def enums(self) -> list[tuple[EnumInfo, EnumInfo]]:
        return _pairs(self.old.enums, self.new.enums)

    @cached_property
    def services(self) -> list[tuple[ServiceInfo, ServiceInfo]]:
        return _pairs(self.old.services, self.new.services)

    @cached_property
    def fields(self) -> list[FieldPair]:
        """Message fields matched by number, then extensions matched by full name."""
        out = [
            FieldPair(of, nm.fields[number])
            for om, nm in self.messages
            for number, of in om.fields.items()
            if number in nm.fields
        ]
        out += [FieldPair(o, n) for o, n in _pairs(self.old.extensions, self.new.extensions)]
        return out

    @cached_property
    def methods(self) -> list[MethodPair]:
        out = []
        for old_service, new_service in self.services:
            by_name = {m.name: (i, m) for i, m in enumerate(new_service.proto.method)}
            for om in old_service.proto.method:
                if om.name in by_name:
                    index, nm = by_name[om.name]
                    out.append(MethodPair(new_service, index, om, nm))
        return out

    @cached_property
    def old_packages(self) -> dict[str, list[FileInfo]]:
        """Packages of the reference (well-known types excluded) → their files."""
        out: dict[str, list[FileInfo]] = {}
        for package, files in self.old.packages.items():
            own = [f for f in files if not is_well_known(f.name)]
            if own:
                out[package] = own
        return out


# ------------------------------------------------------------------------------ field helpers

_NAMED_KINDS = ("message", "enum", "group")


def kind(f: FieldInfo) -> str:
    """buf's name for a field's type kind: ``int32``, ``string``, ``enum``, ``message``…"""
    return f.kind


def has_presence(f: FieldInfo) -> bool:
    """Whether the field tracks presence (explicit presence), per its syntax and features."""
    proto = f.proto
    if proto.type in (FieldProto.TYPE_MESSAGE, FieldProto.TYPE_GROUP):
        return True
    if proto.HasField("oneof_index") or f.is_extension:
        return True
    return f.features.field_presence != PRESENCE_IMPLICIT


def cardinality(schema: Schema, f: FieldInfo) -> str:
    """buf's cardinality vocabulary: ``repeated``, ``map``, ``required``, ``optional with …``."""
    proto = f.proto
    if proto.label == FieldProto.LABEL_REPEATED:
        entry = schema.message_type(proto)
        return "map" if entry is not None and entry.is_map_entry else "repeated"
    if (
        proto.label == FieldProto.LABEL_REQUIRED
        or f.features.field_presence == PRESENCE_LEGACY_REQUIRED
    ):
        return "required"
    return f"optional with {'explicit' if has_presence(f) else 'implicit'} presence"


def json_name(f: FieldProto) -> str:
    """The field's JSON name: explicit ``json_name``, else protoc's lowerCamelCase of the name."""
    if f.HasField("json_name"):
        return f.json_name
    out: list[str] = []
    upper_next = False
    for ch in f.name:
        if ch == "_":
            upper_next = True
        elif upper_next:
            out.append(ch.upper())
            upper_next = False
        else:
            out.append(ch)
    return "".join(out)


# ------------------------------------------------------------------------------------ locations


def _loc(file: FileInfo, *paths: Path) -> Where:
    for path in paths:
        found = file.location(path)
        if found is not None:
            return Where(file.name, *found)
    return Where(file.name)


def at_message(m: MessageInfo, *subpaths: Path) -> Where:
    """The message (or one of its parts); a map entry is located at its map field."""
    if m.is_map_entry and m.entry_location is not None:
        return Where(m.file.name, *m.entry_location)
    return _loc(m.file, *((*m.path, *sub) for sub in subpaths), m.path)


def at_field(f: FieldInfo, *subpaths: Path) -> Where:
    if f.message is not None and f.message.is_map_entry and f.message.entry_location:
        return Where(f.file.name, *f.message.entry_location)
    return _loc(f.file, *((*f.path, *sub) for sub in subpaths), f.path)


def at_enum(e: EnumInfo, *subpaths: Path) -> Where:
    return _loc(e.file, *((*e.path, *sub) for sub in subpaths), e.path)


def _nearest_parent(
    schema: Schema, per_file: Mapping[str, MessageInfo] | None, name: str, floor: int
) -> MessageInfo | None:
    """The closest enclosing message of ``name`` that still exists.

    ``per_file`` given: ``name`` is package-relative and looked up in that file; otherwise
    ``name`` is a full name, ``floor`` the number of its package's components.
    """
    parts = name.split(".")
    for end in range(len(parts) - 1, floor, -1):
        prefix = ".".join(parts[:end])
        found = per_file.get(prefix) if per_file is not None else schema.messages.get(prefix)
        if found is not None:
            return found
    return None


# ------------------------------------------------------------------------------------ deletions


@rule("FILE_NO_DELETE", "F", "files are not deleted")
def file_no_delete(c: Comparison) -> Iterator[Issue]:
    for name in c.old.files:
        if name not in c.new.files and not is_well_known(name):
            yield Where(name), f'Previously present file "{name}" was deleted.'


@rule("PACKAGE_NO_DELETE", "P", "packages are not deleted")
def package_no_delete(c: Comparison) -> Iterator[Issue]:
    for package, files in c.old_packages.items():
        if package not in c.new.packages:
            yield Where(files[0].name), f'Previously present package "{package}" was deleted.'


PerFile = Callable[[Schema, str], Mapping[str, Element]]


def _deleted_from_files(c: Comparison, kind_name: str, per_file: PerFile) -> Iterator[Issue]:
    for old_file, new_file in c.files:
        current = per_file(c.new, new_file.name)
        messages = c.new.file_messages(new_file.name)
        for name in per_file(c.old, old_file.name):
            if name not in current:
                parent = _nearest_parent(c.new, messages, name, 0)
                where = at_message(parent) if parent is not None else Where(new_file.name)
                yield where, f'Previously present {kind_name} "{name}" was deleted from file.'


@rule("MESSAGE_NO_DELETE", "F", "messages are not deleted from a file")
def message_no_delete(c: Comparison) -> Iterator[Issue]:
    yield from _deleted_from_files(c, "message", Schema.file_messages)


@rule("ENUM_NO_DELETE", "F", "enums are not deleted from a file")
def enum_no_delete(c: Comparison) -> Iterator[Issue]:
    yield from _deleted_from_files(c, "enum", Schema.file_enums)


@rule("SERVICE_NO_DELETE", "F", "services are not deleted from a file")
def service_no_delete(c: Comparison) -> Iterator[Issue]:
    yield from _deleted_from_files(c, "service", Schema.file_services)


@rule("EXTENSION_NO_DELETE", "F", "extensions are not deleted from a file")
def extension_no_delete(c: Comparison) -> Iterator[Issue]:
    yield from _deleted_from_files(c, "extension", Schema.file_extensions)


Everything = Callable[[Schema], Mapping[str, Element]]


def _deleted_from_packages(
    c: Comparison, kind_name: str, everything: Everything, only_if_kind_left: bool
) -> Iterator[Issue]:
    """Elements of a still-existing package that none of its files declares any more.

    As buf does, with ``only_if_kind_left`` a package is only searched when it still declares
    at least one element of that kind (buf behaves so for messages, enums and extensions).
    """
    old_all, new_all = everything(c.old), everything(c.new)
    packages_left = {element.file.package for element in new_all.values()}
    for full_name, element in old_all.items():
        file = element.file
        package = file.package
        if is_well_known(file.name) or package not in c.new.packages or full_name in new_all:
            continue
        if only_if_kind_left and package not in packages_left:
            continue
        floor = len(package.split(".")) if package else 0
        parent = _nearest_parent(c.new, None, full_name, floor)
        nested = full_name[len(package) + 1 :] if package else full_name
        yield (
            at_message(parent) if parent is not None else Where(file.name),
            f'Previously present {kind_name} "{nested}" was deleted from package "{package}".',
        )


@rule("PACKAGE_MESSAGE_NO_DELETE", "P", "messages are not deleted from a package")
def package_message_no_delete(c: Comparison) -> Iterator[Issue]:
    yield from _deleted_from_packages(c, "message", lambda s: s.messages, True)


@rule("PACKAGE_ENUM_NO_DELETE", "P", "enums are not deleted from a package")
def package_enum_no_delete(c: Comparison) -> Iterator[Issue]:
    yield from _deleted_from_packages(c, "enum", lambda s: s.enums, True)


@rule("PACKAGE_SERVICE_NO_DELETE", "P", "services are not deleted from a package")
def package_service_no_delete(c: Comparison) -> Iterator[Issue]:
    yield from _deleted_from_packages(c, "service", lambda s: s.services, False)


@rule("PACKAGE_EXTENSION_NO_DELETE", "P", "extensions are not deleted from a package")
def package_extension_no_delete(c: Comparison) -> Iterator[Issue]:
    yield from _deleted_from_packages(c, "extension", lambda s: s.extensions, True)


class _Range(Protocol):
    @property
    def start(self) -> int: ...

    @property
    def end(self) -> int: ...


def _reserved(ranges: Iterable[_Range], inclusive_end: bool) -> list[tuple[int, int]]:
    """Reserved or extension ranges as inclusive ``(start, end)`` pairs (messages store an
    exclusive end, enums an inclusive one)."""
    return [(r.start, r.end if inclusive_end else r.end - 1) for r in ranges]


def _covered(number: int, ranges: Sequence[tuple[int, int]]) -> bool:
    return any(start <= number <= end for start, end in ranges)


def _deleted_fields(c: Comparison) -> Iterator[tuple[MessageInfo, FieldInfo, MessageInfo]]:
    for om, nm in c.messages:
        for number, of in om.fields.items():
            if number not in nm.fields:
                yield om, of, nm


def _field_gone(of: FieldInfo, nm: MessageInfo) -> str:
    return (
        f'Previously present field "{of.number}" with name "{of.name}" '
        f'on message "{nm.nested_name}" was deleted'
    )


@rule("FIELD_NO_DELETE", "F P", "fields are not deleted from a message")
def field_no_delete(c: Comparison) -> Iterator[Issue]:
    for _, of, nm in _deleted_fields(c):
        yield at_message(nm), _field_gone(of, nm) + "."


@rule(
    "FIELD_NO_DELETE_UNLESS_NUMBER_RESERVED",
    "WJ W",
    "fields are not deleted from a message unless their number is reserved",
)
def field_no_delete_unless_number_reserved(c: Comparison) -> Iterator[Issue]:
    for _, of, nm in _deleted_fields(c):
        if not _covered(of.number, _reserved(nm.proto.reserved_range, inclusive_end=False)):
            message = f'{_field_gone(of, nm)} without reserving the number "{of.number}".'
            yield at_message(nm), message


@rule(
    "FIELD_NO_DELETE_UNLESS_NAME_RESERVED",
    "WJ",
    "fields are not deleted from a message unless their name is reserved",
)
def field_no_delete_unless_name_reserved(c: Comparison) -> Iterator[Issue]:
    for _, of, nm in _deleted_fields(c):
        if of.name not in nm.proto.reserved_name:
            yield at_message(nm), f'{_field_gone(of, nm)} without reserving the name "{of.name}".'


@rule("ONEOF_NO_DELETE", "F P", "oneofs are not deleted from a message")
def oneof_no_delete(c: Comparison) -> Iterator[Issue]:
    for om, nm in c.messages:
        current = {name for _, name in nm.real_oneofs()}
        for _, name in om.real_oneofs():
            if name not in current:
                yield (
                    at_message(nm),
                    f'Previously present oneof "{name}" on message "{nm.nested_name}" was deleted.',
                )


def _values_by_number(enum: EnumInfo) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for v in enum.proto.value:
        out.setdefault(v.number, []).append(v.name)
    return out


def _deleted_values(c: Comparison) -> Iterator[tuple[int, list[str], EnumInfo]]:
    for oe, ne in c.enums:
        current = _values_by_number(ne)
        for number, names in _values_by_number(oe).items():
            if number not in current:
                yield number, names, ne


def _value_gone(number: int, ne: EnumInfo) -> str:
    return f'Previously present enum value "{number}" on enum "{ne.nested_name}" was deleted'


@rule("ENUM_VALUE_NO_DELETE", "F P", "enum values are not deleted from an enum")
def enum_value_no_delete(c: Comparison) -> Iterator[Issue]:
    for number, _, ne in _deleted_values(c):
        yield at_enum(ne), _value_gone(number, ne) + "."


@rule(
    "ENUM_VALUE_NO_DELETE_UNLESS_NUMBER_RESERVED",
    "WJ W",
    "enum values are not deleted unless their number is reserved",
)
def enum_value_no_delete_unless_number_reserved(c: Comparison) -> Iterator[Issue]:
    for number, _, ne in _deleted_values(c):
        if not _covered(number, _reserved(ne.proto.reserved_range, inclusive_end=True)):
            message = f'{_value_gone(number, ne)} without reserving the number "{number}".'
            yield at_enum(ne), message


@rule(
    "ENUM_VALUE_NO_DELETE_UNLESS_NAME_RESERVED",
    "WJ",
    "enum values are not deleted unless their name is reserved",
)
def enum_value_no_delete_unless_name_reserved(c: Comparison) -> Iterator[Issue]:
    for number, names, ne in _deleted_values(c):
        missing = [name for name in names if name not in ne.proto.reserved_name]
        if missing:
            quoted = ", ".join(f'"{name}"' for name in missing)
            noun = "names" if len(missing) > 1 else "name"
            yield at_enum(ne), f"{_value_gone(number, ne)} without reserving the {noun} {quoted}."


@rule("RPC_NO_DELETE", "F P", "RPCs are not deleted from a service")
def rpc_no_delete(c: Comparison) -> Iterator[Issue]:
    for os_, ns in c.services:
        current = {m.name for m in ns.proto.method}
        for m in os_.proto.method:
            if m.name not in current:
                yield (
                    _loc(ns.file, ns.path),
                    f'Previously present RPC "{m.name}" on service "{ns.proto.name}" was deleted.',
                )


def _missing_pieces(
    old: Sequence[tuple[int, int]], new: Sequence[tuple[int, int]]
) -> Iterator[tuple[tuple[int, int], list[tuple[int, int]]]]:
    """For each old inclusive range, the sub-ranges no new range covers (if any)."""
    for start, end in old:
        pieces: list[tuple[int, int]] = []
        cursor = start
        for new_start, new_end in sorted(new):
            if new_end < cursor or new_start > end:
                continue
            if new_start > cursor:
                pieces.append((cursor, new_start - 1))
            cursor = max(cursor, new_end + 1)
            if cursor > end:
                break
        if cursor <= end:
            pieces.append((cursor, end))
        if pieces:
            yield (start, end), pieces


def _span(r: tuple[int, int]) -> str:
    return f"[{r[0]}]" if r[0] == r[1] else f"[{r[0]},{r[1]}]"


def _ranges_deleted(
    kind_name: str,
    owner: str,
    old: Sequence[tuple[int, int]],
    new: Sequence[tuple[int, int]],
) -> Iterator[str]:
    for whole, pieces in _missing_pieces(old, new):
        gone = ", ".join(_span(p) for p in pieces)
        yield (
            f'Previously present {kind_name} "{_span(whole)}" on {owner} '
            f"is missing values: {gone} were removed."
        )


@rule("RESERVED_MESSAGE_NO_DELETE", "F P WJ W", "reserved ranges and names stay reserved")
def reserved_message_no_delete(c: Comparison) -> Iterator[Issue]:
    for om, nm in c.messages:
        where, owner = at_message(nm), f'message "{nm.nested_name}"'
        old = _reserved(om.proto.reserved_range, inclusive_end=False)
        new = _reserved(nm.proto.reserved_range, inclusive_end=False)
        for message in _ranges_deleted("reserved range", owner, old, new):
            yield where, message
        for name in om.proto.reserved_name:
            if name not in nm.proto.reserved_name:
                yield where, f'Previously present reserved name "{name}" on {owner} was deleted.'


@rule("RESERVED_ENUM_NO_DELETE", "F P WJ W", "reserved enum ranges and names stay reserved")
def reserved_enum_no_delete(c: Comparison) -> Iterator[Issue]:
    for oe, ne in c.enums:
        where, owner = at_enum(ne), f'enum "{ne.nested_name}"'
        old = _reserved(oe.proto.reserved_range, inclusive_end=True)
        new = _reserved(ne.proto.reserved_range, inclusive_end=True)
        for message in _ranges_deleted("reserved range", owner, old, new):
            yield where, message
        for name in oe.proto.reserved_name:
            if name not in ne.proto.reserved_name:
                yield where, f'Previously present reserved name "{name}" on {owner} was deleted.'


@rule("EXTENSION_MESSAGE_NO_DELETE", "F P", "extension ranges are not deleted from a message")
def extension_message_no_delete(c: Comparison) -> Iterator[Issue]:
    for om, nm in c.messages:
        old = _reserved(om.proto.extension_range, inclusive_end=False)
        new = _reserved(nm.proto.extension_range, inclusive_end=False)
        owner = f'message "{nm.nested_name}"'
        for message in _ranges_deleted("extension range", owner, old, new):
            yield at_message(nm), message


# ------------------------------------------------------------------------------------ fields

# Kinds a value can change between without breaking the binary encoding (protobuf's
# "Updating a message type" rules as buf applies them): varint integers and bool, the zigzag
# pair, the two fixed-width pairs; string may become bytes (not the other way round).
_WIRE_GROUPS = (
    {"int32", "int64", "uint32", "uint64", "bool"},
    {"sint32", "sint64"},
    {"fixed32", "sfixed32"},
    {"fixed64", "sfixed64"},
)
# ...and without breaking ProtoJSON either (same JSON representation).
_WIRE_JSON_GROUPS = (
    {"int32", "uint32"},
    {"int64", "uint64"},
    {"fixed32", "sfixed32"},
    {"fixed64", "sfixed64"},
)


def _type_change(p: FieldPair) -> tuple[str, str] | None:
    """``(old, new)`` type names if the type changed: kinds, or full names for a named type."""
    old_kind, new_kind = kind(p.old), kind(p.new)
    if old_kind != new_kind:
        return old_kind, new_kind
    if old_kind in _NAMED_KINDS and p.old.proto.type_name != p.new.proto.type_name:
        return p.old.proto.type_name.lstrip("."), p.new.proto.type_name.lstrip(".")
    return None


def _wire_compatible(old_kind: str, new_kind: str, groups: Sequence[set[str]]) -> bool:
    if old_kind == new_kind:
        return False  # same kind, different named type: never compatible
    return any(old_kind in g and new_kind in g for g in groups)


def _at_type(p: FieldPair) -> Where:
    """A field's type as written: the type name of a message or enum, else the type keyword."""
    named = p.new.proto.type in (FieldProto.TYPE_MESSAGE, FieldProto.TYPE_ENUM)
    return at_field(p.new, (FIELD_TYPE_NAME,) if named else (FIELD_TYPE,))


def _type_message(p: FieldPair, change: tuple[str, str]) -> str:
    return f'{p.label} changed type from "{change[0]}" to "{change[1]}".'


@rule("FIELD_SAME_TYPE", "F P", "fields keep their type")
def field_same_type(c: Comparison) -> Iterator[Issue]:
    for p in c.fields:
        change = _type_change(p)
        if change is not None:
            yield _at_type(p), _type_message(p, change)


@rule("FIELD_WIRE_COMPATIBLE_TYPE", "W", "field types only change wire-compatibly")
def field_wire_compatible_type(c: Comparison) -> Iterator[Issue]:
    for p in c.fields:
        change = _type_change(p)
        if change is None:
            continue
        old_kind, new_kind = kind(p.old), kind(p.new)
        if old_kind == "string" and new_kind == "bytes":
            continue
        if _wire_compatible(old_kind, new_kind, _WIRE_GROUPS):
            continue
        message = _type_message(p, change)
        if old_kind != new_kind:
            message += f" See {WIRE_RULES_URL} for wire compatibility rules."
        yield _at_type(p), message


@rule(
    "FIELD_WIRE_JSON_COMPATIBLE_TYPE",
    "WJ",
    "field types only change compatibly for both the binary and the JSON encoding",
)
def field_wire_json_compatible_type(c: Comparison) -> Iterator[Issue]:
    for p in c.fields:
        change = _type_change(p)
        if change is None:
            continue
        old_kind, new_kind = kind(p.old), kind(p.new)
        if _wire_compatible(old_kind, new_kind, _WIRE_JSON_GROUPS):
            continue
        message = _type_message(p, change)
        if old_kind != new_kind:
            message += (
                f" See {WIRE_RULES_URL} for wire compatibility rules and"
                f" {JSON_RULES_URL} for JSON compatibility rules."
            )
        yield _at_type(p), message


def _cardinalities(c: Comparison) -> Iterator[tuple[FieldPair, str, str]]:
    for p in c.fields:
        old, new = cardinality(c.old, p.old), cardinality(c.new, p.new)
        if old != new:
            yield p, old, new


def _cardinality_issue(p: FieldPair, old: str, new: str) -> Issue:
    message = f'{p.label} changed cardinality from "{old}" to "{new}".'
    return at_field(p.new, (FIELD_LABEL,)), message


_WIRE_CARDINALITY = {"map": "repeated"}


def _wire_class(value: str, json: bool) -> str:
    if value.startswith("optional"):
        return "optional"
    return value if json else _WIRE_CARDINALITY.get(value, value)


@rule("FIELD_SAME_CARDINALITY", "F P", "fields keep their cardinality and presence")
def field_same_cardinality(c: Comparison) -> Iterator[Issue]:
    for p, old, new in _cardinalities(c):
        yield _cardinality_issue(p, old, new)


@rule(
    "FIELD_WIRE_COMPATIBLE_CARDINALITY",
    "W",
    "field cardinality only changes wire-compatibly (presence may change; map ↔ repeated)",
)
def field_wire_compatible_cardinality(c: Comparison) -> Iterator[Issue]:
    for p, old, new in _cardinalities(c):
        if _wire_class(old, json=False) != _wire_class(new, json=False):
            yield _cardinality_issue(p, old, new)


@rule(
    "FIELD_WIRE_JSON_COMPATIBLE_CARDINALITY",
    "WJ",
    "field cardinality only changes compatibly for both encodings (presence may change)",
)
def field_wire_json_compatible_cardinality(c: Comparison) -> Iterator[Issue]:
    for p, old, new in _cardinalities(c):
        if _wire_class(old, json=True) != _wire_class(new, json=True):
            yield _cardinality_issue(p, old, new)


@rule("FIELD_SAME_ONEOF", "F P WJ W", "fields do not move into, out of or between oneofs")
def field_same_oneof(c: Comparison) -> Iterator[Issue]:
    for p in c.fields:
        if p.old.message is None or p.new.message is None or p.new.is_extension:
            continue
        old = p.old.message.oneof_name(p.old.proto)
        new = p.new.message.oneof_name(p.new.proto)
        if old == new:
            continue
        if old is None:
            move = "moved from outside to inside a oneof"
        elif new is None:
            move = "moved from inside to outside a oneof"
        else:
            move = f'moved from oneof "{old}" to oneof "{new}"'
        yield at_field(p.new), f"{p.label} {move}."


@rule("FIELD_SAME_NAME", "F P WJ", "fields keep their name")
def field_same_name(c: Comparison) -> Iterator[Issue]:
    for p in c.fields:
        if p.old.name != p.new.name and not p.new.is_extension:
            owner = p.new.message.nested_name if p.new.message else ""
            yield (
                at_field(p.new, (FIELD_NAME,)),
                f'Field "{p.new.number}" on message "{owner}" changed name '
                f'from "{p.old.name}" to "{p.new.name}".',
            )


@rule("FIELD_SAME_JSON_NAME", "F P WJ", "fields keep their JSON name")
def field_same_json_name(c: Comparison) -> Iterator[Issue]:
    for p in c.fields:
        if p.new.is_extension:
            continue
        old, new = json_name(p.old.proto), json_name(p.new.proto)
        if old != new:
            yield (
                at_field(p.new, (FIELD_JSON_NAME,)),
                f'{p.label} changed option "json_name" from "{old}" to "{new}".',
            )


_INT_KINDS = {
    "int32",
    "int64",
    "uint32",
    "uint64",
    "sint32",
    "sint64",
    "fixed32",
    "fixed64",
    "sfixed32",
    "sfixed64",
}


def _default_value(schema: Schema, f: FieldInfo) -> object:
    """The field's default, explicit or implied, as a comparable value."""
    proto, text = f.proto, f.proto.default_value
    explicit = proto.HasField("default_value")
    k = kind(f)
    if k in _INT_KINDS:
        return int(text, 0) if explicit else 0
    if k in ("float", "double"):
        value = float(text) if explicit else 0.0
        return "nan" if math.isnan(value) else value
    if k == "bool":
        return text == "true" if explicit else False
    if k in ("string", "bytes"):
        return text if explicit else ""
    if k == "enum":
        enum = schema.enum_type(proto)
        values = enum.proto.value if enum is not None else []
        if explicit:
            return next((v.number for v in values if v.name == text), text)
        return values[0].number if values else 0
    return None


def _show_default(value: object, f: FieldInfo) -> str:
    if kind(f) in ("string", "bytes"):
        return f'"{value}"'
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


@rule("FIELD_SAME_DEFAULT", "F P WJ W", "fields keep their default value")
def field_same_default(c: Comparison) -> Iterator[Issue]:
    for p in c.fields:
        repeated = FieldProto.LABEL_REPEATED in (p.old.proto.label, p.new.proto.label)
        if repeated or _type_change(p) is not None or kind(p.new) in ("message", "group"):
            continue
        old, new = _default_value(c.old, p.old), _default_value(c.new, p.new)
        if old != new:
            yield (
                at_field(p.new, (FIELD_DEFAULT,)),
                f"{p.label} changed default value from {_show_default(old, p.old)} "
                f"to {_show_default(new, p.new)}.",
            )


_JSTYPE = descriptor_pb2.FieldOptions.JSType
_FIELD_JSTYPE_OPTION = 6
_FIELD_CTYPE_OPTION = 1


@rule("FIELD_SAME_JSTYPE", "F P", "fields keep their jstype option")
def field_same_jstype(c: Comparison) -> Iterator[Issue]:
    for p in c.fields:
        old, new = p.old.proto.options.jstype, p.new.proto.options.jstype
        if old != new:
            yield (
                at_field(p.new, (FIELD_OPTIONS, _FIELD_JSTYPE_OPTION)),
                f'{p.label} changed option "jstype" from "{_JSTYPE.Name(old)}" '
                f'to "{_JSTYPE.Name(new)}".',
            )


_CPP_STRING_TYPES = {1: "VIEW", 2: "CORD", 3: "STRING"}


def _is_stringish(f: FieldInfo) -> bool:
    return kind(f) in ("string", "bytes")


@rule("FIELD_SAME_CPP_STRING_TYPE", "F P", "string/bytes fields keep their C++ string type")
def field_same_cpp_string_type(c: Comparison) -> Iterator[Issue]:
    for p in c.fields:
        if not (_is_stringish(p.old) and _is_stringish(p.new)):
            continue
        old, new = p.old.features.cpp_string_type, p.new.features.cpp_string_type
        if old != new:
            yield (
                at_field(
                    p.new,
                    (FIELD_OPTIONS, _FIELD_CTYPE_OPTION),
                    (FIELD_OPTIONS, FIELD_FEATURES, CPP_FEATURES_NUMBER, LANGUAGE_STRING_TYPE),
                ),
                f'{p.label} changed C++ string type from "{_CPP_STRING_TYPES.get(old, old)}" '
                f'to "{_CPP_STRING_TYPES.get(new, new)}".',
            )


def _utf8_name(value: int) -> str:
    return "VERIFY" if value == UTF8_VERIFY else "NONE"


def _string_pairs(c: Comparison) -> Iterator[FieldPair]:
    for p in c.fields:
        if kind(p.old) == "string" and kind(p.new) == "string":
            yield p


@rule("FIELD_SAME_UTF8_VALIDATION", "F P", "string fields keep their UTF-8 validation")
def field_same_utf8_validation(c: Comparison) -> Iterator[Issue]:
    for p in _string_pairs(c):
        old, new = p.old.features.utf8_validation, p.new.features.utf8_validation
        if old != new:
            yield (
                at_field(p.new, (FIELD_OPTIONS, FIELD_FEATURES, FEATURE_UTF8_VALIDATION)),
                f"{p.label} changed UTF8 validation from {_utf8_name(old)} to {_utf8_name(new)}.",
            )


def _java_utf8(f: FieldInfo) -> str:
    """What Java generated code checks: VERIFY when Java asks for it, else the field's mode."""
    if f.features.java_utf8_validation == JAVA_UTF8_VERIFY:
        return "VERIFY"
    return _utf8_name(f.features.utf8_validation)


_JAVA_STRING_CHECK_UTF8 = 27


@rule(
    "FIELD_SAME_JAVA_UTF8_VALIDATION",
    "F P",
    "string fields keep the UTF-8 validation of Java generated code",
)
def field_same_java_utf8_validation(c: Comparison) -> Iterator[Issue]:
    for p in _string_pairs(c):
        old, new = _java_utf8(p.old), _java_utf8(p.new)
        if old != new:
            java = (FIELD_OPTIONS, FIELD_FEATURES, JAVA_FEATURES_NUMBER, LANGUAGE_UTF8_VALIDATION)
            option = p.new.file.location((FILE_OPTIONS, _JAVA_STRING_CHECK_UTF8))
            where = Where(p.new.file.name, *option) if option else at_field(p.new, java)
            yield where, f'{p.label} changed Java string UTF8 validation from "{old}" to "{new}".'


# ------------------------------------------------------------------------------------ messages


def _required(m: MessageInfo) -> dict[int, FieldInfo]:
    """Fields declared ``required`` (as buf, by label: editions' LEGACY_REQUIRED is not)."""
    return {n: f for n, f in m.fields.items() if f.proto.label == FieldProto.LABEL_REQUIRED}


_REQUIRED_WHY = (
    "Required fields must always be sent, so if one side does not know about the required "
    "field, this will result in a breakage."
)


@rule("MESSAGE_SAME_REQUIRED_FIELDS", "F P WJ W", "messages keep the same required fields")
def message_same_required_fields(c: Comparison) -> Iterator[Issue]:
    for om, nm in c.messages:
        old, new = _required(om), _required(nm)
        for number in old:
            if number not in new:
                yield (
                    at_message(nm),
                    f'Message "{nm.nested_name}" had required field "{number}" deleted. '
                    + _REQUIRED_WHY,
                )
        for number, f in new.items():
            if number not in old:
                yield (
                    at_field(f),
                    f'Message "{nm.nested_name}" had required field "{number}" added. '
                    + _REQUIRED_WHY,
                )


_JSON_FORMATS = {JSON_ALLOW: "ALLOW", JSON_LEGACY_BEST_EFFORT: "LEGACY_BEST_EFFORT"}


def _json_format_lost(old: int, new: int) -> bool:
    return old == JSON_ALLOW and new == JSON_LEGACY_BEST_EFFORT


@rule("MESSAGE_SAME_JSON_FORMAT", "F P WJ", "messages keep full JSON support")
def message_same_json_format(c: Comparison) -> Iterator[Issue]:
    for om, nm in c.messages:
        old, new = om.features.json_format, nm.features.json_format
        if _json_format_lost(old, new):
            yield (
                at_message(nm, (MSG_OPTIONS, MSG_FEATURES, FEATURE_JSON_FORMAT)),
                f'Message "{nm.nested_name}" JSON format support changed from '
                f"{_JSON_FORMATS[old]} to {_JSON_FORMATS[new]}.",
            )


_NO_STANDARD_DESCRIPTOR_ACCESSOR = 2


@rule(
    "MESSAGE_NO_REMOVE_STANDARD_DESCRIPTOR_ACCESSOR",
    "F P",
    "messages do not turn on no_standard_descriptor_accessor",
)
def message_no_remove_standard_descriptor_accessor(c: Comparison) -> Iterator[Issue]:
    for om, nm in c.messages:
        old = om.proto.options.no_standard_descriptor_accessor
        new = nm.proto.options.no_standard_descriptor_accessor
        if new and not old:
            yield (
                at_message(nm, (MSG_OPTIONS, _NO_STANDARD_DESCRIPTOR_ACCESSOR)),
                'Message option "no_standard_descriptor_accessor" changed from "false" to "true".',
            )


# ------------------------------------------------------------------------------------ enums


@rule("ENUM_SAME_TYPE", "F P", "enums stay open or closed")
def enum_same_type(c: Comparison) -> Iterator[Issue]:
    for oe, ne in c.enums:
        old, new = oe.features.enum_type, ne.features.enum_type
        if old != new:
            name = {ENUM_CLOSED: "closed"}
            yield (
                at_enum(ne, (ENUM_OPTIONS, ENUM_FEATURES, FEATURE_ENUM_TYPE)),
                f'Enum "{ne.nested_name}" changed from {name.get(old, "open")} '
                f"to {name.get(new, 'open')}.",
            )


@rule("ENUM_SAME_JSON_FORMAT", "F P WJ", "enums keep full JSON support")
def enum_same_json_format(c: Comparison) -> Iterator[Issue]:
    for oe, ne in c.enums:
        old, new = oe.features.json_format, ne.features.json_format
        if _json_format_lost(old, new):
            yield (
                at_enum(ne, (ENUM_OPTIONS, ENUM_FEATURES, FEATURE_JSON_FORMAT)),
                f'Enum "{ne.nested_name}" JSON format support changed from '
                f"{_JSON_FORMATS[old]} to {_JSON_FORMATS[new]}.",
            )


@rule("ENUM_VALUE_SAME_NAME", "F P WJ", "enum values keep their names (aliases may be added)")
def enum_value_same_name(c: Comparison) -> Iterator[Issue]:
    for oe, ne in c.enums:
        current = _values_by_number(ne)
        for number, old_names in _values_by_number(oe).items():
            new_names = current.get(number)
            if new_names is None or set(old_names) <= set(new_names):
                continue
            noun = "names" if len(old_names) > 1 and len(new_names) > 1 else "name"
            before = ", ".join(f'"{n}"' for n in sorted(old_names))
            after = ", ".join(f'"{n}"' for n in sorted(new_names))
            message = (
                f'Enum value "{number}" on enum "{ne.nested_name}" changed {noun} '
                f"from {before} to {after}."
            )
            for index, value in enumerate(ne.proto.value):
                if value.number == number:
                    yield at_enum(ne, (ENUM_VALUE, index, VALUE_NUMBER)), message


# ------------------------------------------------------------------------------------ RPCs


def _type(name: str) -> str:
    return name.lstrip(".")


@rule("RPC_SAME_REQUEST_TYPE", "F P WJ W", "RPCs keep their request type")
def rpc_same_request_type(c: Comparison) -> Iterator[Issue]:
    for m in c.methods:
        if m.old.input_type != m.new.input_type:
            yield (
                _loc(m.service.file, (*m.path, METHOD_INPUT), m.path),
                f'{m.label} changed request type from "{_type(m.old.input_type)}" '
                f'to "{_type(m.new.input_type)}".',
            )


@rule("RPC_SAME_RESPONSE_TYPE", "F P WJ W", "RPCs keep their response type")
def rpc_same_response_type(c: Comparison) -> Iterator[Issue]:
    for m in c.methods:
        if m.old.output_type != m.new.output_type:
            yield (
                _loc(m.service.file, (*m.path, METHOD_OUTPUT), m.path),
                f'{m.label} changed response type from "{_type(m.old.output_type)}" '
                f'to "{_type(m.new.output_type)}".',
            )


def _streaming(flag: bool) -> str:
    return "streaming" if flag else "unary"


@rule("RPC_SAME_CLIENT_STREAMING", "F P WJ W", "RPCs keep client streaming on or off")
def rpc_same_client_streaming(c: Comparison) -> Iterator[Issue]:
    for m in c.methods:
        if m.old.client_streaming != m.new.client_streaming:
            yield (
                _loc(m.service.file, m.path),
                f"{m.label} changed from client {_streaming(m.old.client_streaming)} "
                f"to client {_streaming(m.new.client_streaming)}.",
            )


@rule("RPC_SAME_SERVER_STREAMING", "F P WJ W", "RPCs keep server streaming on or off")
def rpc_same_server_streaming(c: Comparison) -> Iterator[Issue]:
    for m in c.methods:
        if m.old.server_streaming != m.new.server_streaming:
            yield (
                _loc(m.service.file, m.path),
                f"{m.label} changed from server {_streaming(m.old.server_streaming)} "
                f"to server {_streaming(m.new.server_streaming)}.",
            )


_IDEMPOTENCY = MethodOptions.IdempotencyLevel
_IDEMPOTENCY_OPTION = 34


@rule("RPC_SAME_IDEMPOTENCY_LEVEL", "F P WJ W", "RPCs keep their idempotency level")
def rpc_same_idempotency_level(c: Comparison) -> Iterator[Issue]:
    for m in c.methods:
        old, new = m.old.options.idempotency_level, m.new.options.idempotency_level
        if old != new:
            yield (
                _loc(m.service.file, (*m.path, METHOD_OPTIONS, _IDEMPOTENCY_OPTION)),
                f'{m.label} changed option "idempotency_level" from "{_IDEMPOTENCY.Name(old)}" '
                f'to "{_IDEMPOTENCY.Name(new)}".',
            )


# ------------------------------------------------------------------------------------ files


@rule("FILE_SAME_PACKAGE", "F P WJ W", "files keep their package")
def file_same_package(c: Comparison) -> Iterator[Issue]:
    for old, new in c.files:
        if old.package != new.package:
            yield (
                _loc(new, (FILE_PACKAGE,)),
                f'File package changed from "{old.package}" to "{new.package}".',
            )


@rule("FILE_SAME_SYNTAX", "F P", "files keep their syntax (proto2, proto3 or editions)")
def file_same_syntax(c: Comparison) -> Iterator[Issue]:
    for old, new in c.files:
        if old.syntax != new.syntax:
            yield (
                _loc(new, (FILE_SYNTAX,), (FILE_EDITION,)),
                f'File syntax changed from "{old.syntax}" to "{new.syntax}".',
            )


def _file_option(c: Comparison, option: str) -> Iterator[Issue]:
    """A file option whose effective value (defaults applied) differs."""
    number = FileOptions.DESCRIPTOR.fields_by_name[option].number
    for old, new in c.files:
        before, after = _option_text(old, option), _option_text(new, option)
        if before != after:
            yield (
                _loc(new, (FILE_OPTIONS, number)),
                f'File option "{option}" changed from "{before}" to "{after}".',
            )


def _option_text(f: FileInfo, option: str) -> str:
    value = getattr(f.proto.options, option)
    if isinstance(value, bool):
        return "true" if value else "false"
    if option == "optimize_for":
        return FileOptions.OptimizeMode.Name(value)
    return str(value)


@rule("FILE_SAME_GO_PACKAGE", "F P", "files keep go_package")
def file_same_go_package(c: Comparison) -> Iterator[Issue]:
    yield from _file_option(c, "go_package")


@rule("FILE_SAME_JAVA_PACKAGE", "F P", "files keep java_package")
def file_same_java_package(c: Comparison) -> Iterator[Issue]:
    yield from _file_option(c, "java_package")


@rule("FILE_SAME_JAVA_OUTER_CLASSNAME", "F P", "files keep java_outer_classname")
def file_same_java_outer_classname(c: Comparison) -> Iterator[Issue]:
    yield from _file_option(c, "java_outer_classname")


@rule("FILE_SAME_JAVA_MULTIPLE_FILES", "F P", "files keep java_multiple_files")
def file_same_java_multiple_files(c: Comparison) -> Iterator[Issue]:
    yield from _file_option(c, "java_multiple_files")


@rule("FILE_SAME_JAVA_GENERIC_SERVICES", "F P", "files keep java_generic_services")
def file_same_java_generic_services(c: Comparison) -> Iterator[Issue]:
    yield from _file_option(c, "java_generic_services")


@rule("FILE_SAME_CC_GENERIC_SERVICES", "F P", "files keep cc_generic_services")
def file_same_cc_generic_services(c: Comparison) -> Iterator[Issue]:
    yield from _file_option(c, "cc_generic_services")


@rule("FILE_SAME_PY_GENERIC_SERVICES", "F P", "files keep py_generic_services")
def file_same_py_generic_services(c: Comparison) -> Iterator[Issue]:
    yield from _file_option(c, "py_generic_services")


@rule("FILE_SAME_CC_ENABLE_ARENAS", "F P", "files keep cc_enable_arenas")
def file_same_cc_enable_arenas(c: Comparison) -> Iterator[Issue]:
    yield from _file_option(c, "cc_enable_arenas")


@rule("FILE_SAME_OPTIMIZE_FOR", "F P", "files keep optimize_for")
def file_same_optimize_for(c: Comparison) -> Iterator[Issue]:
    yield from _file_option(c, "optimize_for")


@rule("FILE_SAME_OBJC_CLASS_PREFIX", "F P", "files keep objc_class_prefix")
def file_same_objc_class_prefix(c: Comparison) -> Iterator[Issue]:
    yield from _file_option(c, "objc_class_prefix")


@rule("FILE_SAME_CSHARP_NAMESPACE", "F P", "files keep csharp_namespace")
def file_same_csharp_namespace(c: Comparison) -> Iterator[Issue]:
    yield from _file_option(c, "csharp_namespace")


@rule("FILE_SAME_SWIFT_PREFIX", "F P", "files keep swift_prefix")
def file_same_swift_prefix(c: Comparison) -> Iterator[Issue]:
    yield from _file_option(c, "swift_prefix")


@rule("FILE_SAME_PHP_CLASS_PREFIX", "F P", "files keep php_class_prefix")
def file_same_php_class_prefix(c: Comparison) -> Iterator[Issue]:
    yield from _file_option(c, "php_class_prefix")


@rule("FILE_SAME_PHP_NAMESPACE", "F P", "files keep php_namespace")
def file_same_php_namespace(c: Comparison) -> Iterator[Issue]:
    yield from _file_option(c, "php_namespace")


@rule("FILE_SAME_PHP_METADATA_NAMESPACE", "F P", "files keep php_metadata_namespace")
def file_same_php_metadata_namespace(c: Comparison) -> Iterator[Issue]:
    yield from _file_option(c, "php_metadata_namespace")


@rule("FILE_SAME_RUBY_PACKAGE", "F P", "files keep ruby_package")
def file_same_ruby_package(c: Comparison) -> Iterator[Issue]:
    yield from _file_option(c, "ruby_package")
