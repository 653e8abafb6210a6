"""Load a schema as a FileDescriptorSet from whatever a user can point at.

* a directory of ``.proto`` files (or a single ``.proto`` file), compiled with protoc from
  grpcio-tools (``--include_imports --include_source_info``; the well-known types resolve);
* a FileDescriptorSet file (``.binpb``, ``.pb``, a buf image; ``.json`` for a JSON buf image);
* a wheel (``*.whl``): its ``smg_grpc_proto/proto/descriptors.binpb`` when present, else the
  descriptors embedded in its ``*_pb2.py`` files (parsed, never imported);
* a requirement ``name==version``: the wheel is downloaded once with pip into the user cache;
* a git revision of the repository holding the working directory: the schema directory as of
  that revision is extracted with ``git archive`` and compiled.
"""

from __future__ import annotations

import importlib.resources
import importlib.util
import io
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

from google.protobuf import descriptor_pb2, json_format
from google.protobuf.message import DecodeError

from smg_grpc_proto.compat._model import CompatError
from smg_grpc_proto.compat._pb2source import serialized_descriptor

FileDescriptorSet = descriptor_pb2.FileDescriptorSet

PROTOS_DIR = "protos"
PACKAGED_DESCRIPTORS = "smg_grpc_proto/proto/descriptors.binpb"
INSTALL_HINT = 'pip install "smg-grpc-proto[compat]"'
CACHE_ENV = "SMG_PROTO_CACHE"
_REQUIREMENT = re.compile(
    r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([A-Za-z0-9][A-Za-z0-9.+!_-]*)\s*$"
)
_SUBPROCESS_TIMEOUT = 600


# ------------------------------------------------------------------------------------ public


def load_schema(ref: str | os.PathLike[str], *, repo: Path | None = None) -> FileDescriptorSet:
    """Load ``ref`` as a FileDescriptorSet (see the module docstring for what ``ref`` may be).

    An existing path wins, then a ``name==version`` requirement, then a git revision of the
    repository containing ``repo`` (default: the working directory); ``repo`` may also be the
    schema directory itself, whose path inside the repository is then used at the revision.
    """
    text = os.fspath(ref)
    path = Path(text).expanduser()
    if text and path.exists():
        return _load_path(path)
    if _REQUIREMENT.match(text):
        return read_wheel(download_wheel(text))
    tried = [f"{text!r} is not an existing file or directory", "not a name==version requirement"]
    git_reason = _git_revision_problem(text, repo)
    if git_reason is None:
        return git_schema(text, repo)
    tried.append(git_reason)
    raise CompatError(
        f"cannot load schema {text!r}: " + "; ".join(tried) + ". Expected a directory of "
        ".proto files, a FileDescriptorSet (.binpb/.pb), a wheel (.whl), a requirement such "
        "as smg-grpc-proto==0.4.28, or a git revision."
    )


def current_schema(root: Path | None = None) -> FileDescriptorSet:
    """The ``protos/`` tree under ``root`` (default: the working directory) if there is one,
    else the descriptors shipped in the installed ``smg_grpc_proto`` package."""
    protos = find_protos(root)
    if protos is not None:
        return compile_protos(protos)
    return packaged_descriptors()


def find_protos(root: Path | None = None) -> Path | None:
    """``root/protos`` (default root: the working directory) if it holds ``.proto`` files."""
    candidate = (root if root is not None else Path.cwd()) / PROTOS_DIR
    if candidate.is_dir() and _proto_files(candidate):
        return candidate
    return None


def schema_dir(path: Path) -> Path:
    """The schema directory a user named: ``path`` itself, or its ``protos/`` subdirectory when
    ``path`` (e.g. a repository root) holds no ``.proto`` file of its own."""
    if not path.is_dir():
        raise CompatError(f"{path} is not a directory")
    nested = path / PROTOS_DIR
    if not any(path.glob("*.proto")) and nested.is_dir() and _proto_files(nested):
        return nested
    if _proto_files(path):
        return path
    raise CompatError(f"{path} contains no .proto files")


def packaged_descriptors() -> FileDescriptorSet:
    """The FileDescriptorSet of the installed package (``smg_grpc_proto/proto/``)."""
    package = importlib.resources.files("smg_grpc_proto")
    resource = package.joinpath("proto").joinpath("descriptors.binpb")
    try:
        data = resource.read_bytes()
    except OSError as exc:
        raise CompatError(
            "no protos/ directory here and the installed smg_grpc_proto has no "
            f"proto/descriptors.binpb ({exc}); pass --protos DIR"
        ) from exc
    return parse_descriptor_set(data, "smg_grpc_proto/proto/descriptors.binpb")


# ------------------------------------------------------------------------------------ paths


