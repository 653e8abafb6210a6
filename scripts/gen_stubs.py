#!/usr/bin/env python3
"""Regenerate everything derived from ``protos/``.

    python scripts/gen_stubs.py           # rewrite the generated trees in place
    python scripts/gen_stubs.py --check   # regenerate into a scratch folder, fail if stale

Outputs (all of them are committed and must never be edited by hand):

* ``src/smg_grpc_proto/generated/``  ``*_pb2.py``, ``*_pb2_grpc.py`` (grpcio-tools) and their
  typed ``.pyi`` (mypy-protobuf), plus an ``__init__.py`` listing the modules;
* ``src/smg_grpc_proto/proto/``      a copy of the ``.proto`` sources shipped in the wheel, and
  ``descriptors.binpb``, their FileDescriptorSet with source info and imports;
* ``src/smg_grpc_proto/dataclasses/`` betterproto2 dataclasses (the ``[dataclasses]`` extra).

The generators are pinned in ``scripts/gen-requirements.txt`` (protoc, via grpcio-tools) and
``scripts/gen-plugins-requirements.txt`` (protoc plugins) and run from two isolated virtual
environments cached under ``.cache/codegen/``: protoc needs the old protobuf its gencode stamp
comes from, while the plugins need a current one. Nothing here depends on what the calling
interpreter has installed.
"""

from __future__ import annotations

import argparse
import difflib
import filecmp
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTOS = ROOT / "protos"
PACKAGE = ROOT / "src" / "smg_grpc_proto"
CACHE = ROOT / ".cache" / "codegen"

DESCRIPTOR_SET = "descriptors.binpb"

# Output folders, relative to the package, that this script owns completely.
OUTPUTS = ("generated", "proto", "dataclasses")

GENERATED_INIT = '''\
"""Protobuf and gRPC stubs generated from ``protos/`` by ``scripts/gen_stubs.py``.

Do not edit: every file in this folder is rewritten by the generator.
"""

PROTO_FILES: tuple[str, ...] = {files!r}
"""The ``.proto`` files these stubs were generated from (descriptor file names)."""

MODULES: tuple[str, ...] = {modules!r}
"""Every importable stub module in this folder."""
'''


def _proto_files() -> list[str]:
    files = sorted(p.name for p in PROTOS.glob("*.proto"))
    if not files:
        sys.exit(f"gen_stubs: no .proto files in {PROTOS}")
    return files


def _venv(name: str, requirements: Path) -> Path:
    """Create (once) a venv with exactly the pinned requirements; return its bin folder."""
    digest = hashlib.sha256(requirements.read_bytes()).hexdigest()[:12]
    env = CACHE / f"{name}-{digest}"
    bindir = env / "bin"
    if not (env / ".complete").exists():
        if sys.version_info >= (3, 13):
            sys.exit(
                "gen_stubs: grpcio-tools 1.63.2 has no wheels for Python >= 3.13; "
                "run this script with Python 3.10-3.12"
            )
        shutil.rmtree(env, ignore_errors=True)
        env.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
        subprocess.run(
            [
                str(bindir / "python"),
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--no-input",
                "-r",
                str(requirements),
            ],
            check=True,
        )
        (env / ".complete").write_text(requirements.read_text())
    return bindir


def _protoc(protoc_bin: Path, plugin_bin: Path, args: list[str], files: list[str]) -> None:
    env = dict(os.environ, PATH=f"{plugin_bin}{os.pathsep}{os.environ.get('PATH', '')}")
    env.pop("PYTHONPATH", None)
    cmd = [str(protoc_bin / "python"), "-m", "grpc_tools.protoc", f"-I{PROTOS}", *args, *files]
    result = subprocess.run(cmd, cwd=PROTOS, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"gen_stubs: protoc failed:\n{result.stderr}")


def _relative_imports(text: str, modules: set[str]) -> str:
    """``import common_pb2 as x`` -> ``from . import common_pb2 as x`` for our own modules.

    protoc names sibling modules after the bare descriptor file names (which must stay bare
    for wire compatibility with 0.4.28), so the absolute imports it writes only work with the
    generated folder itself on ``sys.path``; inside the package they must be relative.
    """

    def fix(m: re.Match[str]) -> str:
        name = m.group(1)
        if name not in modules:
            return m.group(0)
        return f"from . import {name}{m.group(2) or ''}"

    return re.sub(r"^import (\w+)( as \w+)?$", fix, text, flags=re.MULTILINE)


