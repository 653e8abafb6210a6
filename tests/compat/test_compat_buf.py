"""Agreement with ``buf breaking``: our verdict and rule ids equal buf's on a mutation corpus.

The corpus starts from the small schema in ``tests/compat/base/`` (two files of one package with
messages, nested types, enums with aliases, oneofs, maps, reserved ranges and names, a service
with unary and streaming RPCs, file options; a proto2 file with required fields, defaults,
extensions and a group; an editions file; a file whose syntax is flipped) and applies one
mutation at a time. Every mutation is checked in both directions — base → mutated and
mutated → base, so each deletion is also an addition, each unsafe change also its reverse — at
every level, by buf 1.75.0 (``buf-bin``) on the directories and by ``smg_grpc_proto.compat`` on
the same directories compiled with protoc. The set of rule ids must be equal (hence the verdict).

Deliberate differences from buf are listed in ``DIFFERENCES`` (also in ``docs/compat.md``) and
asserted as differences, so they cannot silently disappear or grow.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sysconfig
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

from smg_grpc_proto.compat import Finding, check, load_schema
from smg_grpc_proto.compat._model import BUF_CATEGORY, LEVELS, Level
from smg_grpc_proto.compat.rules import RULES

BASE = Path(__file__).parent / "base"
BUF_VERSION = "1.75.0"


# ------------------------------------------------------------------------------------ corpus


@dataclass(frozen=True)
class Edit:
    """Replace ``old`` by ``new`` in ``file`` (exactly one occurrence), create or delete it."""

    file: str
    old: str | None
    new: str | None


def sub(file: str, old: str, new: str) -> Edit:
    return Edit(file, old, new)


def create(file: str, text: str) -> Edit:
    return Edit(file, None, text)


def remove(file: str) -> Edit:
    return Edit(file, None, None)


@dataclass(frozen=True)
class Mutation:
    name: str
    edits: tuple[Edit, ...]

    def apply(self, files: dict[str, str]) -> dict[str, str]:
        out = dict(files)
        for e in self.edits:
            if e.old is None and e.new is None:
                del out[e.file]
            elif e.old is None:
                assert e.new is not None
                out[e.file] = e.new
            else:
                assert e.new is not None
                text = out[e.file]
                assert text.count(e.old) == 1, f"{self.name}: {e.old!r} not unique in {e.file}"
                out[e.file] = text.replace(e.old, e.new)
        return out


def m(name: str, *edits: Edit) -> Mutation:
    return Mutation(name, edits)


T, S, L, ED, FL = (
    "acme/types.proto",
    "acme/service.proto",
    "legacy/legacy.proto",
    "ed/edition.proto",
    "acme/flags.proto",
)

_FLAGS_PROTO2 = """\
// A small proto3 file whose syntax the corpus flips.
syntax = "proto2";

package acme.flags;

message Flag {
  optional string name = 1;
  optional Color color = 2;
  repeated int32 ids = 3;
  optional Flag parent = 4;
}

enum Color {
  COLOR_UNSPECIFIED = 0;
  COLOR_RED = 1;
}
"""

_FLAGS_EDITION = """\
// A small proto3 file whose syntax the corpus flips.
edition = "2023";

package acme.flags;

option features.field_presence = IMPLICIT;

message Flag {
  string name = 1;
  Color color = 2;
  repeated int32 ids = 3;
  Flag parent = 4;
}

enum Color {
  COLOR_UNSPECIFIED = 0;
  COLOR_RED = 1;
}
"""

_ADMIN = """\
syntax = "proto3";

package acme.v1;

import "acme/service.proto";