def _load_path(path: Path) -> FileDescriptorSet:
    if path.is_dir():
        return compile_protos(schema_dir(path))
    if path.suffix == ".proto":
        return compile_protos(path.parent, [path.name])
    if path.suffix == ".whl":
        return read_wheel(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CompatError(f"cannot read {path}: {exc.strerror or exc}") from exc
    if path.suffix == ".json":
        return _parse_json_image(data, str(path))
    return parse_descriptor_set(data, str(path))


def parse_descriptor_set(data: bytes, origin: str) -> FileDescriptorSet:
    """Parse serialized FileDescriptorSet bytes, rejecting anything that is not one."""
    fds = FileDescriptorSet()
    try:
        fds.ParseFromString(data)
    except (DecodeError, ValueError) as exc:
        raise CompatError(f"{origin} is not a FileDescriptorSet: {exc}") from exc
    return _validated(fds, origin)


def _parse_json_image(data: bytes, origin: str) -> FileDescriptorSet:
    try:
        fds = json_format.Parse(data, FileDescriptorSet(), ignore_unknown_fields=True)
    except (json_format.ParseError, ValueError) as exc:
        raise CompatError(f"{origin} is not a JSON FileDescriptorSet: {exc}") from exc
    return _validated(fds, origin)


def _validated(fds: FileDescriptorSet, origin: str) -> FileDescriptorSet:
    if not fds.file:
        raise CompatError(f"{origin} is not a FileDescriptorSet: it describes no files")
    unnamed = [i for i, f in enumerate(fds.file) if not f.name]
    if unnamed:
        raise CompatError(f"{origin} is not a FileDescriptorSet: file #{unnamed[0]} has no name")
    return fds


# ------------------------------------------------------------------------------------ protoc


def _proto_files(root: Path) -> list[str]:
    return sorted(
        p.relative_to(root).as_posix()
        for p in root.rglob("*.proto")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts)
    )


def _protoc_include() -> Path:
    spec = importlib.util.find_spec("grpc_tools")
    if spec is None or spec.origin is None:
        raise CompatError(
            "compiling .proto files needs protoc from grpcio-tools, which is not installed: "
            + INSTALL_HINT
        )
    return Path(spec.origin).parent / "_proto"


def compile_protos(root: Path, files: list[str] | None = None) -> FileDescriptorSet:
    """Compile ``files`` (default: every ``.proto`` under ``root``) relative to ``root``."""
    files = files if files is not None else _proto_files(root)
    if not files:
        raise CompatError(f"{root} contains no .proto files")
    include = _protoc_include()
    with tempfile.TemporaryDirectory(prefix="smg-proto-") as tmp:
        out = Path(tmp) / "schema.binpb"
        cmd = [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"--proto_path={root.resolve()}",
            f"--proto_path={include}",
            "--include_imports",
            "--include_source_info",
            f"--descriptor_set_out={out}",
            *files,
        ]
        result = subprocess.run(
            cmd,
            cwd=root.resolve(),
            capture_output=True,
            text=True,
            check=False,
            timeout=_SUBPROCESS_TIMEOUT,
        )
        if result.returncode != 0 or not out.is_file():
            detail = (result.stderr or result.stdout).strip() or f"exit code {result.returncode}"
            raise CompatError(f"protoc could not compile the schema in {root}:\n{detail}")
        return parse_descriptor_set(out.read_bytes(), f"protoc output for {root}")


# ------------------------------------------------------------------------------------ wheels


def read_wheel(path: Path) -> FileDescriptorSet:
    """Descriptors of a wheel: its ``descriptors.binpb``, else those in its ``_pb2.py`` files."""
    try:
        with zipfile.ZipFile(path) as wheel:
            names = wheel.namelist()
            binpb = [n for n in names if n == PACKAGED_DESCRIPTORS]
            binpb = binpb or [n for n in names if n.endswith("/descriptors.binpb")]
            if binpb:
                return parse_descriptor_set(wheel.read(binpb[0]), f"{path}!{binpb[0]}")
            fds = FileDescriptorSet()
            seen: set[str] = set()
            for name in sorted(n for n in names if n.endswith("_pb2.py")):
                _add_pb2(fds, seen, wheel.read(name), f"{path}!{name}")
    except (zipfile.BadZipFile, OSError) as exc:
        raise CompatError(f"cannot read wheel {path}: {exc}") from exc
    if not fds.file:
        raise CompatError(
            f"wheel {path} holds no schema: no {PACKAGED_DESCRIPTORS} and no *_pb2.py "
            "file with an embedded descriptor"
        )
    return fds


