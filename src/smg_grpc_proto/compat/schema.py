"""An index over a FileDescriptorSet: every element by name, its resolved features and location.

The rules never walk descriptors themselves; they ask this index for files, messages, fields,
enums, services and extensions, each carrying what a comparison needs: full and package-relative
names, the path of the element in its file (for source locations), and the protobuf *features*
resolved through the element's parents (proto2 and proto3 are mapped onto editions' features the
way protoc does, so one set of rules covers the three syntaxes).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal, get_args

from google.protobuf import descriptor_pb2

FieldProto = descriptor_pb2.FieldDescriptorProto
FeatureSet = descriptor_pb2.FeatureSet

_TYPE_NAMES = {value: name[len("TYPE_") :].lower() for name, value in FieldProto.Type.items()}

Path = tuple[int, ...]

WELL_KNOWN_PREFIX = "google/protobuf/"
"""Descriptor files of the well-known types: shipped with protobuf, never the user's schema."""

# Field numbers in descriptor.proto, used to build source-code-info paths.
FILE_PACKAGE, FILE_MESSAGE, FILE_ENUM, FILE_SERVICE, FILE_EXTENSION = 2, 4, 5, 6, 7
FILE_OPTIONS, FILE_SYNTAX, FILE_EDITION = 8, 12, 14
MSG_FIELD, MSG_NESTED, MSG_ENUM, MSG_EXTENSION, MSG_OPTIONS, MSG_ONEOF = 2, 3, 4, 6, 7, 8
ENUM_VALUE, ENUM_OPTIONS = 2, 3
SERVICE_METHOD = 2
FIELD_NAME, FIELD_LABEL, FIELD_TYPE, FIELD_TYPE_NAME = 1, 4, 5, 6
FIELD_DEFAULT, FIELD_OPTIONS, FIELD_JSON_NAME = 7, 8, 10
METHOD_INPUT, METHOD_OUTPUT, METHOD_OPTIONS = 2, 3, 4
VALUE_NAME, VALUE_NUMBER = 1, 2


def _features_number(options: type) -> int:
    number: int = options.DESCRIPTOR.fields_by_name["features"].number  # type: ignore[attr-defined]
    return number


FILE_FEATURES = _features_number(descriptor_pb2.FileOptions)
MSG_FEATURES = _features_number(descriptor_pb2.MessageOptions)
FIELD_FEATURES = _features_number(descriptor_pb2.FieldOptions)
ENUM_FEATURES = _features_number(descriptor_pb2.EnumOptions)
FEATURE_ENUM_TYPE, FEATURE_UTF8_VALIDATION, FEATURE_JSON_FORMAT = 2, 4, 6

EDITION_PROTO2 = descriptor_pb2.EDITION_PROTO2
EDITION_PROTO3 = descriptor_pb2.EDITION_PROTO3
EDITION_2023 = descriptor_pb2.EDITION_2023
EDITION_2024 = descriptor_pb2.EDITION_2024

# FeatureSet enum values (descriptor.proto) and the C++/Java language features.
PRESENCE_EXPLICIT, PRESENCE_IMPLICIT, PRESENCE_LEGACY_REQUIRED = 1, 2, 3
ENUM_OPEN, ENUM_CLOSED = 1, 2
UTF8_VERIFY, UTF8_NONE = 2, 3
ENCODING_LENGTH_PREFIXED, ENCODING_DELIMITED = 1, 2
JSON_ALLOW, JSON_LEGACY_BEST_EFFORT = 1, 2
CPP_VIEW, CPP_CORD, CPP_STRING = 1, 2, 3
JAVA_UTF8_DEFAULT, JAVA_UTF8_VERIFY = 1, 2
CPP_FEATURES_NUMBER, JAVA_FEATURES_NUMBER = 1000, 1001
LANGUAGE_STRING_TYPE, LANGUAGE_UTF8_VALIDATION = 2, 2


@dataclass(frozen=True)
class Features:
    """The features buf's rules look at, resolved for one element."""

    field_presence: int
    enum_type: int
    utf8_validation: int
    message_encoding: int
    json_format: int
    cpp_string_type: int
    java_utf8_validation: int