service Admin {
  rpc Drain(HealthRequest) returns (HealthResponse);
}
"""

_ADMIN_SERVICE = """
service Admin {
  rpc Drain(HealthRequest) returns (HealthResponse);
}
"""

_OPTIONS_MESSAGE = """
message Options {
  int32 max_tokens = 1;
  float temperature = 2;
}
"""

_SERVICES = "\nservice Engine {" + (BASE / S).read_text().split("\nservice Engine {", 1)[1]

_SPARE_ENUM = """
enum Spare {
  SPARE_UNSPECIFIED = 0;
}
"""

_ED_PACKAGE = "package acme.ed;\n"
_ED_CPP = '\nimport "google/protobuf/cpp_features.proto";\n'
_ED_JAVA = '\nimport "google/protobuf/java_features.proto";\n'

MUTATIONS: tuple[Mutation, ...] = (
    # --- files and packages
    m("delete_file", remove(L)),
    m("file_package", sub(L, "package acme.legacy;", "package acme.legacy2;")),
    m(
        "new_file_in_package",
        create(
            "acme/extra.proto",
            'syntax = "proto3";\npackage acme.v1;\nmessage Extra {\n  int32 e = 1;\n}\n',
        ),
    ),
    m(
        "move_message_same_package",
        sub(S, _OPTIONS_MESSAGE, ""),
        sub(
            T,
            "message Unused {",
            "message Options {\n  int32 max_tokens = 1;\n"
            "  float temperature = 2;\n}\n\nmessage Unused {",
        ),
    ),
    m(
        "move_enum_same_package",
        sub(T, _SPARE_ENUM, ""),
        sub(
            S,
            "message HealthRequest {}",
            "enum Spare {\n  SPARE_UNSPECIFIED = 0;\n}\n\nmessage HealthRequest {}",
        ),
    ),
    m("move_service_to_new_file", sub(S, _ADMIN_SERVICE, ""), create("acme/admin.proto", _ADMIN)),
    m("syntax_proto3_to_proto2", sub(FL, (BASE / FL).read_text(), _FLAGS_PROTO2)),
    m("syntax_proto3_to_editions", sub(FL, (BASE / FL).read_text(), _FLAGS_EDITION)),
    m("edition_2023_to_2024", sub(ED, 'edition = "2023";', 'edition = "2024";')),
    # --- file options
    m("go_package", sub(T, '"example.com/acme/v1;acmev1"', '"example.com/acme/v2;acmev1"')),
    m("go_package_removed", sub(S, 'option go_package = "example.com/acme/v1;acmev1";\n', "")),
    m("java_package", sub(T, '"com.example.acme.v1"', '"com.example.acme"')),
    m("java_outer_classname", sub(T, '"TypesProto"', '"Types"')),
    m("java_multiple_files", sub(T, "java_multiple_files = true", "java_multiple_files = false")),
    m(
        "java_generic_services",
        sub(T, "option swift_prefix", "option java_generic_services = true;\noption swift_prefix"),
    ),
    m(
        "cc_generic_services",
        sub(T, "option swift_prefix", "option cc_generic_services = true;\noption swift_prefix"),
    ),
    m(
        "py_generic_services",
        sub(T, "option swift_prefix", "option py_generic_services = true;\noption swift_prefix"),
    ),
    m("cc_enable_arenas", sub(T, "cc_enable_arenas = true", "cc_enable_arenas = false")),
    m("cc_enable_arenas_default", sub(T, "option cc_enable_arenas = true;\n", "")),
    m("optimize_for", sub(T, "optimize_for = SPEED", "optimize_for = CODE_SIZE")),
    m("optimize_for_default", sub(T, "option optimize_for = SPEED;\n", "")),
    m("objc_class_prefix", sub(T, '"AXX"', '"AYY"')),
    m("csharp_namespace", sub(T, '"Acme.V1"', '"Acme.Vone"')),
    m("swift_prefix", sub(T, 'swift_prefix = "AC"', 'swift_prefix = "AD"')),
    m("php_class_prefix", sub(T, 'php_class_prefix = "AC"', 'php_class_prefix = "AD"')),
    m("php_namespace", sub(T, 'php_namespace = "Acme\\\\V1"', 'php_namespace = "Acme\\\\One"')),
    m("php_metadata_namespace", sub(T, '"Acme\\\\V1\\\\Meta"', '"Acme\\\\Meta"')),
    m("ruby_package", sub(T, '"Acme::V1"', '"Acme::One"')),
    m(
        "java_string_check_utf8_proto2",
        sub(
            L,
            "package acme.legacy;\n",
            "package acme.legacy;\n\noption java_string_check_utf8 = true;\n",
        ),
    ),
    m(
        "java_string_check_utf8_proto3",
        sub(
            FL,
            "package acme.flags;\n",
            "package acme.flags;\n\noption java_string_check_utf8 = true;\n",
        ),
    ),
    # --- messages
    m("delete_message", sub(T, "message Unused {\n  int32 x = 1;\n}\n", "")),
    m("rename_message", sub(T, "message Unused {", "message Unused2 {")),
    m("delete_nested_message", sub(T, "  message Scratch {\n    int32 s = 1;\n  }\n", "")),
    m(
        "delete_nested_message_in_use",
        sub(T, "    Inner inner = 2;\n", ""),
        sub(T, "\n    message Inner {\n      int32 depth = 1;\n    }\n", ""),
    ),
    m("delete_enum", sub(T, _SPARE_ENUM, "")),
    m(
        "delete_nested_enum",
        sub(
            T, "  enum Layout {\n    LAYOUT_UNSPECIFIED = 0;\n    LAYOUT_ROW_MAJOR = 1;\n  }\n", ""
        ),
    ),
    m(
        "no_standard_descriptor_accessor",
        sub(L, "no_standard_descriptor_accessor = false", "no_standard_descriptor_accessor = true"),
    ),
    m(
        "message_option_proto3",
        sub(
            T,
            "message Unused {\n",
            "message Unused {\n  option no_standard_descriptor_accessor = true;\n",
        ),
    ),
    # --- fields: deletion and renumbering
    m("delete_field", sub(T, "  string dtype = 3;\n", "")),
    m("delete_field_number_reserved", sub(T, "  string dtype = 3;\n", "  reserved 3;\n")),
    m("delete_field_name_reserved", sub(T, "  string dtype = 3;\n", '  reserved "dtype";\n')),
    m(
        "delete_field_both_reserved",
        sub(T, "  string dtype = 3;\n", '  reserved 3;\n  reserved "dtype";\n'),
    ),
    m("renumber_field", sub(T, "int64 offset = 4;", "int64 offset = 40;")),
    m(
        "swap_field_numbers",
        sub(
            T,
            "  bytes data = 1;\n  repeated uint32 shape = 2;\n",
            "  bytes data = 2;\n  repeated uint32 shape = 1;\n",
        ),
    ),
    m("rename_field", sub(T, "string dtype = 3;", "string dtype_name = 3;")),
    m(
        "rename_field_keep_json",
        sub(T, "string dtype = 3;", 'string d_type = 3 [json_name = "dtype"];'),
    ),
    m("json_name_changed", sub(T, 'json_name = "remark"', 'json_name = "comment"')),
    m("json_name_removed", sub(T, ' [json_name = "remark"]', "")),
    m(
        "reorder_and_comment_only",
        sub(
            T,
            "  bytes data = 1;\n  repeated uint32 shape = 2;\n",
            "  // The dimensions.\n  repeated uint32 shape = 2;\n"
            "  // Raw bytes.\n  bytes data = 1;\n",
        ),
    ),
    # --- field types
    m("int64_to_uint64", sub(T, "int64 offset = 4;", "uint64 offset = 4;")),
    m("int64_to_int32", sub(T, "int64 offset = 4;", "int32 offset = 4;")),
    m("int64_to_sint64", sub(T, "int64 offset = 4;", "sint64 offset = 4;")),
    m("bool_to_uint32", sub(T, "bool packed = 11;", "uint32 packed = 11;")),
    m("float_to_double", sub(T, "float scale = 5;", "double scale = 5;")),
    m("sint32_to_sint64", sub(T, "sint32 delta = 7;", "sint64 delta = 7;")),
    m("fixed32_to_sfixed32", sub(T, "fixed32 crc = 8;", "sfixed32 crc = 8;")),
    m("fixed64_to_double", sub(T, "fixed64 hash = 9;", "double hash = 9;")),
    m("string_to_bytes", sub(T, "string dtype = 3;", "bytes dtype = 3;")),
    m("enum_to_int32", sub(T, "Kind kind = 14;", "int32 kind = 14;")),
    m("enum_to_other_enum", sub(T, "Kind kind = 14;", "Spare kind = 14;")),
    m("message_to_other_message", sub(T, "  Meta meta = 18;", "  Meta.Inner meta = 18;")),
    m("message_to_bytes", sub(T, "  Meta meta = 18;", "  bytes meta = 18;")),
    m(
        "drop_well_known_import",
        sub(S, 'import "google/protobuf/timestamp.proto";\n', ""),
        sub(S, "google.protobuf.Timestamp deadline = 3;", "int64 deadline = 3;"),
    ),
    m("string_to_message", sub(S, "string request_id = 1;", "Options request_id = 1;")),
    m("map_value_type", sub(T, "map<string, int32> labels", "map<string, int64> labels")),
    m("map_key_type", sub(T, "map<string, int32> labels", "map<int32, int32> labels")),
    m(
        "group_to_message",
        sub(
            L,
            "  optional group Item = 8 {\n    optional int32 a = 1;\n  }\n",
            "  optional Item item = 8;\n  message Item {\n    optional int32 a = 1;\n  }\n",
        ),
    ),
    # --- cardinality and presence
    m("repeated_to_singular_string", sub(T, "repeated string tags = 13;", "string tags = 13;")),
    m("repeated_to_singular_message", sub(T, "repeated Meta metas = 19;", "Meta metas = 19;")),
    m("singular_to_repeated_scalar", sub(T, "int64 offset = 4;", "repeated int64 offset = 4;")),
    m("proto3_optional_to_implicit", sub(T, "optional int32 rank = 6;", "int32 rank = 6;")),
    m(
        "map_to_repeated_entry",
        sub(
            T,
            "map<string, int32> labels = 12;",
            "repeated LabelsEntry labels = 12;\n  message LabelsEntry {\n    string key = 1;\n"
            "    int32 value = 2;\n  }",
        ),
    ),
    m(
        "unpacked_repeated",
        sub(T, "repeated uint32 shape = 2;", "repeated uint32 shape = 2 [packed = false];"),
    ),
    m("required_to_optional", sub(L, "required string id = 1;", "optional string id = 1;")),
    m(
        "repeated_to_required",
        sub(L, "repeated int64 values = 5 [packed = true];", "required int64 values = 5;"),
    ),
    m(
        "add_required_field",
        sub(
            L,
            "  optional string plain = 10;\n",
            "  optional string plain = 10;\n  required int32 must = 11;\n",
        ),
    ),
    m(
        "editions_presence",
        sub(ED, "  int32 count = 2 [features.field_presence = IMPLICIT];", "  int32 count = 2;"),
    ),
    m(
        "editions_legacy_required",
        sub(
            ED,
            "  string name = 1;",
            "  string name = 1 [features.field_presence = LEGACY_REQUIRED];",
        ),
    ),
    # --- oneofs
    m(
        "field_into_existing_oneof",
        sub(T, "  bool packed = 11;\n", ""),
        sub(
            T,
            "    Meta meta_payload = 23;\n",
            "    Meta meta_payload = 23;\n    bool packed = 11;\n",
        ),
    ),
    m(
        "field_out_of_oneof",
        sub(T, "    bytes raw = 22;\n", ""),
        sub(T, "  bool packed = 11;\n", "  bool packed = 11;\n  bytes raw = 22;\n"),
    ),
    m(
        "optional_into_new_oneof",
        sub(T, "  optional int32 rank = 6;\n", "  oneof rank_choice {\n    int32 rank = 6;\n  }\n"),
    ),
    m("rename_oneof", sub(T, "oneof payload {", "oneof content {")),
    m(
        "delete_oneof_keep_fields",
        sub(
            T, "  oneof extra {\n    int32 extra_count = 24;\n  }\n", "  int32 extra_count = 24;\n"
        ),
    ),
    m(
        "move_between_oneofs",
        sub(T, "    bytes raw = 22;\n", ""),
        sub(
            T, "    int32 extra_count = 24;\n", "    int32 extra_count = 24;\n    bytes raw = 22;\n"
        ),
    ),
    # --- reserved
    m("reserved_range_shrunk", sub(T, "reserved 20, 30 to 39;", "reserved 20, 30 to 35;")),
    m("reserved_number_deleted", sub(T, "reserved 20, 30 to 39;", "reserved 30 to 39;")),
    m("reserved_name_deleted", sub(T, 'reserved "legacy", "old_name";', 'reserved "legacy";')),
    m("reserved_split", sub(T, "reserved 20, 30 to 39;", "reserved 20, 30 to 34, 35 to 39;")),
    m("enum_reserved_range_deleted", sub(T, "reserved 5, 10 to 12;", "reserved 5;")),
    m("enum_reserved_name_deleted", sub(T, '  reserved "KIND_OLD";\n', "")),
    # --- enum values
    m("delete_enum_value", sub(T, "  KIND_RAGGED = 3;\n", "")),
    m("delete_enum_value_number_reserved", sub(T, "  KIND_RAGGED = 3;\n", "  reserved 3;\n")),
    m(
        "delete_enum_value_name_reserved",
        sub(T, "  KIND_RAGGED = 3;\n", '  reserved "KIND_RAGGED";\n'),
    ),
    m("rename_enum_value", sub(T, "KIND_SPARSE = 2;", "KIND_SCATTERED = 2;")),
    m("delete_alias", sub(T, "  ALIASED_UNO = 1;\n", "")),
    m("replace_alias", sub(T, "ALIASED_UNO = 1;", "ALIASED_UN = 1;")),
    m(
        "enum_closed",
        sub(ED, "enum Shade {", "enum Shade {\n  option features.enum_type = CLOSED;\n"),
    ),
    m(
        "enum_json_legacy",
        sub(
            ED,
            "enum Shade {",
            "enum Shade {\n  option features.json_format = LEGACY_BEST_EFFORT;\n",
        ),
    ),
    m(
        "message_json_legacy",
        sub(
            ED,
            "message Item {",
            "message Item {\n  option features.json_format = LEGACY_BEST_EFFORT;\n",
        ),
    ),
    m(
        "utf8_none",
        sub(ED, "string code = 5;", "string code = 5 [features.utf8_validation = NONE];"),
    ),
    m(
        "editions_cpp_string_type",
        sub(ED, _ED_PACKAGE, _ED_PACKAGE + _ED_CPP),
        sub(ED, "string code = 5;", "string code = 5 [features.(pb.cpp).string_type = CORD];"),
    ),
    m(
        "editions_java_utf8",
        sub(ED, _ED_PACKAGE, _ED_PACKAGE + _ED_JAVA),
        sub(
            ED,
            "string name = 1;",
            "string name = 1 [features.utf8_validation = NONE, "
            "features.(pb.java).utf8_validation = VERIFY];",
        ),
    ),
    m(
        "editions_file_utf8_none",
        sub(ED, _ED_PACKAGE, _ED_PACKAGE + "\noption features.utf8_validation = NONE;\n"),
    ),
    m(
        "delete_aliased_number",
        sub(T, "  option allow_alias = true;\n", ""),
        sub(T, "  ALIASED_ONE = 1;\n  ALIASED_UNO = 1;\n  ALIASED_EINS = 1;\n", ""),
    ),
    m(
        "delete_only_enum_of_package",
        sub(FL, "  Color color = 2;", "  int32 color = 2;"),
        sub(FL, "\nenum Color {\n  COLOR_UNSPECIFIED = 0;\n  COLOR_RED = 1;\n}\n", ""),
    ),
    # --- RPCs and services
    m("delete_service", sub(S, _ADMIN_SERVICE, "")),
    m("delete_all_services", sub(S, _SERVICES, "\n")),
    m(
        "delete_rpc",
        sub(S, "  rpc Chat(stream GenerateRequest) returns (stream GenerateResponse);\n", ""),
    ),
    m("rename_rpc", sub(S, "rpc Chat(", "rpc Converse(")),
    m(
        "rpc_request_type",
        sub(S, "rpc Upload(stream Tensor)", "rpc Upload(stream GenerateRequest)"),
    ),
    m(
        "rpc_response_type",
        sub(
            S,
            "rpc Drain(HealthRequest) returns (HealthResponse)",
            "rpc Drain(HealthRequest) returns (GenerateResponse)",
        ),
    ),
    m("rpc_client_streaming", sub(S, "rpc Upload(stream Tensor)", "rpc Upload(Tensor)")),
    m(
        "rpc_server_streaming",
        sub(
            S,
            "returns (stream GenerateResponse);\n  rpc Health",
            "returns (GenerateResponse);\n  rpc Health",
        ),
    ),
    m("rpc_idempotency", sub(S, "NO_SIDE_EFFECTS", "IDEMPOTENT")),
    m(
        "rpc_idempotency_removed",
        sub(S, " {\n    option idempotency_level = NO_SIDE_EFFECTS;\n  }", ";"),
    ),
    # --- proto2: defaults, extensions
    m("default_changed", sub(L, "[default = 10]", "[default = 11]")),
    m("default_removed", sub(L, ' [default = "none"]', "")),
    m(
        "default_zero_explicit",
        sub(L, "optional bool flag = 6;", "optional bool flag = 6 [default = false];"),
    ),
    m("enum_default_changed", sub(L, "[default = LEVEL_HIGH]", "[default = LEVEL_LOW]")),
    m("double_default_changed", sub(L, "[default = 0.5]", "[default = 0.25]")),
    m(
        "delete_all_extensions",
        sub(
            L,
            "extend Record {\n  optional string ext_note = 100;\n"
            "  optional int32 ext_count = 101;\n}\n",
            "",
        ),
    ),
    m("delete_extension", sub(L, "  optional int32 ext_count = 101;\n", "")),
    m(
        "extension_type",
        sub(L, "optional int32 ext_count = 101;", "optional int64 ext_count = 101;"),
    ),
    m("extension_range_shrunk", sub(L, "extensions 100 to 199;", "extensions 100 to 150;")),
    m("extension_range_deleted", sub(L, "  extensions 500;\n", "")),
    m("jstype_changed", sub(T, "jstype = JS_STRING", "jstype = JS_NUMBER")),
    m("jstype_removed", sub(T, " [jstype = JS_STRING]", "")),
    m("ctype_changed", sub(T, "ctype = CORD", "ctype = STRING_PIECE")),
    m("ctype_removed", sub(T, " [ctype = CORD]", "")),
)

DIRECTIONS = ("forward", "backward")
"""``forward``: current = mutated, reference = base; ``backward``: the reverse change."""

Key = tuple[str, str, Level]
Difference = tuple[frozenset[str], frozenset[str]]


def _well_known_import_dropped(
    name: str, direction: str, *package_rules: str
) -> dict[Key, Difference]:
    """buf counts a file of ``google/protobuf/`` that the current schema no longer imports as
    deleted (``FILE_NO_DELETE``; at package level ``PACKAGE_NO_DELETE`` for its package, or
    ``PACKAGE_MESSAGE_NO_DELETE`` when other imports keep ``google.protobuf`` alive). We never
    report those files: they belong to protobuf, not to the schema, and descriptor sets read
    from generated code (wheels) never contain them."""
    none: frozenset[str] = frozenset()
    return {
        (name, direction, "package"): (none, frozenset(package_rules)),
        (name, direction, "file"): (none, frozenset({"FILE_NO_DELETE"})),
    }


DIFFERENCES: dict[Key, Difference] = {
    **_well_known_import_dropped("drop_well_known_import", "forward", "PACKAGE_NO_DELETE"),
    **_well_known_import_dropped(
        "editions_cpp_string_type", "backward", "PACKAGE_NO_DELETE", "PACKAGE_MESSAGE_NO_DELETE"
    ),
    **_well_known_import_dropped(
        "editions_java_utf8", "backward", "PACKAGE_NO_DELETE", "PACKAGE_MESSAGE_NO_DELETE"
    ),
}
"""Deliberate differences: (mutation, direction, level) → (only ours, only buf) rule ids."""


# ------------------------------------------------------------------------------------ running


def _buf_binary() -> str:
    """The buf executable of the buf-bin wheel (not a pyenv shim: ~0.1 s per call saved)."""
    scripts = Path(sysconfig.get_path("scripts")) / ("buf.exe" if os.name == "nt" else "buf")
    found = str(scripts) if scripts.is_file() else shutil.which("buf")
    if found is None:
        pytest.skip("buf is not installed (pip install buf-bin)")
    return found


def _write(root: Path, files: dict[str, str]) -> Path:
    root.mkdir(parents=True)
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


ALL_CATEGORIES = [BUF_CATEGORY[level] for level in LEVELS]


@dataclass(frozen=True)
class BufFinding:
    rule: str
    path: str | None
    line: int
    column: int


def _buf_findings(
    buf: str, current: Path, against: Path, categories: list[str]
) -> frozenset[BufFinding]:
    config = json.dumps({"version": "v2", "breaking": {"use": categories}})
    result = subprocess.run(
        [
            buf,
            "breaking",
            ".",
            "--against",
            str(against),
            "--config",
            config,
            "--error-format",
            "json",
        ],
        cwd=current,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert result.returncode in (0, 100), f"buf failed on {current}:\n{result.stderr}"
    found = frozenset(
        BufFinding(d["type"], d.get("path"), d.get("start_line", 0), d.get("start_column", 0))
        for d in map(json.loads, result.stdout.splitlines())
    )
    assert (result.returncode == 100) == bool(found)
    return found


def _buf_categories(buf: str) -> dict[str, frozenset[str]]:
    """buf's own rule → categories table (``buf config ls-breaking-rules``)."""
    listing = subprocess.run(
        [buf, "config", "ls-breaking-rules", "--version", "v2", "--format", "json"],
        capture_output=True,
        text=True,
        check=True,
        cwd=BASE,
    )
    rules = map(json.loads, listing.stdout.splitlines())
    return {r["id"]: frozenset(r["categories"]) for r in rules}