# betterproto2-compiler 0.10.1 renames fields that clash with Python keywords, but not fields
# that clash with betterproto2.Message methods: `KvEventBatch.load` shadows `Message.load`, and
# parsing any KvEventBatch then fails with "'NoneType' object is not callable". We rename such
# fields with a trailing underscore (the compiler's own convention for keywords); the wire is
# unaffected because betterproto2 maps fields by number. tests/stubs/test_dataclasses.py checks
# that no field of any generated dataclass shadows a Message attribute.
_BETTERPROTO2_SHADOWED = ("load", "parse", "dump", "to_dict", "from_dict", "to_json", "from_json")


def _unshadow_betterproto2_fields(text: str) -> str:
    names = "|".join(_BETTERPROTO2_SHADOWED)
    return re.sub(
        rf"^(    )({names}): (.*= betterproto2\.field\()", r"\1\2_: \3", text, flags=re.MULTILINE
    )


def generate(out: Path) -> None:
    """Write all generated trees below ``out`` (a package-shaped folder)."""
    files = _proto_files()
    protoc_bin = _venv("protoc", ROOT / "scripts" / "gen-requirements.txt")
    plugin_bin = _venv("plugins", ROOT / "scripts" / "gen-plugins-requirements.txt")
    stems = [f.removesuffix(".proto") for f in files]
    modules = sorted([f"{s}_pb2" for s in stems] + [f"{s}_pb2_grpc" for s in stems])

    gen = out / "generated"
    gen.mkdir(parents=True)
    _protoc(
        protoc_bin,
        plugin_bin,
        [
            f"--python_out={gen}",
            f"--grpc_python_out={gen}",
            f"--mypy_out={gen}",
            f"--mypy_grpc_out={gen}",
        ],
        files,
    )
    own = set(modules)
    for path in sorted(gen.iterdir()):
        path.write_text(_relative_imports(path.read_text(), own))
    (gen / "__init__.py").write_text(
        GENERATED_INIT.format(files=tuple(files), modules=tuple(modules))
    )

    proto = out / "proto"
    proto.mkdir()
    for f in files:
        shutil.copyfile(PROTOS / f, proto / f)
    # A self-contained FileDescriptorSet with source info (comments, line numbers): what
    # `smg-proto compat` compares when it checks the installed package.
    _protoc(
        protoc_bin,
        plugin_bin,
        [
            f"--descriptor_set_out={proto / DESCRIPTOR_SET}",
            "--include_imports",
            "--include_source_info",
        ],
        files,
    )

    dc = out / "dataclasses"
    dc.mkdir()
    _protoc(protoc_bin, plugin_bin, [f"--python_betterproto2_out={dc}"], files)
    for path in sorted(dc.rglob("*.py")):
        path.write_text(_unshadow_betterproto2_fields(path.read_text()))


def _tree(root: Path) -> dict[str, Path]:
    return {
        str(p.relative_to(root)): p
        for p in sorted(root.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def check(scratch: Path) -> int:
    stale = []
    for name in OUTPUTS:
        want, have = _tree(scratch / name), _tree(PACKAGE / name)
        for rel in sorted(set(want) | set(have)):
            if rel not in have:
                stale.append(f"missing: {name}/{rel}")
            elif rel not in want:
                stale.append(f"not generated (remove it): {name}/{rel}")
            elif not filecmp.cmp(want[rel], have[rel], shallow=False):
                diff = difflib.unified_diff(
                    have[rel].read_text().splitlines(),
                    want[rel].read_text().splitlines(),
                    f"committed/{name}/{rel}",
                    f"regenerated/{name}/{rel}",
                    lineterm="",
                    n=1,
                )
                stale.append("differs: " + "\n".join(list(diff)[:20]))
    if stale:
        print("Generated files are stale; run `python scripts/gen_stubs.py`:", file=sys.stderr)
        for line in stale:
            print("  " + line, file=sys.stderr)
        return 1
    print(f"generated files are fresh ({len(_proto_files())} .proto files)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--check", action="store_true", help="fail if the committed output is stale"
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="smg-gen-") as tmp:
        scratch = Path(tmp)
        generate(scratch)
        if args.check:
            return check(scratch)
        for name in OUTPUTS:
            shutil.rmtree(PACKAGE / name, ignore_errors=True)
            shutil.copytree(scratch / name, PACKAGE / name)
    print(f"regenerated {', '.join(OUTPUTS)} from {len(_proto_files())} .proto files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