_LEGACY_DEFAULTS = Features(
    field_presence=PRESENCE_EXPLICIT,
    enum_type=ENUM_CLOSED,
    utf8_validation=UTF8_NONE,
    message_encoding=ENCODING_LENGTH_PREFIXED,
    json_format=JSON_LEGACY_BEST_EFFORT,
    cpp_string_type=CPP_STRING,
    java_utf8_validation=JAVA_UTF8_DEFAULT,
)
_PROTO3_DEFAULTS = dataclasses.replace(
    _LEGACY_DEFAULTS,
    field_presence=PRESENCE_IMPLICIT,
    enum_type=ENUM_OPEN,
    utf8_validation=UTF8_VERIFY,
    json_format=JSON_ALLOW,
)
_2023_DEFAULTS = dataclasses.replace(_PROTO3_DEFAULTS, field_presence=PRESENCE_EXPLICIT)
_2024_DEFAULTS = dataclasses.replace(_2023_DEFAULTS, cpp_string_type=CPP_VIEW)


def edition_defaults(edition: int) -> Features:
    """Feature defaults of an edition (``EDITION_PROTO2`` / ``EDITION_PROTO3`` for the syntaxes)."""
    if edition <= EDITION_PROTO2:
        return _LEGACY_DEFAULTS
    if edition == EDITION_PROTO3:
        return _PROTO3_DEFAULTS
    if edition == EDITION_2023:
        return _2023_DEFAULTS
    return _2024_DEFAULTS


def _varints(data: bytes) -> Iterator[tuple[int, int, bytes | int]]:
    """Top-level ``(number, wire type, value)`` of an encoded message; value: int or bytes."""
    pos, end = 0, len(data)

    def varint() -> int:
        nonlocal pos
        shift = result = 0
        while pos < end:
            byte = data[pos]
            pos += 1
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return result
            shift += 7
        raise ValueError("truncated varint")

    while pos < end:
        tag = varint()
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            yield number, wire, varint()
        elif wire == 2:
            size = varint()
            yield number, wire, data[pos : pos + size]
            pos += size
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        else:  # groups never appear in FeatureSet
            return


def _language_feature(features: FeatureSet, extension: int, number: int) -> int | None:
    """A varint feature of the ``pb.cpp`` / ``pb.java`` FeatureSet extension, if set."""
    try:
        for ext_number, wire, value in _varints(features.SerializeToString()):
            if ext_number == extension and wire == 2 and isinstance(value, bytes):
                for inner, inner_wire, inner_value in _varints(value):
                    if inner == number and inner_wire == 0 and isinstance(inner_value, int):
                        return inner_value
    except ValueError:
        return None
    return None


_CoreFeature = Literal[
    "field_presence", "enum_type", "utf8_validation", "message_encoding", "json_format"
]
_CORE_FEATURES: tuple[_CoreFeature, ...] = get_args(_CoreFeature)


def merge_features(parent: Features, features: FeatureSet) -> Features:
    """``parent`` with the features explicitly set in ``features`` (an element's options)."""
    changes: dict[str, int] = {}
    for name in _CORE_FEATURES:
        if features.HasField(name):
            changes[name] = getattr(features, name)
    cpp = _language_feature(features, CPP_FEATURES_NUMBER, LANGUAGE_STRING_TYPE)
    if cpp:
        changes["cpp_string_type"] = cpp
    java = _language_feature(features, JAVA_FEATURES_NUMBER, LANGUAGE_UTF8_VALIDATION)
    if java:
        changes["java_utf8_validation"] = java
    return dataclasses.replace(parent, **changes) if changes else parent


Options = (
    descriptor_pb2.FileOptions
    | descriptor_pb2.MessageOptions
    | descriptor_pb2.FieldOptions
    | descriptor_pb2.OneofOptions
    | descriptor_pb2.EnumOptions
)


def _options_features(options: Options) -> FeatureSet | None:
    return options.features if options.HasField("features") else None