@dataclass(frozen=True)
class Outcome:
    ours: frozenset[str]
    buf: frozenset[str]


Case = tuple[str, str]


@dataclass
class Corpus:
    """Every case compiled and checked: our findings per level, buf's findings for all rules."""

    buf: str
    dirs: dict[str, Path]
    schemas: dict[str, descriptor_pb2.FileDescriptorSet]
    cases: dict[Case, tuple[Path, Path]]
    buf_all: dict[Case, frozenset[BufFinding]]
    buf_categories: dict[str, frozenset[str]]

    ours_cache: dict[tuple[Case, Level], list[Finding]] = field(default_factory=dict)

    def ours(self, case: Case, level: Level) -> list[Finding]:
        if (case, level) not in self.ours_cache:
            current, against = self.cases[case]
            found = check(self.schemas[current.name], self.schemas[against.name], level=level)
            self.ours_cache[(case, level)] = found
        return self.ours_cache[(case, level)]

    def buf_at(self, case: Case, level: Level) -> frozenset[str]:
        """buf's rule ids at ``level``: its findings of the rules in that category."""
        category = BUF_CATEGORY[level]
        return frozenset(
            f.rule for f in self.buf_all[case] if category in self.buf_categories[f.rule]
        )

    def outcome(self, case: Case, level: Level) -> Outcome:
        return Outcome(frozenset(f.rule for f in self.ours(case, level)), self.buf_at(case, level))


