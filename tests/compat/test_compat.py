"""``smg_grpc_proto.compat`` and ``smg-proto compat``: rules, loaders, config, output, exit codes.

Everything runs for real: schemas are compiled with protoc (grpcio-tools), wheels are real zip
files (or the published 0.4.28 wheel), requirements go through pip and the wheel cache, git
revisions come from a scratch repository. The agreement with ``buf breaking`` itself lives in
``tests/compat/test_compat_buf.py``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2, json_format
from support.upstream import UPSTREAM_VERSION, upstream_package, upstream_wheel

import smg_grpc_proto
from smg_grpc_proto import cli
from smg_grpc_proto.compat import (
    CompatError,
    Finding,
    additions,
    check,
    current_schema,
    load_schema,
)
from smg_grpc_proto.compat._model import LEVELS, Level
from smg_grpc_proto.compat.config import CompatConfig, load_config
from smg_grpc_proto.compat.report import Report, render
from smg_grpc_proto.compat.rules import RULES

ROOT = Path(__file__).resolve().parents[2]
PROTOS = ROOT / "protos"
FDS = descriptor_pb2.FileDescriptorSet

P3 = 'syntax = "proto3";\npackage t;\n'
P2 = 'syntax = "proto2";\npackage t;\n'
ED = 'edition = "2023";\npackage t;\n'

Files = dict[str, str]


# ------------------------------------------------------------------------------------ helpers


def _write(root: Path, files: Files) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


class Compiler:
    """Compiles file sets with protoc once each (keyed by content), in parallel on demand."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.cache: dict[tuple[tuple[str, str], ...], FDS] = {}
        self.count = 0

    def folder(self, files: Files) -> Path:
        self.count += 1
        return _write(self.root / f"s{self.count}", files)

    def key(self, files: Files) -> tuple[tuple[str, str], ...]:
        return tuple(sorted(files.items()))

    def __call__(self, files: Files) -> FDS:
        key = self.key(files)
        if key not in self.cache:
            self.cache[key] = load_schema(self.folder(files))
        return self.cache[key]

    def warm(self, many: list[Files]) -> None:
        todo = {self.key(f): f for f in many if self.key(f) not in self.cache}
        with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
            folders = [self.folder(files) for files in todo.values()]
            for key, fds in zip(todo, pool.map(load_schema, folders), strict=True):
                self.cache[key] = fds


@pytest.fixture(scope="module")
def compile_(tmp_path_factory: pytest.TempPathFactory) -> Compiler:
    return Compiler(tmp_path_factory.mktemp("schemas"))


def rules_of(findings: list[Finding]) -> set[str]:
    return {f.rule for f in findings}