@dataclass
class FileInfo:
    """One descriptor file."""

    proto: descriptor_pb2.FileDescriptorProto
    features: Features

    @property
    def name(self) -> str:
        return self.proto.name

    @property
    def package(self) -> str:
        return self.proto.package

    @property
    def syntax(self) -> str:
        return self.proto.syntax or "proto2"

    @cached_property
    def locations(self) -> dict[Path, tuple[int, int]]:
        """Path → 1-based (line, column) of the first source location for it (built lazily:
        only files with findings pay for it)."""
        out: dict[Path, tuple[int, int]] = {}
        for loc in self.proto.source_code_info.location:
            key = tuple(loc.path)
            if key not in out and len(loc.span) >= 3:
                out[key] = (loc.span[0] + 1, loc.span[1] + 1)
        return out

    def location(self, path: Path) -> tuple[int, int] | None:
        return self.locations.get(path)


@dataclass
class MessageInfo:
    proto: descriptor_pb2.DescriptorProto
    file: FileInfo
    path: Path
    full_name: str
    parent: MessageInfo | None
    features: Features
    fields: dict[int, FieldInfo] = field(default_factory=dict)
    entry_location: tuple[int, int] | None = None
    """For a map entry, where the map field's ``map<K, V>`` is declared (entries have no source)."""

    @property
    def nested_name(self) -> str:
        """The name relative to the package, e.g. ``Outer.Inner``."""
        package = self.file.package
        return self.full_name[len(package) + 1 :] if package else self.full_name

    @property
    def is_map_entry(self) -> bool:
        return self.proto.options.map_entry

    def oneof_name(self, f: FieldProto) -> str | None:
        """The real (not synthetic proto3-optional) oneof ``f`` belongs to."""
        if f.HasField("oneof_index") and not f.proto3_optional:
            return self.proto.oneof_decl[f.oneof_index].name
        return None

    def real_oneofs(self) -> list[tuple[int, str]]:
        synthetic = {f.oneof_index for f in self.proto.field if f.proto3_optional}
        return [(i, o.name) for i, o in enumerate(self.proto.oneof_decl) if i not in synthetic]


@dataclass
class FieldInfo:
    """A message field or an extension."""

    proto: FieldProto
    file: FileInfo
    path: Path
    message: MessageInfo | None
    """The containing message (for an extension: the message it is declared in, if any)."""
    features: Features
    full_name: str

    @property
    def number(self) -> int:
        return self.proto.number

    @property
    def name(self) -> str:
        return self.proto.name

    @property
    def is_extension(self) -> bool:
        return self.proto.HasField("extendee")

    @cached_property
    def kind(self) -> str:
        """buf's name for the type: ``int32``, ``string``, ``enum``, ``message``, ``group``…"""
        if self.proto.type == FieldProto.TYPE_MESSAGE and (
            self.features.message_encoding == ENCODING_DELIMITED
        ):
            return "group"
        return _TYPE_NAMES[self.proto.type]


@dataclass
class EnumInfo:
    proto: descriptor_pb2.EnumDescriptorProto
    file: FileInfo
    path: Path
    full_name: str
    parent: MessageInfo | None
    features: Features

    @property
    def nested_name(self) -> str:
        package = self.file.package
        return self.full_name[len(package) + 1 :] if package else self.full_name


@dataclass
class ServiceInfo:
    proto: descriptor_pb2.ServiceDescriptorProto
    file: FileInfo
    path: Path
    full_name: str

    @property
    def nested_name(self) -> str:
        return self.proto.name


def _join(scope: str, name: str) -> str:
    return f"{scope}.{name}" if scope else name


def _file_features(fdp: descriptor_pb2.FileDescriptorProto) -> Features:
    syntax = fdp.syntax or "proto2"
    if syntax == "editions":
        base = edition_defaults(fdp.edition)
        explicit = _options_features(fdp.options)
        return merge_features(base, explicit) if explicit is not None else base
    base = edition_defaults(EDITION_PROTO3 if syntax == "proto3" else EDITION_PROTO2)
    if fdp.options.java_string_check_utf8:
        base = dataclasses.replace(base, java_utf8_validation=JAVA_UTF8_VERIFY)
    return base