def _pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Corpus:
    buf = _buf_binary()
    version = subprocess.run([buf, "--version"], capture_output=True, text=True, check=True)
    assert version.stdout.strip() == BUF_VERSION
    root = tmp_path_factory.mktemp("corpus")
    base_files = {
        p.relative_to(BASE).as_posix(): p.read_text() for p in sorted(BASE.rglob("*.proto"))
    }
    dirs = {"base": _write(root / "base", base_files)}
    for mutation in MUTATIONS:
        dirs[mutation.name] = _write(root / mutation.name, mutation.apply(base_files))
    cases: dict[Case, tuple[Path, Path]] = {}
    for mutation in MUTATIONS:
        mutated, base = dirs[mutation.name], dirs["base"]
        cases[(mutation.name, "forward")] = (mutated, base)
        cases[(mutation.name, "backward")] = (base, mutated)
    with _pool() as pool:
        schemas = dict(zip(dirs, pool.map(load_schema, dirs.values()), strict=True))
        found = pool.map(lambda pair: _buf_findings(buf, *pair, ALL_CATEGORIES), cases.values())
        buf_all = dict(zip(cases, found, strict=True))
    return Corpus(buf, dirs, schemas, cases, buf_all, _buf_categories(buf))


def _disagreements(corpus: Corpus, name: str) -> Iterator[str]:
    for direction in DIRECTIONS:
        for level in LEVELS:
            key = (name, direction, level)
            o = corpus.outcome((name, direction), level)
            expected = DIFFERENCES.get(key, (frozenset(), frozenset()))
            actual = (o.ours - o.buf, o.buf - o.ours)
            if actual != expected:
                yield (
                    f"{direction} {level}: only ours {sorted(actual[0])}, only buf "
                    f"{sorted(actual[1])} (documented: {sorted(expected[0])} / "
                    f"{sorted(expected[1])})"
                )