def _add_pb2(fds: FileDescriptorSet, seen: set[str], source: bytes, origin: str) -> None:
    try:
        data = serialized_descriptor(source.decode("utf-8"))
    except (SyntaxError, UnicodeDecodeError, ValueError) as exc:
        raise CompatError(f"cannot parse {origin}: {exc}") from exc
    if data is None:
        return
    fdp = descriptor_pb2.FileDescriptorProto()
    try:
        fdp.ParseFromString(data)
    except (DecodeError, ValueError) as exc:
        raise CompatError(f"{origin}: embedded descriptor does not parse: {exc}") from exc
    if fdp.name not in seen:
        seen.add(fdp.name)
        fds.file.append(fdp)


def cache_dir() -> Path:
    """Where downloaded wheels are kept: ``$SMG_PROTO_CACHE``, else the user cache."""
    override = os.environ.get(CACHE_ENV)
    if override:
        return Path(override).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "smg-grpc-proto" / "wheels"


def _normalize_dist(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _cached_wheel(folder: Path, name: str, version: str) -> Path | None:
    dist = _normalize_dist(name)
    for wheel in sorted(folder.glob("*.whl")):
        parts = wheel.name[: -len(".whl")].split("-")
        if len(parts) >= 5 and _normalize_dist(parts[0]) == dist and parts[1] == version:
            return wheel
    return None


def download_wheel(requirement: str) -> Path:
    """The wheel of ``name==version``: from the cache, else downloaded into it with pip."""
    match = _REQUIREMENT.match(requirement)
    if match is None:
        raise CompatError(f"{requirement!r} is not a name==version requirement")
    name, version = match.groups()
    folder = cache_dir()
    cached = _cached_wheel(folder, name, version) if folder.is_dir() else None
    if cached is not None:
        return cached
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CompatError(f"cannot create the wheel cache {folder}: {exc}") from exc
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--quiet",
        "--dest",
        str(folder),
        f"{name}=={version}",
    ]
    result = subprocess.run(
        cmd, capture_output=True, text=True, check=False, timeout=_SUBPROCESS_TIMEOUT
    )
    wheel = _cached_wheel(folder, name, version)
    if result.returncode != 0 or wheel is None:
        detail = (result.stderr or result.stdout).strip().splitlines()[-5:]
        raise CompatError(
            f"cannot download {name}=={version} with pip:\n" + "\n".join(detail or ["no wheel"])
        )
    return wheel


# ------------------------------------------------------------------------------------ git


def _git(cwd: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, check=False, timeout=_SUBPROCESS_TIMEOUT
    )


def _git_revision_problem(rev: str, repo: Path | None) -> str | None:
    """``None`` if ``rev`` names a commit of the repository at ``repo``; else why not."""
    where = (repo if repo is not None else Path.cwd()).resolve()
    if not rev or rev.startswith("-"):
        return "not a git revision"
    try:
        top = _git(where, "rev-parse", "--show-toplevel")
    except (OSError, subprocess.SubprocessError):
        return "git is not available to resolve it as a revision"
    if top.returncode != 0:
        return f"not a git revision ({where} is not inside a git repository)"
    found = _git(where, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    if found.returncode != 0:
        return f"not a revision of the git repository at {top.stdout.decode().strip()}"
    return None


def _schema_path_in_repo(where: Path, top: Path) -> str:
    """The schema directory's path inside the repository: ``where`` or ``where/protos``."""
    if where.is_dir() and (where / PROTOS_DIR).is_dir():
        where = where / PROTOS_DIR
    elif not (where.is_dir() and _proto_files(where)):
        where = top / PROTOS_DIR
    try:
        return where.relative_to(top).as_posix() or "."
    except ValueError:
        return PROTOS_DIR


def git_schema(rev: str, repo: Path | None = None) -> FileDescriptorSet:
    """Compile the schema directory as it was at revision ``rev``."""
    where = (repo if repo is not None else Path.cwd()).resolve()
    top = Path(_git(where, "rev-parse", "--show-toplevel").stdout.decode().strip()).resolve()
    inside = _schema_path_in_repo(where, top)
    archive = _git(top, "archive", "--format=tar", rev, "--", inside)
    if archive.returncode != 0:
        detail = archive.stderr.decode(errors="replace").strip()
        raise CompatError(f"cannot extract {inside}/ at revision {rev}: {detail}")
    with tempfile.TemporaryDirectory(prefix="smg-proto-git-") as tmp:
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
            if hasattr(tarfile, "data_filter"):
                tar.extractall(tmp, filter="data")
            else:  # pragma: no cover - Python without tar extraction filters
                tar.extractall(tmp)
        extracted = Path(tmp) / inside
        if not extracted.is_dir() or not _proto_files(extracted):
            raise CompatError(f"{inside}/ holds no .proto files at revision {rev}")
        return compile_protos(extracted)