_CTYPE_TO_STRING_TYPE = {
    descriptor_pb2.FieldOptions.STRING: CPP_STRING,
    descriptor_pb2.FieldOptions.CORD: CPP_CORD,
    descriptor_pb2.FieldOptions.STRING_PIECE: CPP_VIEW,
}


def _field_features(parent: Features, f: FieldProto, file: FileInfo) -> Features:
    features = parent
    if file.syntax == "editions":
        explicit = _options_features(f.options)
        if explicit is not None:
            features = merge_features(features, explicit)
    else:
        if f.label == FieldProto.LABEL_REQUIRED:
            features = dataclasses.replace(features, field_presence=PRESENCE_LEGACY_REQUIRED)
        if f.type == FieldProto.TYPE_GROUP:
            features = dataclasses.replace(features, message_encoding=ENCODING_DELIMITED)
    if f.options.HasField("ctype"):
        features = dataclasses.replace(
            features, cpp_string_type=_CTYPE_TO_STRING_TYPE.get(f.options.ctype, CPP_STRING)
        )
    return features


def _scoped_features(parent: Features, options: Options, file: FileInfo) -> Features:
    if file.syntax != "editions":
        return parent
    explicit = _options_features(options)
    return merge_features(parent, explicit) if explicit is not None else parent