# ------------------------------------------------------------------------------------ tests


def test_corpus_is_large_enough_and_names_are_unique():
    names = [mutation.name for mutation in MUTATIONS]
    assert len(names) == len(set(names))
    assert len(MUTATIONS) >= 60


@pytest.mark.slow
@pytest.mark.parametrize("mutation", MUTATIONS, ids=lambda mutation: mutation.name)
def test_agrees_with_buf(mutation: Mutation, corpus: Corpus):
    problems = list(_disagreements(corpus, mutation.name))
    assert not problems, f"{mutation.name}:\n" + "\n".join(problems)


@pytest.mark.slow
def test_rule_categories_are_bufs(corpus: Corpus):
    """Our 64 rules and their levels are exactly buf's v2 rules and categories (CSR aside)."""
    ours = {r.id: {BUF_CATEGORY[level] for level in r.categories} for r in RULES.values()}
    theirs = {rule: set(cats) - {"CSR"} for rule, cats in corpus.buf_categories.items()}
    assert ours == theirs


SAMPLED = (
    "delete_field",
    "rename_field",
    "int64_to_uint64",
    "delete_rpc",
    "move_message_same_package",
    "delete_enum_value_number_reserved",
    "map_to_repeated_entry",
    "syntax_proto3_to_proto2",
)