def run_cli(*args: str, cwd: Path | None = None) -> tuple[int, str, str]:
    """``smg-proto`` in a subprocess (``python -m smg_grpc_proto.cli``), like a user runs it."""
    env = dict(os.environ)
    package_parent = str(Path(smg_grpc_proto.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_parent, env.get("PYTHONPATH")]))
    result = subprocess.run(
        [sys.executable, "-m", "smg_grpc_proto.cli", *args],
        cwd=cwd or ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    return result.returncode, result.stdout, result.stderr


def main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``smg-proto`` in-process through ``cli.main``."""
    code = cli.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


# ------------------------------------------------------------------------------------ rules

# One row per rule: the loosest level that runs it, a reference schema and a current schema.
RULE_CASES: dict[str, tuple[Files, Files]] = {
    "FILE_NO_DELETE": (
        {"a.proto": P3 + "message A {}\n", "b.proto": P3 + "message B {}\n"},
        {"a.proto": P3 + "message A {}\n"},
    ),
    "PACKAGE_NO_DELETE": (
        {"a.proto": P3 + "message A {}\n", "b.proto": 'syntax = "proto3";\npackage u;\n'},
        {"a.proto": P3 + "message A {}\n"},
    ),
    "MESSAGE_NO_DELETE": (
        {"a.proto": P3 + "message A {}\nmessage B {}\n"},
        {"a.proto": P3 + "message A {}\n"},
    ),
    "ENUM_NO_DELETE": (
        {"a.proto": P3 + "enum E { E0 = 0; }\nmessage A {}\n"},
        {"a.proto": P3 + "message A {}\n"},
    ),
    "SERVICE_NO_DELETE": (
        {"a.proto": P3 + "message A {}\nservice S { rpc R(A) returns (A); }\n"},
        {"a.proto": P3 + "message A {}\n"},
    ),
    "EXTENSION_NO_DELETE": (
        {
            "a.proto": P2
            + "message A { extensions 10 to 20; }\nextend A { optional int32 x = 10; }\n"
        },
        {"a.proto": P2 + "message A { extensions 10 to 20; }\n"},
    ),
    "PACKAGE_MESSAGE_NO_DELETE": (
        {"a.proto": P3 + "message A {}\nmessage B {}\n"},
        {"a.proto": P3 + "message A {}\n"},
    ),
    "PACKAGE_ENUM_NO_DELETE": (
        {"a.proto": P3 + "enum E { E0 = 0; }\nenum F { F0 = 0; }\n"},
        {"a.proto": P3 + "enum E { E0 = 0; }\n"},
    ),
    "PACKAGE_SERVICE_NO_DELETE": (
        {"a.proto": P3 + "message A {}\nservice S { rpc R(A) returns (A); }\n"},
        {"a.proto": P3 + "message A {}\n"},
    ),
    "PACKAGE_EXTENSION_NO_DELETE": (
        {
            "a.proto": P2 + "message A { extensions 10 to 20; }\n"
            "extend A { optional int32 x = 10; optional int32 y = 11; }\n"
        },
        {
            "a.proto": P2
            + "message A { extensions 10 to 20; }\nextend A { optional int32 x = 10; }\n"
        },
    ),
    "FIELD_NO_DELETE": (
        {"a.proto": P3 + "message A { int32 x = 1; int32 y = 2; }\n"},
        {"a.proto": P3 + 'message A { int32 x = 1; reserved 2; reserved "y"; }\n'},
    ),
    "FIELD_NO_DELETE_UNLESS_NUMBER_RESERVED": (
        {"a.proto": P3 + "message A { int32 x = 1; int32 y = 2; }\n"},
        {"a.proto": P3 + "message A { int32 x = 1; }\n"},
    ),
    "FIELD_NO_DELETE_UNLESS_NAME_RESERVED": (
        {"a.proto": P3 + "message A { int32 x = 1; int32 y = 2; }\n"},
        {"a.proto": P3 + "message A { int32 x = 1; reserved 2; }\n"},
    ),
    "ONEOF_NO_DELETE": (
        {"a.proto": P3 + "message A { oneof o { int32 x = 1; } }\n"},
        {"a.proto": P3 + "message A { oneof p { int32 x = 1; } }\n"},
    ),
    "ENUM_VALUE_NO_DELETE": (
        {"a.proto": P3 + "enum E { E0 = 0; E1 = 1; }\n"},
        {"a.proto": P3 + 'enum E { E0 = 0; reserved 1; reserved "E1"; }\n'},
    ),
    "ENUM_VALUE_NO_DELETE_UNLESS_NUMBER_RESERVED": (
        {"a.proto": P3 + "enum E { E0 = 0; E1 = 1; }\n"},
        {"a.proto": P3 + "enum E { E0 = 0; }\n"},
    ),
    "ENUM_VALUE_NO_DELETE_UNLESS_NAME_RESERVED": (
        {"a.proto": P3 + "enum E { E0 = 0; E1 = 1; }\n"},
        {"a.proto": P3 + "enum E { E0 = 0; reserved 1; }\n"},
    ),
    "RPC_NO_DELETE": (
        {
            "a.proto": P3
            + "message A {}\nservice S { rpc R(A) returns (A); rpc Q(A) returns (A); }\n"
        },
        {"a.proto": P3 + "message A {}\nservice S { rpc R(A) returns (A); }\n"},
    ),
    "RESERVED_MESSAGE_NO_DELETE": (
        {"a.proto": P3 + "message A { reserved 5 to 9; }\n"},
        {"a.proto": P3 + "message A { reserved 5 to 7; }\n"},
    ),
    "RESERVED_ENUM_NO_DELETE": (
        {"a.proto": P3 + 'enum E { E0 = 0; reserved "OLD"; }\n'},
        {"a.proto": P3 + "enum E { E0 = 0; }\n"},
    ),
    "EXTENSION_MESSAGE_NO_DELETE": (
        {"a.proto": P2 + "message A { extensions 10 to 20; }\n"},
        {"a.proto": P2 + "message A { extensions 10 to 15; }\n"},
    ),
    "FIELD_SAME_TYPE": (
        {"a.proto": P3 + "message A { int64 x = 1; }\n"},
        {"a.proto": P3 + "message A { uint64 x = 1; }\n"},
    ),
    "FIELD_WIRE_COMPATIBLE_TYPE": (
        {"a.proto": P3 + "message A { float x = 1; }\n"},
        {"a.proto": P3 + "message A { double x = 1; }\n"},
    ),
    "FIELD_WIRE_JSON_COMPATIBLE_TYPE": (
        {"a.proto": P3 + "message A { int32 x = 1; }\n"},
        {"a.proto": P3 + "message A { int64 x = 1; }\n"},
    ),
    "FIELD_SAME_CARDINALITY": (
        {"a.proto": P3 + "message A { optional int32 x = 1; }\n"},
        {"a.proto": P3 + "message A { int32 x = 1; }\n"},
    ),
    "FIELD_WIRE_COMPATIBLE_CARDINALITY": (
        {"a.proto": P3 + "message A { repeated string x = 1; }\n"},
        {"a.proto": P3 + "message A { string x = 1; }\n"},
    ),
    "FIELD_WIRE_JSON_COMPATIBLE_CARDINALITY": (
        {"a.proto": P3 + "message A { map<string, int32> x = 1; }\n"},
        {
            "a.proto": P3 + "message A { repeated XEntry x = 1;\n"
            "  message XEntry { string key = 1; int32 value = 2; } }\n"
        },
    ),
    "FIELD_SAME_ONEOF": (
        {"a.proto": P3 + "message A { oneof o { int32 x = 1; int32 y = 2; } }\n"},
        {"a.proto": P3 + "message A { oneof o { int32 x = 1; } int32 y = 2; }\n"},
    ),
    "FIELD_SAME_NAME": (
        {"a.proto": P3 + "message A { int32 x = 1; }\n"},
        {"a.proto": P3 + 'message A { int32 y = 1 [json_name = "x"]; }\n'},
    ),
    "FIELD_SAME_JSON_NAME": (
        {"a.proto": P3 + "message A { int32 x = 1; }\n"},
        {"a.proto": P3 + 'message A { int32 x = 1 [json_name = "ex"]; }\n'},
    ),
    "FIELD_SAME_DEFAULT": (
        {"a.proto": P2 + "message A { optional int32 x = 1 [default = 3]; }\n"},
        {"a.proto": P2 + "message A { optional int32 x = 1 [default = 4]; }\n"},
    ),
    "FIELD_SAME_JSTYPE": (
        {"a.proto": P3 + "message A { int64 x = 1; }\n"},
        {"a.proto": P3 + "message A { int64 x = 1 [jstype = JS_STRING]; }\n"},
    ),
    "FIELD_SAME_CPP_STRING_TYPE": (
        {"a.proto": P3 + "message A { string x = 1; }\n"},
        {"a.proto": P3 + "message A { string x = 1 [ctype = CORD]; }\n"},
    ),
    "FIELD_SAME_UTF8_VALIDATION": (
        {"a.proto": ED + "message A { string x = 1; }\n"},
        {"a.proto": ED + "message A { string x = 1 [features.utf8_validation = NONE]; }\n"},
    ),
    "FIELD_SAME_JAVA_UTF8_VALIDATION": (
        {"a.proto": P2 + "message A { optional string x = 1; }\n"},
        {
            "a.proto": P2 + "option java_string_check_utf8 = true;\n"
            "message A { optional string x = 1; }\n"
        },
    ),
    "MESSAGE_SAME_REQUIRED_FIELDS": (
        {"a.proto": P2 + "message A { optional int32 x = 1; }\n"},
        {"a.proto": P2 + "message A { optional int32 x = 1; required int32 y = 2; }\n"},
    ),
    "MESSAGE_SAME_JSON_FORMAT": (
        {"a.proto": ED + "message A {}\n"},
        {"a.proto": ED + "message A { option features.json_format = LEGACY_BEST_EFFORT; }\n"},
    ),
    "MESSAGE_NO_REMOVE_STANDARD_DESCRIPTOR_ACCESSOR": (
        {"a.proto": P3 + "message A {}\n"},
        {"a.proto": P3 + "message A { option no_standard_descriptor_accessor = true; }\n"},
    ),
    "ENUM_SAME_TYPE": (
        {"a.proto": ED + "enum E { E0 = 0; }\n"},
        {"a.proto": ED + "enum E { option features.enum_type = CLOSED; E0 = 0; }\n"},
    ),
    "ENUM_SAME_JSON_FORMAT": (
        {"a.proto": ED + "enum E { E0 = 0; }\n"},
        {"a.proto": ED + "enum E { option features.json_format = LEGACY_BEST_EFFORT; E0 = 0; }\n"},
    ),
    "ENUM_VALUE_SAME_NAME": (
        {"a.proto": P3 + "enum E { E0 = 0; E1 = 1; }\n"},
        {"a.proto": P3 + "enum E { E0 = 0; EONE = 1; }\n"},
    ),
    "RPC_SAME_REQUEST_TYPE": (
        {"a.proto": P3 + "message A {}\nmessage B {}\nservice S { rpc R(A) returns (A); }\n"},
        {"a.proto": P3 + "message A {}\nmessage B {}\nservice S { rpc R(B) returns (A); }\n"},
    ),
    "RPC_SAME_RESPONSE_TYPE": (
        {"a.proto": P3 + "message A {}\nmessage B {}\nservice S { rpc R(A) returns (A); }\n"},
        {"a.proto": P3 + "message A {}\nmessage B {}\nservice S { rpc R(A) returns (B); }\n"},
    ),
    "RPC_SAME_CLIENT_STREAMING": (
        {"a.proto": P3 + "message A {}\nservice S { rpc R(A) returns (A); }\n"},
        {"a.proto": P3 + "message A {}\nservice S { rpc R(stream A) returns (A); }\n"},
    ),
    "RPC_SAME_SERVER_STREAMING": (
        {"a.proto": P3 + "message A {}\nservice S { rpc R(A) returns (stream A); }\n"},
        {"a.proto": P3 + "message A {}\nservice S { rpc R(A) returns (A); }\n"},
    ),
    "RPC_SAME_IDEMPOTENCY_LEVEL": (
        {"a.proto": P3 + "message A {}\nservice S { rpc R(A) returns (A); }\n"},
        {
            "a.proto": P3 + "message A {}\nservice S { rpc R(A) returns (A) "
            "{ option idempotency_level = IDEMPOTENT; } }\n"
        },
    ),
    "FILE_SAME_PACKAGE": (
        {"a.proto": P3 + "message A {}\n"},
        {"a.proto": 'syntax = "proto3";\npackage u;\nmessage A {}\n'},
    ),
    "FILE_SAME_SYNTAX": (
        {"a.proto": P3 + "message A {}\n"},
        {"a.proto": P2 + "message A {}\n"},
    ),
}

_FILE_OPTIONS = {
    "FILE_SAME_GO_PACKAGE": ('go_package = "a/b"', 'go_package = "a/c"'),
    "FILE_SAME_JAVA_PACKAGE": ('java_package = "a.b"', 'java_package = "a.c"'),
    "FILE_SAME_JAVA_OUTER_CLASSNAME": ('java_outer_classname = "A"', 'java_outer_classname = "B"'),
    "FILE_SAME_JAVA_MULTIPLE_FILES": ("java_multiple_files = false", "java_multiple_files = true"),
    "FILE_SAME_JAVA_GENERIC_SERVICES": (
        "java_generic_services = false",
        "java_generic_services = true",
    ),
    "FILE_SAME_CC_GENERIC_SERVICES": ("cc_generic_services = false", "cc_generic_services = true"),
    "FILE_SAME_PY_GENERIC_SERVICES": ("py_generic_services = false", "py_generic_services = true"),
    "FILE_SAME_CC_ENABLE_ARENAS": ("cc_enable_arenas = true", "cc_enable_arenas = false"),
    "FILE_SAME_OPTIMIZE_FOR": ("optimize_for = SPEED", "optimize_for = LITE_RUNTIME"),
    "FILE_SAME_OBJC_CLASS_PREFIX": ('objc_class_prefix = "AB"', 'objc_class_prefix = "AC"'),
    "FILE_SAME_CSHARP_NAMESPACE": ('csharp_namespace = "A.B"', 'csharp_namespace = "A.C"'),
    "FILE_SAME_SWIFT_PREFIX": ('swift_prefix = "AB"', 'swift_prefix = "AC"'),
    "FILE_SAME_PHP_CLASS_PREFIX": ('php_class_prefix = "AB"', 'php_class_prefix = "AC"'),
    "FILE_SAME_PHP_NAMESPACE": ('php_namespace = "A"', 'php_namespace = "B"'),
    "FILE_SAME_PHP_METADATA_NAMESPACE": (
        'php_metadata_namespace = "A"',
        'php_metadata_namespace = "B"',
    ),
    "FILE_SAME_RUBY_PACKAGE": ('ruby_package = "A"', 'ruby_package = "B"'),
}
for _rule, (_before, _after) in _FILE_OPTIONS.items():
    RULE_CASES[_rule] = (
        {"a.proto": P3 + f"option {_before};\nmessage A {{}}\n"},
        {"a.proto": P3 + f"option {_after};\nmessage A {{}}\n"},
    )

# Rules that have no location by design (like buf): a deleted file/package, a top-level element
# deleted from a file, an option removed from a method.
UNLOCATED = {
    "FILE_NO_DELETE",
    "PACKAGE_NO_DELETE",
    "MESSAGE_NO_DELETE",
    "ENUM_NO_DELETE",
    "SERVICE_NO_DELETE",
    "EXTENSION_NO_DELETE",
    "PACKAGE_MESSAGE_NO_DELETE",
    "PACKAGE_ENUM_NO_DELETE",
    "PACKAGE_SERVICE_NO_DELETE",
    "PACKAGE_EXTENSION_NO_DELETE",
}


@pytest.fixture(scope="module")
def rule_schemas(compile_: Compiler) -> Compiler:
    compile_.warm([files for pair in RULE_CASES.values() for files in pair])
    return compile_


def test_every_rule_has_a_case():
    assert sorted(RULE_CASES) == sorted(RULES)
    assert len(RULES) == 64


@pytest.mark.slow
@pytest.mark.parametrize("rule_id", sorted(RULE_CASES))
def test_rule(rule_id: str, rule_schemas: Compiler):
    """The rule fires at exactly the levels whose buf category contains it, located."""
    before, after = RULE_CASES[rule_id]
    old, new = rule_schemas(before), rule_schemas(after)
    for level in LEVELS:
        found = [f for f in check(new, old, level=level) if f.rule == rule_id]
        assert bool(found) == (level in RULES[rule_id].categories), (level, found)
        for f in found:
            assert f.message.endswith("."), f
            if rule_id not in UNLOCATED:
                assert f.file == "a.proto"
                assert f.line is not None, f
                assert f.column is not None, f


SAFE_CASES: list[tuple[str, Level, Files, Files]] = [
    (
        "field, message, enum value, rpc and oneof added",
        "file",
        {
            "a.proto": P3 + "enum E { E0 = 0; }\nmessage A { int32 x = 1; }\n"
            "service S { rpc R(A) returns (A); }\n"
        },
        {
            "a.proto": P3 + "enum E { E0 = 0; E1 = 1; }\nmessage A { int32 x = 1; "
            "oneof o { int32 y = 2; } }\nmessage B {}\n"
            "service S { rpc R(A) returns (A); rpc Q(A) returns (B); }\n"
        },
    ),
    (
        "fields reordered, comments changed",
        "file",
        {"a.proto": P3 + "// old\nmessage A {\n  int32 x = 1;\n  string y = 2;\n}\n"},
        {
            "a.proto": P3
            + "// new\nmessage A {\n  // y\n  string y = 2;\n  // x\n  int32 x = 1;\n}\n"
        },
    ),
    (
        "field deleted with number and name reserved",
        "wire-json",
        {"a.proto": P3 + "message A { int32 x = 1; int32 y = 2; }\n"},
        {"a.proto": P3 + 'message A { int32 x = 1; reserved 2; reserved "y"; }\n'},
    ),
    (
        "renaming a field is wire-safe",
        "wire",
        {"a.proto": P3 + "message A { int32 x = 1; }\n"},
        {"a.proto": P3 + "message A { int32 renamed = 1; }\n"},
    ),
    (
        "int32 -> uint32 and fixed64 -> sfixed64 keep wire and JSON",
        "wire-json",
        {"a.proto": P3 + "message A { int32 x = 1; fixed64 y = 2; }\n"},
        {"a.proto": P3 + "message A { uint32 x = 1; sfixed64 y = 2; }\n"},
    ),
    (
        "protobuf's wire-compatible integer families",
        "wire",
        {
            "a.proto": P3 + "message A { int32 a = 1; bool b = 2; sint32 c = 3; fixed32 d = 4; "
            "string e = 5; uint64 f = 6; }\n"
        },
        {
            "a.proto": P3 + "message A { uint64 a = 1; int32 b = 2; sint64 c = 3; sfixed32 d = 4; "
            "bytes e = 5; bool f = 6; }\n"
        },
    ),
    (
        "presence changes and map <-> repeated entry are wire-safe",
        "wire",
        {"a.proto": P3 + "message A { optional int32 x = 1; map<string, int32> m = 2; }\n"},
        {
            "a.proto": P3 + "message A { int32 x = 1; repeated MEntry m = 2;\n"
            "  message MEntry { string key = 1; int32 value = 2; } }\n"
        },
    ),
    (
        "message moved to another file of the same package",
        "package",
        {"a.proto": P3 + "message A {}\nmessage B { int32 x = 1; }\n", "b.proto": P3},
        {"a.proto": P3 + "message A {}\n", "b.proto": P3 + "message B { int32 x = 1; }\n"},
    ),
    (
        "enum alias added",
        "file",
        {"a.proto": P3 + "enum E { E0 = 0; E1 = 1; }\n"},
        {"a.proto": P3 + "enum E { option allow_alias = true; E0 = 0; E1 = 1; EONE = 1; }\n"},
    ),
    (
        "explicit default equal to the implicit one, default option values spelled out",
        "file",
        {"a.proto": P2 + "option optimize_for = SPEED;\nmessage A { optional int32 x = 1; }\n"},
        {
            "a.proto": P2 + "option cc_enable_arenas = true;\n"
            "message A { optional int32 x = 1 [default = 0]; }\n"
        },
    ),
    (
        "a well-known import dropped is not a deleted file",
        "file",
        {"a.proto": P3 + 'import "google/protobuf/empty.proto";\nmessage A { int32 x = 1; }\n'},
        {"a.proto": P3 + "message A { int32 x = 1; }\n"},
    ),
]


@pytest.mark.parametrize(("title", "level", "before", "after"), SAFE_CASES, ids=lambda x: x)
def test_safe_change(title: str, level: Level, before: Files, after: Files, compile_: Compiler):
    assert check(compile_(after), compile_(before), level=level) == []


def test_message_move_between_files_is_file_level_only(compile_: Compiler):
    before = {"a.proto": P3 + "message A {}\nmessage B {}\n", "b.proto": P3 + "message C {}\n"}
    after = {"a.proto": P3 + "message A {}\n", "b.proto": P3 + "message B {}\nmessage C {}\n"}
    findings = check(compile_(after), compile_(before), level="file")
    assert [(f.rule, f.file, f.line) for f in findings] == [("MESSAGE_NO_DELETE", "a.proto", None)]
    assert check(compile_(after), compile_(before), level="package") == []


def test_locations_point_at_what_changed(compile_: Compiler):
    before = {"a.proto": P3 + "message A {\n  int64 x = 1;\n  int32 y = 2;\n  message N {}\n}\n"}
    after = {"a.proto": P3 + "message A {\n  uint64 x = 1;\n}\n"}
    findings = check(compile_(after), compile_(before), level="file")
    located = {(f.rule, f.line, f.column) for f in findings}
    assert ("FIELD_SAME_TYPE", 4, 3) in located  # the type keyword of x
    assert ("FIELD_NO_DELETE", 3, 1) in located  # a deleted field: its message
    assert ("MESSAGE_NO_DELETE", 3, 1) in located  # a deleted nested message: its parent
    assert findings == sorted(findings, key=Finding.sort_key)


def test_type_change_messages_name_both_types(compile_: Compiler):
    before = {"a.proto": P3 + "enum E { E0 = 0; }\nenum F { F0 = 0; }\nmessage A { E e = 1; }\n"}
    after = {"a.proto": P3 + "enum E { E0 = 0; }\nenum F { F0 = 0; }\nmessage A { F e = 1; }\n"}
    (finding,) = check(compile_(after), compile_(before), level="wire")
    assert finding.rule == "FIELD_WIRE_COMPATIBLE_TYPE"
    assert 'changed type from "t.E" to "t.F"' in finding.message
    assert 'Field "1" with name "e" on message "A"' in finding.message


def test_unknown_level_is_an_error(compile_: Compiler):
    schema = compile_({"a.proto": P3})
    with pytest.raises(CompatError, match="unknown level"):
        check(schema, schema, level="strict")  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------ 0.4.28


@pytest.fixture(scope="module")
def ours() -> FDS:
    return load_schema(PROTOS)


@pytest.fixture(scope="module")
def wheel_0428() -> FDS:
    return load_schema(upstream_wheel())


@pytest.mark.parametrize("level", LEVELS)
def test_our_protos_are_compatible_with_0_4_28_wheel(level: Level, ours: FDS, wheel_0428: FDS):
    """The published wheel (descriptors from its _pb2.py files, no source info): compatible.
    Our files declare fields in another order and carry other comments; neither counts."""
    assert check(ours, wheel_0428, level=level) == []


@pytest.mark.parametrize("level", LEVELS)
def test_our_protos_are_compatible_with_0_4_28_sources(level: Level, ours: FDS):
    """The same against the .proto sources shipped in the 0.4.28 wheel, compiled with protoc."""
    assert check(ours, load_schema(upstream_package() / "proto"), level=level) == []


def test_nothing_added_beyond_0_4_28(ours: FDS, wheel_0428: FDS):
    """Matches the (empty) "Additions beyond 0.4.28" table of protos/README.md."""
    assert additions(ours, wheel_0428) == []


def test_renumbered_field_in_a_scratch_copy(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    scratch = tmp_path / "protos"
    shutil.copytree(PROTOS, scratch)
    path = scratch / "vllm_engine.proto"
    text = path.read_text()
    start = text.index("\nmessage TensorData {")
    renumbered = text[start:].replace("repeated uint32 shape = 2;", "repeated uint32 shape = 6;", 1)
    assert renumbered != text[start:]
    path.write_text(text[:start] + renumbered)
    message_line = text[: start + 1].count("\n") + 1

    code, out, err = main(
        capsys, "compat", "--protos", str(scratch), "--against", str(upstream_wheel())
    )
    assert (code, err) == (1, "")
    lines = out.splitlines()
    assert lines[0].endswith(
        f"vllm_engine.proto:{message_line}:1: FIELD_NO_DELETE_UNLESS_NUMBER_RESERVED: "
        'Previously present field "2" with name "shape" on message "TensorData" was deleted '
        'without reserving the number "2".'
    )
    assert lines[1].startswith("1 breaking change at level wire against ")


@pytest.mark.slow
def test_checking_eight_files_against_0_4_28_takes_under_a_second(
    capsys: pytest.CaptureFixture[str],
):
    """End to end, as a user runs it: a fresh ``smg-proto`` process compiles protos/ with
    protoc, reads the wheel and checks every rule (level file). Best of three runs."""
    wheel = upstream_wheel()  # the one-time download is not part of the budget
    assert len(load_schema(PROTOS).file) - 2 == 8  # + timestamp.proto and struct.proto
    args = ("compat", "--protos", str(PROTOS), "--against", str(wheel), "--level", "file")
    in_process, process = [], []
    for _ in range(3):
        start = time.perf_counter()
        assert cli.main(list(args)) == 0
        in_process.append(time.perf_counter() - start)
        start = time.perf_counter()
        assert run_cli(*args)[0] == 0
        process.append(time.perf_counter() - start)
    capsys.readouterr()
    assert min(in_process) < 1.0, in_process
    assert min(process) < 1.0, process


# ------------------------------------------------------------------------------------ loaders


def test_load_directory_single_file_and_nested_protos(tmp_path: Path):
    _write(
        tmp_path / "repo" / "protos",
        {"a.proto": P3 + 'import "b.proto";\nmessage A {}\n', "b.proto": P3 + "message B {}\n"},
    )
    fds = load_schema(tmp_path / "repo" / "protos")
    assert sorted(f.name for f in fds.file) == ["a.proto", "b.proto"]
    assert fds.file[0].HasField("source_code_info")
    assert [f.name for f in load_schema(tmp_path / "repo").file] == [f.name for f in fds.file]
    single = load_schema(tmp_path / "repo" / "protos" / "b.proto")
    assert [f.name for f in single.file] == ["b.proto"]


def test_load_well_known_imports_resolve(tmp_path: Path):
    _write(
        tmp_path,
        {
            "a.proto": P3 + 'import "google/protobuf/timestamp.proto";\n'
            "message A { google.protobuf.Timestamp t = 1; }\n"
        },
    )
    names = [f.name for f in load_schema(tmp_path).file]
    assert names == ["google/protobuf/timestamp.proto", "a.proto"]


def test_load_descriptor_set_files(tmp_path: Path, ours: FDS):
    for name in ("schema.binpb", "schema.pb", "schema.bin"):
        (tmp_path / name).write_bytes(ours.SerializeToString())
        assert load_schema(tmp_path / name) == ours
    (tmp_path / "image.json").write_text(json_format.MessageToJson(ours))
    assert load_schema(str(tmp_path / "image.json")) == ours


def _wheel(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def _pb2_source(fdp: descriptor_pb2.FileDescriptorProto) -> bytes:
    serialized = fdp.SerializeToString()
    return (
        "from google.protobuf import descriptor_pool as _descriptor_pool\n"
        f"DESCRIPTOR = _descriptor_pool.Default().AddSerializedFile({serialized!r})\n"
        "_globals = globals()\n"
    ).encode()


def test_load_wheel_from_pb2_sources_without_importing(tmp_path: Path, compile_: Compiler):
    fds = compile_({"x.proto": P3 + "message X { int32 x = 1; }\n"})
    fdp = fds.file[0]
    fdp.ClearField("source_code_info")
    wheel = _wheel(
        tmp_path / "tiny-1.0-py3-none-any.whl",
        {
            "tiny/__init__.py": b"",
            "tiny/x_pb2.py": _pb2_source(fdp),
            "tiny/readme_pb2.py": b"# a _pb2 file without a descriptor is skipped\n",
        },
    )
    loaded = load_schema(wheel)
    assert [f.name for f in loaded.file] == ["x.proto"]
    assert loaded.file[0] == fdp
    assert "tiny.x_pb2" not in sys.modules


def test_load_wheel_prefers_packaged_descriptor_set(tmp_path: Path, ours: FDS):
    wheel = _wheel(
        tmp_path / "smg_grpc_proto-9.9.9-cp310-abi3-any.whl",
        {
            "smg_grpc_proto/proto/descriptors.binpb": ours.SerializeToString(),
            "smg_grpc_proto/generated/bogus_pb2.py": b"this is not python",
        },
    )
    assert load_schema(wheel) == ours


def test_load_the_published_wheel(wheel_0428: FDS):
    names = sorted(f.name for f in wheel_0428.file)
    assert len(names) == 8
    assert "vllm_engine.proto" in names
    assert not any(f.HasField("source_code_info") for f in wheel_0428.file)


@pytest.mark.slow
def test_load_requirement_downloads_once_then_uses_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("SMG_PROTO_CACHE", str(tmp_path / "cache"))
    requirement = f"smg-grpc-proto=={UPSTREAM_VERSION}"
    first = load_schema(requirement)  # pip download into the empty cache
    assert [p.name for p in (tmp_path / "cache").glob("*.whl")] == [upstream_wheel().name]
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # any further pip download would now fail
    assert load_schema(requirement) == first
    assert sorted(f.name for f in first.file) == sorted(
        f.name for f in load_schema(upstream_wheel()).file
    )


@pytest.mark.slow
def test_load_requirement_that_does_not_exist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SMG_PROTO_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    with pytest.raises(CompatError, match=r"cannot download smg-grpc-proto==0\.0\.0"):
        load_schema("smg-grpc-proto==0.0.0")


def _git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=repo,
        check=True,
        capture_output=True,
    )


@pytest.mark.slow
def test_load_git_revision(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    repo = tmp_path / "repo"
    _write(repo / "protos", {"a.proto": P3 + "message A { int32 x = 1; int32 y = 2; }\n"})
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "v1")
    _git(repo, "tag", "v1")
    (repo / "protos" / "a.proto").write_text(P3 + "message A { int32 x = 1; }\n")
    _git(repo, "commit", "-q", "-am", "drop y")

    at_v1 = load_schema("v1", repo=repo)
    head = load_schema("HEAD", repo=repo / "protos")
    assert [f.name for f in at_v1.file] == ["a.proto"]
    assert rules_of(check(head, at_v1)) == {"FIELD_NO_DELETE_UNLESS_NUMBER_RESERVED"}
    assert check(load_schema(repo / "protos"), head) == []

    code, out, _ = main(capsys, "compat", "--protos", str(repo / "protos"), "--against", "v1")
    assert code == 1
    assert "FIELD_NO_DELETE_UNLESS_NUMBER_RESERVED" in out
    code, out, _ = main(capsys, "compat", "--protos", str(repo / "protos"), "--against", "HEAD~0")
    assert code == 0


def test_current_schema_prefers_protos_then_the_package(tmp_path: Path):
    _write(tmp_path / "protos", {"z.proto": P3 + "message Z {}\n"})
    assert [f.name for f in current_schema(tmp_path).file] == ["z.proto"]
    packaged = current_schema(tmp_path / "protos")  # no protos/ below: the installed package
    shipped = Path(smg_grpc_proto.__file__).parent / "proto" / "descriptors.binpb"
    assert packaged == FDS.FromString(shipped.read_bytes())


@pytest.mark.parametrize(
    ("make", "pattern"),
    [
        (lambda p: p / "missing", r"is not an existing file or directory.*not a name==version"),
        (lambda p: _write(p / "empty", {"README": "x"}), r"contains no \.proto files"),
        (
            lambda p: _write(p / "bad", {"a.proto": P3 + "message A { int32 x = ; }\n"}),
            r"protoc could not compile.*a\.proto:3:",
        ),
        (
            lambda p: _write(
                p / "dup", {"a.proto": P3 + "message A { int32 x = 1; int32 y = 1; }\n"}
            ),
            r"protoc could not compile.*already been used",
        ),
        (
            lambda p: _write(p, {"x.binpb": "not a descriptor set \x00\xff"}) / "x.binpb",
            r"is not a FileDescriptorSet",
        ),
        (lambda p: _write(p, {"x.whl": "not a zip"}) / "x.whl", r"cannot read wheel"),
        (lambda p: _wheel(p / "e-1-py3-none-any.whl", {"e/__init__.py": b""}), r"holds no schema"),
        (lambda p: _write(p, {"x.json": "{ nope"}) / "x.json", r"not a JSON FileDescriptorSet"),
    ],
)
def test_load_errors_are_clear(make: Callable[[Path], Path], pattern: str, tmp_path: Path):
    with pytest.raises(CompatError, match=re.compile(pattern, re.DOTALL)):
        load_schema(make(tmp_path))


def test_load_git_revision_errors(tmp_path: Path):
    with pytest.raises(CompatError, match="not inside a git repository"):
        load_schema("main", repo=tmp_path)
    repo = _write(tmp_path / "repo", {"README": "x"})
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "no protos")
    with pytest.raises(CompatError, match="not a revision of the git repository"):
        load_schema("no-such-branch", repo=repo)
    with pytest.raises(CompatError, match=r"cannot extract protos/ at revision HEAD"):
        load_schema("HEAD", repo=repo)


def test_missing_protoc_says_how_to_install_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "grpc_tools", None)  # what an uninstalled package looks like
    _write(tmp_path, {"a.proto": P3})
    with pytest.raises(CompatError, match=re.escape('pip install "smg-grpc-proto[compat]"')):
        load_schema(tmp_path)


# ------------------------------------------------------------------------------------ config


IGNORE_BEFORE = {
    "a.proto": P3 + "message A { int32 x = 1; int32 y = 2; }\n",
    "sub/b.proto": 'syntax = "proto3";\npackage t.sub;\nmessage B { int32 x = 1; }\n',
}
IGNORE_AFTER = {
    "a.proto": P3 + "message A { int64 x = 1; }\n",
    "sub/b.proto": 'syntax = "proto3";\npackage t.sub;\nmessage B { int64 x = 1; }\n',
}


@pytest.mark.parametrize(
    ("ignore", "expected"),
    [
        (
            None,
            {
                ("a.proto", "FIELD_NO_DELETE_UNLESS_NUMBER_RESERVED"),
                ("a.proto", "FIELD_WIRE_JSON_COMPATIBLE_TYPE"),
                ("sub/b.proto", "FIELD_WIRE_JSON_COMPATIBLE_TYPE"),
                ("a.proto", "FIELD_NO_DELETE_UNLESS_NAME_RESERVED"),
            },
        ),
        (
            {"FIELD_WIRE_JSON_COMPATIBLE_TYPE": ["sub"]},
            {
                ("a.proto", "FIELD_NO_DELETE_UNLESS_NUMBER_RESERVED"),
                ("a.proto", "FIELD_WIRE_JSON_COMPATIBLE_TYPE"),
                ("a.proto", "FIELD_NO_DELETE_UNLESS_NAME_RESERVED"),
            },
        ),
        ({"*": ["a.proto"]}, {("sub/b.proto", "FIELD_WIRE_JSON_COMPATIBLE_TYPE")}),
        (
            {
                "FIELD_WIRE_JSON_COMPATIBLE_TYPE": ["."],
                "FIELD_NO_DELETE_UNLESS_NAME_RESERVED": ["./"],
            },
            {("a.proto", "FIELD_NO_DELETE_UNLESS_NUMBER_RESERVED")},
        ),
        (
            {"WIRE": ["a.proto", "sub/"]},
            {
                ("a.proto", "FIELD_NO_DELETE_UNLESS_NAME_RESERVED"),
                ("a.proto", "FIELD_WIRE_JSON_COMPATIBLE_TYPE"),
                ("sub/b.proto", "FIELD_WIRE_JSON_COMPATIBLE_TYPE"),
            },
        ),
    ],
)
def test_ignore_mapping(ignore, expected, compile_: Compiler):
    found = check(compile_(IGNORE_AFTER), compile_(IGNORE_BEFORE), level="wire-json", ignore=ignore)
    assert {(f.file, f.rule) for f in found} == expected


def test_ignore_mapping_rejects_unknown_rules(compile_: Compiler):
    schema = compile_(IGNORE_BEFORE)
    with pytest.raises(CompatError, match="unknown rule id 'FIELD_SAME_TYPO'"):
        check(schema, schema, ignore={"FIELD_SAME_TYPO": ["a.proto"]})


def _project(tmp_path: Path, pyproject: str = "") -> Path:
    _write(tmp_path / "protos", IGNORE_AFTER)
    _write(tmp_path / "old", IGNORE_BEFORE)
    if pyproject:
        (tmp_path / "pyproject.toml").write_text(pyproject)
    return tmp_path


def test_config_in_pyproject_next_to_the_protos(tmp_path: Path, capsys):
    project = _project(
        tmp_path,
        """
[project]
name = "x"

[tool.smg-proto.compat]
ignore = ["sub"]
except = ["FIELD_NO_DELETE_UNLESS_NAME_RESERVED"]

[tool.smg-proto.compat.ignore_only]
FIELD_WIRE_JSON_COMPATIBLE_TYPE = ["a.proto"]
""",
    )
    args = ("compat", "--protos", str(project / "protos"), "--against", str(project / "old"))
    code, out, _ = main(capsys, *args, "--level", "wire-json")
    assert code == 1
    assert [line.split(": ")[1] for line in out.splitlines()[:-1]] == [
        "FIELD_NO_DELETE_UNLESS_NUMBER_RESERVED"
    ]


def test_config_file_option(tmp_path: Path, capsys):
    project = _project(tmp_path)
    config = tmp_path / "compat.toml"
    config.write_text('ignore = ["a.proto", "sub/b.proto"]\n')
    args = ("compat", "--protos", str(project / "protos"), "--against", str(project / "old"))
    assert main(capsys, *args)[0] == 1
    assert main(capsys, *args, "--config", str(config))[0] == 0
    assert load_config(config) == CompatConfig(("a.proto", "sub/b.proto"), {}, (), str(config))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("ignore = [", "invalid TOML"),
        ('ignore = "a.proto"', "ignore must be a list of strings"),
        ('ignores = ["a.proto"]', "unknown key(s) ignores"),
        ('except = ["NOT_A_RULE"]', "unknown rule id 'NOT_A_RULE'"),
        ("[ignore_only]\nFIELD_SAME_TYPE = 3", "ignore_only.FIELD_SAME_TYPE must be a list"),
    ],
)
def test_config_errors_exit_2(text: str, message: str, tmp_path: Path, capsys):
    project = _project(tmp_path)
    config = tmp_path / "compat.toml"
    config.write_text(text + "\n")
    code, out, err = main(
        capsys,
        "compat",
        "--protos",
        str(project / "protos"),
        "--against",
        str(project / "old"),
        "--config",
        str(config),
    )
    assert (code, out) == (2, "")
    assert message in err
    assert "Traceback" not in err


# ------------------------------------------------------------------------------------ output


@pytest.fixture
def breaking_project(tmp_path: Path) -> Path:
    return _project(tmp_path)


def test_text_output(breaking_project: Path, capsys, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(breaking_project)
    code, out, err = main(capsys, "compat", "--protos", "protos", "--against", "old")
    assert (code, err) == (1, "")
    assert out.splitlines() == [
        "protos/a.proto:3:1: FIELD_NO_DELETE_UNLESS_NUMBER_RESERVED: Previously present field "
        '"2" with name "y" on message "A" was deleted without reserving the number "2".',
        "1 breaking change at level wire against old",
    ]


def test_json_output(breaking_project: Path, capsys, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(breaking_project)
    code, out, _ = main(
        capsys,
        "compat",
        "--protos",
        "protos",
        "--against",
        "old",
        "--format",
        "json",
        "--level",
        "wire-json",
    )
    assert code == 1
    doc = json.loads(out)
    assert set(doc) == {"findings", "summary"}
    assert doc["summary"] == {
        "breaking": True,
        "count": 4,
        "level": "wire-json",
        "against": "old",
        "rules": {
            "FIELD_NO_DELETE_UNLESS_NAME_RESERVED": 1,
            "FIELD_NO_DELETE_UNLESS_NUMBER_RESERVED": 1,
            "FIELD_WIRE_JSON_COMPATIBLE_TYPE": 2,
        },
    }
    first = doc["findings"][0]
    assert set(first) == {"rule", "file", "path", "line", "column", "message"}
    assert (first["file"], first["path"], first["line"], first["column"]) == (
        "a.proto",
        "protos/a.proto",
        3,
        1,
    )


def test_github_output(breaking_project: Path, capsys, monkeypatch: pytest.MonkeyPatch):
    _git(breaking_project, "init", "-q")
    monkeypatch.chdir(breaking_project / "protos" / "sub")  # paths stay repository-relative
    code, out, _ = main(
        capsys, "compat", "--protos", "..", "--against", "../../old", "--format", "github"
    )
    assert code == 1
    assert out.splitlines() == [
        "::error file=protos/a.proto,line=3,col=1,title=FIELD_NO_DELETE_UNLESS_NUMBER_RESERVED::"
        'Previously present field "2" with name "y" on message "A" was deleted without '
        'reserving the number "2".',
        "1 breaking change at level wire against ../../old",
    ]


def test_github_escaping_and_unlocated_findings():
    findings = [
        Finding("FILE_NO_DELETE", "a,b:c.proto", None, None, "100% gone\nreally"),
        Finding("FIELD_SAME_NAME", "x.proto", 4, None, "renamed"),
    ]
    out = render(Report(findings, "file", "v1", "protos/"), "github")
    assert out.splitlines()[:2] == [
        "::error file=protos/a%2Cb%3Ac.proto,title=FILE_NO_DELETE::100%25 gone%0Areally",
        "::error file=protos/x.proto,line=4,title=FIELD_SAME_NAME::renamed",
    ]
    assert render(Report(findings[1:], "file", "v1"), "text").splitlines() == [
        "x.proto:4: FIELD_SAME_NAME: renamed",
        "1 breaking change at level file against v1",
    ]


@pytest.mark.slow
def test_compatible_output_in_every_format(capsys):
    for fmt, expected in [
        ("text", "compatible: no breaking changes at level wire against protos\n"),
        ("github", "compatible: no breaking changes at level wire against protos\n"),
    ]:
        code, out, _ = main(
            capsys, "compat", "--protos", str(PROTOS), "--against", str(PROTOS), "--format", fmt
        )
        assert (code, out.replace(str(PROTOS), "protos")) == (0, expected)
    code, out, _ = main(
        capsys, "compat", "--protos", str(PROTOS), "--against", str(PROTOS), "--format", "json"
    )
    assert code == 0
    assert json.loads(out)["findings"] == []
    assert json.loads(out)["summary"]["breaking"] is False


# ------------------------------------------------------------------------------------ exit codes


@pytest.mark.slow
def test_exit_codes_from_a_real_process(breaking_project: Path):
    project = str(breaking_project)
    assert (
        run_cli("compat", "--protos", "protos", "--against", "protos", cwd=breaking_project)[0] == 0
    )
    code, out, err = run_cli(
        "compat", "--protos", "protos", "--against", "old", cwd=breaking_project
    )
    assert code == 1
    assert "FIELD_NO_DELETE_UNLESS_NUMBER_RESERVED" in out
    assert err == ""
    for args in (
        ("compat",),  # --against missing
        ("compat", "--against", "old", "--level", "strict"),
        ("nonsense",),
        ("compat", "--protos", "protos", "--against", f"{project}/does-not-exist"),
    ):
        code, out, err = run_cli(*args, cwd=breaking_project)
        assert code == 2, (args, out, err)
        assert "Traceback" not in err
        assert err.strip()


def test_exit_code_2_for_invalid_schemas(tmp_path: Path, capsys):
    _write(tmp_path / "broken", {"a.proto": P3 + "message A { int32 x = 1 }\n"})
    (tmp_path / "garbage.binpb").write_bytes(b"\x0a\xff\xff\xff\xff\x0f")
    code, out, err = main(
        capsys, "compat", "--protos", str(tmp_path / "broken"), "--against", str(PROTOS)
    )
    assert (code, out) == (2, "")
    assert "protoc could not compile" in err
    assert "a.proto:3" in err
    code, out, err = main(
        capsys, "compat", "--protos", str(PROTOS), "--against", str(tmp_path / "garbage.binpb")
    )
    assert (code, out) == (2, "")
    assert "garbage.binpb is not a FileDescriptorSet" in err
    code, _, err = main(capsys, "compat", "--protos", str(tmp_path / "nowhere"), "--against", "x")
    assert code == 2
    assert "is not a directory" in err


def test_help_exits_0(capsys):
    code, out, _ = main(capsys, "compat", "--help")
    assert code == 0
    assert "--against REF" in out


def test_default_current_schema_is_protos_in_the_working_directory(
    capsys, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.chdir(ROOT)
    code, out, _ = main(capsys, "compat", "--against", str(upstream_wheel()), "--level", "file")
    assert code == 0
    assert out.startswith("compatible")


# ------------------------------------------------------------------------------------ additions


def test_additions_list_new_elements(compile_: Compiler):
    before = {
        "a.proto": P3 + "enum E { E0 = 0; }\nmessage A { int32 x = 1; }\n"
        "service S { rpc R(A) returns (A); }\n",
        "m.proto": P3 + "message Moved {}\n",
    }
    after = {
        "a.proto": P3 + 'import "google/protobuf/empty.proto";\n'
        "enum E { E0 = 0; E1 = 1; }\nmessage A { int32 x = 1; oneof o { int32 y = 2; } "
        "map<string, int32> m = 3; }\nmessage Moved {}\nmessage B { int32 b = 1; }\n"
        "service S { rpc R(A) returns (A); rpc Q(A) returns (B); }\n",
        "m.proto": P3,
        "n.proto": 'syntax = "proto3";\npackage n;\n',
    }
    assert additions(compile_(after), compile_(before)) == [
        "a.proto:t.A/field 2",
        "a.proto:t.A/field 3",
        "a.proto:t.A/oneof o",
        "a.proto:t.B",
        "a.proto:t.B/field 1",
        "a.proto:t.E/value E1",
        "a.proto:t.S/rpc Q",
        "n.proto",
    ]
    assert additions(compile_(before), compile_(before)) == []