class Schema:
    """Every element of a FileDescriptorSet, by full name (no leading dot)."""

    def __init__(self, fds: descriptor_pb2.FileDescriptorSet) -> None:
        self.files: dict[str, FileInfo] = {}
        self.messages: dict[str, MessageInfo] = {}
        self.enums: dict[str, EnumInfo] = {}
        self.services: dict[str, ServiceInfo] = {}
        self.extensions: dict[str, FieldInfo] = {}
        for fdp in fds.file:
            if fdp.name not in self.files:
                self._add_file(fdp)
        for message in self.messages.values():
            self._link_map_entries(message)

    # ----------------------------------------------------------------------------- building

    def _add_file(self, fdp: descriptor_pb2.FileDescriptorProto) -> None:
        info = FileInfo(proto=fdp, features=_file_features(fdp))
        self.files[fdp.name] = info
        scope = fdp.package
        for i, msg in enumerate(fdp.message_type):
            self._add_message(msg, info, (FILE_MESSAGE, i), scope, None, info.features)
        for i, enum in enumerate(fdp.enum_type):
            self._add_enum(enum, info, (FILE_ENUM, i), scope, None, info.features)
        for i, svc in enumerate(fdp.service):
            full = _join(scope, svc.name)
            self.services[full] = ServiceInfo(svc, info, (FILE_SERVICE, i), full)
        for i, ext in enumerate(fdp.extension):
            self._add_extension(ext, info, (FILE_EXTENSION, i), scope, None, info.features)

    def _add_message(
        self,
        msg: descriptor_pb2.DescriptorProto,
        file: FileInfo,
        path: Path,
        scope: str,
        parent: MessageInfo | None,
        parent_features: Features,
    ) -> None:
        full = _join(scope, msg.name)
        features = _scoped_features(parent_features, msg.options, file)
        info = MessageInfo(msg, file, path, full, parent, features)
        self.messages[full] = info
        for i, f in enumerate(msg.field):
            scope_features = features
            if f.HasField("oneof_index") and f.oneof_index < len(msg.oneof_decl):
                oneof = msg.oneof_decl[f.oneof_index]
                scope_features = _scoped_features(features, oneof.options, file)
            info.fields[f.number] = FieldInfo(
                f,
                file,
                (*path, MSG_FIELD, i),
                info,
                _field_features(scope_features, f, file),
                _join(full, f.name),
            )
        for i, nested in enumerate(msg.nested_type):
            self._add_message(nested, file, (*path, MSG_NESTED, i), full, info, features)
        for i, enum in enumerate(msg.enum_type):
            self._add_enum(enum, file, (*path, MSG_ENUM, i), full, info, features)
        for i, ext in enumerate(msg.extension):
            self._add_extension(ext, file, (*path, MSG_EXTENSION, i), full, info, features)

    def _add_enum(
        self,
        enum: descriptor_pb2.EnumDescriptorProto,
        file: FileInfo,
        path: Path,
        scope: str,
        parent: MessageInfo | None,
        parent_features: Features,
    ) -> None:
        full = _join(scope, enum.name)
        features = _scoped_features(parent_features, enum.options, file)
        self.enums[full] = EnumInfo(enum, file, path, full, parent, features)

    def _add_extension(
        self,
        ext: FieldProto,
        file: FileInfo,
        path: Path,
        scope: str,
        parent: MessageInfo | None,
        parent_features: Features,
    ) -> None:
        full = _join(scope, ext.name)
        features = _field_features(parent_features, ext, file)
        self.extensions[full] = FieldInfo(ext, file, path, parent, features, full)

    def _link_map_entries(self, message: MessageInfo) -> None:
        for f in message.fields.values():
            entry = self.message_type(f.proto)
            if entry is not None and entry.is_map_entry and entry.parent is message:
                where = message.file.location((*f.path, FIELD_TYPE_NAME))
                entry.entry_location = where or message.file.location(f.path)

    # ----------------------------------------------------------------------------- queries

    def message_type(self, f: FieldProto) -> MessageInfo | None:
        """The message a message-typed field refers to, if it is in this schema."""
        if f.type in (FieldProto.TYPE_MESSAGE, FieldProto.TYPE_GROUP):
            return self.messages.get(f.type_name.lstrip("."))
        return None

    def enum_type(self, f: FieldProto) -> EnumInfo | None:
        if f.type == FieldProto.TYPE_ENUM:
            return self.enums.get(f.type_name.lstrip("."))
        return None

    @cached_property
    def packages(self) -> dict[str, list[FileInfo]]:
        """Package name → its files, in descriptor-set order."""
        out: dict[str, list[FileInfo]] = {}
        for info in self.files.values():
            out.setdefault(info.package, []).append(info)
        return out

    def file_messages(self, file: str) -> dict[str, MessageInfo]:
        """Messages declared in ``file``, by package-relative name."""
        return self._per_file_messages.get(file, {})

    def file_enums(self, file: str) -> dict[str, EnumInfo]:
        return self._per_file_enums.get(file, {})

    def file_services(self, file: str) -> dict[str, ServiceInfo]:
        return self._per_file_services.get(file, {})

    def file_extensions(self, file: str) -> dict[str, FieldInfo]:
        return self._per_file_extensions.get(file, {})

    @cached_property
    def _per_file_messages(self) -> dict[str, dict[str, MessageInfo]]:
        out: dict[str, dict[str, MessageInfo]] = {}
        for m in self.messages.values():
            out.setdefault(m.file.name, {})[m.nested_name] = m
        return out

    @cached_property
    def _per_file_enums(self) -> dict[str, dict[str, EnumInfo]]:
        out: dict[str, dict[str, EnumInfo]] = {}
        for e in self.enums.values():
            out.setdefault(e.file.name, {})[e.nested_name] = e
        return out

    @cached_property
    def _per_file_services(self) -> dict[str, dict[str, ServiceInfo]]:
        out: dict[str, dict[str, ServiceInfo]] = {}
        for s in self.services.values():
            out.setdefault(s.file.name, {})[s.nested_name] = s
        return out

    @cached_property
    def _per_file_extensions(self) -> dict[str, dict[str, FieldInfo]]:
        out: dict[str, dict[str, FieldInfo]] = {}
        for x in self.extensions.values():
            package = x.file.package
            relative = x.full_name[len(package) + 1 :] if package else x.full_name
            out.setdefault(x.file.name, {})[relative] = x
        return out


def is_well_known(file_name: str) -> bool:
    """True for the well-known types' files (``google/protobuf/*.proto``)."""
    return file_name.startswith(WELL_KNOWN_PREFIX)