@pytest.mark.slow
@pytest.mark.parametrize("name", SAMPLED)
def test_one_buf_run_per_case_equals_one_run_per_level(name: str, corpus: Corpus):
    """The corpus runs buf once per case with all four categories and splits the findings by
    buf's own rule → category table; a real run per level must give the same rule ids."""
    cases = [(name, direction) for direction in DIRECTIONS]
    jobs = [(case, level) for case in cases for level in LEVELS]
    with _pool() as pool:
        runs = pool.map(
            lambda job: _buf_findings(corpus.buf, *corpus.cases[job[0]], [BUF_CATEGORY[job[1]]]),
            jobs,
        )
        for (case, level), found in zip(jobs, runs, strict=True):
            assert frozenset(f.rule for f in found) == corpus.buf_at(case, level), (case, level)


@pytest.mark.slow
def test_every_rule_is_exercised_by_the_corpus(corpus: Corpus):
    """Each implemented rule fires somewhere in the corpus, for us and for buf."""
    ours = {f.rule for case in corpus.cases for lvl in LEVELS for f in corpus.ours(case, lvl)}
    buf = {f.rule for found in corpus.buf_all.values() for f in found}
    assert sorted(set(RULES) - ours) == []
    assert sorted(set(RULES) - buf) == []


SAFE = {
    "reorder_and_comment_only",
    "unpacked_repeated",
    "reserved_split",
    "cc_enable_arenas_default",
    "optimize_for_default",
    "java_string_check_utf8_proto3",  # proto3 strings are verified anyway: Java sees no change
    "default_zero_explicit",  # [default = false] is the implied default
}


@pytest.mark.slow
def test_every_mutation_breaks_something_somewhere_or_is_known_safe(corpus: Corpus):
    """Guards against mutations that silently stopped changing anything."""
    for mutation in MUTATIONS:
        broke = any(corpus.buf_all[(mutation.name, d)] for d in DIRECTIONS)
        assert broke != (mutation.name in SAFE), mutation.name


LOCATION_DIFFERENCES = {
    "FIELD_SAME_DEFAULT": "protoc's source info locates only the default's value, buf the "
    "whole `default = …` option: same line, our column is that of the value",
}


Located = tuple[str, str | None, int, int | None]


def _located(rule: str, file: str | None, line: int | None, column: int | None) -> Located:
    """A finding's place as buf prints it: 1:1 when there is no line; no column for rules
    whose columns differ by design."""
    exact_column = rule not in LOCATION_DIFFERENCES
    return (rule, file, line or 1, (column or 1) if exact_column else None)


def _named(f: Finding, current_files: set[str]) -> str | None:
    unnamed = f.rule in ("FILE_NO_DELETE", "PACKAGE_NO_DELETE") or f.file not in current_files
    return None if unnamed else f.file


@pytest.mark.slow
def test_locations_agree_with_buf(corpus: Corpus):
    """Every finding sits where buf puts it, per case. buf names no file for a deleted file or
    package, nor for an element deleted with its file; we name the reference's file, so those
    names are left out of the comparison."""
    problems = []
    for case in corpus.cases:
        current, _ = corpus.cases[case]
        files = {f.name for f in corpus.schemas[current.name].file}
        ours = {
            _located(f.rule, _named(f, files), f.line, f.column)
            for level in LEVELS
            for f in corpus.ours(case, level)
        }
        documented = {
            rule
            for (name, direction, _), (_, only_buf) in DIFFERENCES.items()
            if (name, direction) == case
            for rule in only_buf
        }
        theirs = {
            _located(f.rule, f.path, f.line, f.column)
            for f in corpus.buf_all[case]
            if not (f.rule in documented and f.path is None)
        }
        if ours != theirs:
            problems.append(
                f"{case}: only ours {sorted(ours - theirs)}, only buf {sorted(theirs - ours)}"
            )
    assert not problems, "\n".join(problems)


@pytest.mark.slow
def test_documented_differences_are_real(corpus: Corpus):
    for (name, direction, level), (only_ours, only_buf) in DIFFERENCES.items():
        o = corpus.outcome((name, direction), level)
        assert (o.ours - o.buf, o.buf - o.ours) == (only_ours, only_buf)
