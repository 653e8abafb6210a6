"""The typed stubs under ``mypy --strict``: positive examples, negative snippets, py.typed, runtime.

* ``examples/`` (a typed client and a typed servicer) must pass ``mypy --strict`` with the
  project's configuration, checked against the working tree (``src/``).
* Every ``tests/typing/fail/*.py`` must be rejected with exactly one error, of the code (and
  message substring) named on its first line ``# expect: <code> [<substring>]``, on the line
  carrying the ``# <-- error`` marker. A second line ``# xfail: <reason>`` records a known gap
  (strict xfail: once fixed, the marker must go).
* The same examples, copied out of the repository, must type-check against the *installed*
  package, which mypy reads only because it ships ``py.typed``.
* The example servicer and client really talk to each other on loopback.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import grpc
import pytest

import smg_grpc_proto
from smg_grpc_proto import vllm_engine_pb2, vllm_engine_pb2_grpc

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
EXAMPLES = ROOT / "examples"
EXAMPLE_FILES = ("typed_client.py", "typed_servicer.py")
FAIL_DIR = ROOT / "tests" / "typing" / "fail"
FAIL_CASES = sorted(FAIL_DIR.glob("*.py"))
MARKER = "# <-- error"
MYPY_TIMEOUT_S = 300
# The negative cases the issue asks for, by file stem; more may be added freely.
REQUIRED_FAIL_CASES = {
    "oneof_name_misspelled",
    "hasfield_plain_scalar",
    "ctor_wrong_field_type",
    "assign_str_to_uint32",
    "servicer_wrong_arg_type",
    "servicer_wrong_return_type",
    "stub_wrong_request_type",
    "nonexistent_field",
    "repeated_uint32_append_str",
    "generated_path_unknown_kwarg",
    "lazy_path_no_such_message",
}

_LINE_RE = re.compile(
    r"^(?P<path>.+?):(?P<line>\d+): (?P<severity>error|note): (?P<message>.*?)"
    r"(?:  \[(?P<code>[a-z0-9-]+)\])?$"
)


@dataclass(frozen=True)
class Diagnostic:
    path: Path
    line: int
    severity: str
    message: str
    code: str | None


@dataclass(frozen=True)
class MypyRun:
    returncode: int
    stdout: str
    stderr: str
    diagnostics: list[Diagnostic]

    @property
    def errors(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.severity == "error"]

    def report(self) -> str:
        tail = self.stderr[-4000:]
        return f"exit {self.returncode}\n--- stdout\n{self.stdout}\n--- stderr\n{tail}"


def run_mypy(
    targets: list[str],
    *,
    cwd: Path,
    cache_dir: Path,
    config_file: Path,
    mypy_path: Path | None = None,
    extra_args: tuple[str, ...] = (),
) -> MypyRun:
    """``python -m mypy --strict`` in a subprocess, isolated from caches and stray settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MYPY", "PYTHONPATH"))}
    if mypy_path is not None:
        env["MYPYPATH"] = str(mypy_path)
    cmd = [
        sys.executable,
        "-m",
        "mypy",
        "--config-file",
        str(config_file),
        "--strict",
        "--no-incremental",
        "--cache-dir",
        str(cache_dir),
        "--show-error-codes",
        "--no-pretty",
        "--no-color-output",
        "--hide-error-context",
        *extra_args,
        *targets,
    ]
    proc = subprocess.run(
        cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=MYPY_TIMEOUT_S
    )
    diagnostics = []
    for raw in proc.stdout.splitlines():
        m = _LINE_RE.match(raw)
        if m:
            path = Path(m["path"])
            diagnostics.append(
                Diagnostic(
                    path=(path if path.is_absolute() else cwd / path).resolve(),
                    line=int(m["line"]),
                    severity=m["severity"],
                    message=m["message"],
                    code=m["code"],
                )
            )
    return MypyRun(proc.returncode, proc.stdout, proc.stderr, diagnostics)


@pytest.fixture
def empty_config(tmp_path: Path) -> Path:
    """A mypy config with no settings, so only the command line counts."""
    path = tmp_path / "isolated-mypy.ini"
    path.write_text("[mypy]\n")
    return path


def _parsed(run: MypyRun) -> MypyRun:
    """Guard against a silently changed output format: every error line must have been parsed."""
    assert run.returncode in (0, 1), run.report()  # 2 = usage error or crash
    n_reported = sum(1 for ln in run.stdout.splitlines() if ": error: " in ln)
    assert n_reported == len(run.errors), run.report()
    return run


# --------------------------------------------------------------------------------------------
# (a) the positive examples under --strict, with the project's configuration
# --------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_examples_pass_mypy_strict(tmp_path: Path):
    for name in EXAMPLE_FILES:
        assert (EXAMPLES / name).is_file(), name
    n_files = len(list(EXAMPLES.glob("*.py")))
    run = _parsed(
        run_mypy(
            ["examples"],
            cwd=ROOT,
            cache_dir=tmp_path / "cache",
            config_file=ROOT / "pyproject.toml",
            mypy_path=SRC,
            extra_args=("--verbose",),
        )
    )
    assert run.returncode == 0, run.report()
    assert run.errors == []
    assert f"no issues found in {n_files} source files" in run.stdout, run.stdout
    # Checked against the working tree, not whatever happens to be installed.
    assert f"Parsing {SRC / 'smg_grpc_proto' / '__init__.py'} (smg_grpc_proto)" in run.stderr
    assert f"Parsing {SRC / 'smg_grpc_proto' / 'generated' / 'vllm_engine_pb2.pyi'}" in run.stderr


# --------------------------------------------------------------------------------------------
# (b) the negative snippets: each rejected with exactly the expected error
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Expectation:
    code: str
    substring: str
    line: int


def _expectation(path: Path) -> Expectation:
    lines = path.read_text().splitlines()
    m = re.fullmatch(r"# expect: (?P<code>[a-z0-9-]+)(?: (?P<substring>.+))?", lines[0])
    assert m, f"{path.name}: first line must be '# expect: <code> [<message substring>]'"
    marked = [i for i, text in enumerate(lines, start=1) if text.rstrip().endswith(MARKER)]
    assert len(marked) == 1, f"{path.name}: exactly one line must end with {MARKER!r}"
    return Expectation(m["code"], (m["substring"] or "").strip(), marked[0])


def _fail_param(path: Path) -> object:
    lines = path.read_text().splitlines()
    xfail = next((ln for ln in lines[1:3] if ln.startswith("# xfail: ")), None)
    marks = [pytest.mark.xfail(strict=True, reason=xfail[len("# xfail: ") :])] if xfail else []
    return pytest.param(path, id=path.stem, marks=marks)


def test_fail_table_is_complete():
    stems = {p.stem for p in FAIL_CASES}
    assert stems >= REQUIRED_FAIL_CASES, sorted(REQUIRED_FAIL_CASES - stems)
    for path in FAIL_CASES:
        _expectation(path)  # well-formed header and marker


@pytest.mark.slow
@pytest.mark.parametrize("case", [_fail_param(p) for p in FAIL_CASES])
def test_negative_snippet_is_rejected(case: Path, tmp_path: Path, empty_config: Path):
    expected = _expectation(case)
    run = _parsed(
        run_mypy(
            [str(case)],
            cwd=tmp_path,
            cache_dir=tmp_path / "cache",
            config_file=empty_config,
            mypy_path=SRC,
        )
    )
    assert run.returncode == 1, f"{case.name} was accepted by mypy --strict\n{run.report()}"
    errors = run.errors
    assert len(errors) == 1, f"expected exactly one error\n{run.report()}"
    (error,) = errors
    assert error.path == case.resolve(), run.report()
    assert error.code == expected.code, run.report()
    assert expected.substring in error.message, run.report()
    assert error.line == expected.line, run.report()


# --------------------------------------------------------------------------------------------
# (c) the installed package: read through py.typed, and really typed (not Any)
# --------------------------------------------------------------------------------------------

INSTALLED = Path(smg_grpc_proto.__file__).resolve().parent

WRONG_SNIPPET = """\
import grpc

from smg_grpc_proto import vllm_engine_pb2, vllm_engine_pb2_grpc

reveal_type(vllm_engine_pb2.GenerateResponse().WhichOneof("response"))
request_id: int = vllm_engine_pb2.GenerateRequest().request_id
stub = vllm_engine_pb2_grpc.VllmEngineStub(grpc.insecure_channel("127.0.0.1:1"))
stub.HealthCheck(vllm_engine_pb2.GenerateRequest())
"""


def _installed_or_skip() -> Path:
    if INSTALLED.is_relative_to(SRC):
        pytest.skip("smg_grpc_proto is imported from src/ (editable install); needs a real install")
    return INSTALLED


def _copy_examples(dest: Path, names: tuple[str, ...] | None = None) -> Path:
    """Copy examples (all of them by default) out of the repository, away from src/."""
    dest.mkdir(parents=True)
    paths = [EXAMPLES / n for n in names] if names else sorted(EXAMPLES.glob("*.py"))
    assert paths
    for path in paths:
        shutil.copy2(path, dest / path.name)
    return dest


@pytest.mark.slow
def test_installed_package_is_typed(tmp_path: Path, empty_config: Path):
    installed = _installed_or_skip()
    assert (installed / "py.typed").is_file()
    project = _copy_examples(tmp_path / "project")
    run = _parsed(
        run_mypy(
            ["."],
            cwd=project,
            cache_dir=tmp_path / "cache",
            config_file=empty_config,
            extra_args=("--verbose",),
        )
    )
    assert run.returncode == 0, run.report()
    assert f"Parsing {installed / '__init__.py'} (smg_grpc_proto)" in run.stderr
    assert f"Parsing {installed / 'generated' / 'vllm_engine_pb2.pyi'}" in run.stderr
    assert str(SRC) not in run.stderr

    (project / "wrong.py").write_text(WRONG_SNIPPET)
    run = _parsed(
        run_mypy(["wrong.py"], cwd=project, cache_dir=tmp_path / "cache2", config_file=empty_config)
    )
    wrong = (project / "wrong.py").resolve()
    got = {(d.line, d.severity, d.code) for d in run.diagnostics if d.path == wrong}
    assert got == {(5, "note", None), (6, "error", "assignment"), (8, "error", "arg-type")}, (
        run.report()
    )
    (reveal,) = [d for d in run.diagnostics if d.severity == "note"]
    assert reveal.message == "Revealed type is \"Literal['chunk'] | Literal['complete'] | None\""


@pytest.mark.slow
def test_py_typed_marker_is_what_makes_mypy_read_the_package(tmp_path: Path, empty_config: Path):
    """In an environment holding a copy of the installed package, remove py.typed: mypy then
    refuses to analyse it (import-untyped); with the marker the examples pass."""
    installed = _installed_or_skip()
    venv = tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120
    )
    python = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout.strip()
    )
    # Only the stub-only packages the examples need (types-grpcio, types-protobuf), no runtime.
    real_site = Path(sysconfig.get_paths()["purelib"])
    stub_dirs = sorted(real_site.glob("*-stubs"))
    assert {"grpc-stubs", "google-stubs"} <= {p.name for p in stub_dirs}
    for stub_dir in stub_dirs:
        (site / stub_dir.name).symlink_to(stub_dir, target_is_directory=True)
    copy = site / "smg_grpc_proto"
    shutil.copytree(installed, copy, ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.pyd"))
    assert (copy / "py.typed").is_file()
    # Only the typed examples: the bare environment holds no third-party runtime packages.
    project = _copy_examples(tmp_path / "project", EXAMPLE_FILES)

    def check(cache: str) -> MypyRun:
        return _parsed(
            run_mypy(
                ["."],
                cwd=project,
                cache_dir=tmp_path / cache,
                config_file=empty_config,
                extra_args=("--python-executable", str(python)),
            )
        )

    with_marker = check("cache-with")
    assert with_marker.returncode == 0, with_marker.report()

    (copy / "py.typed").unlink()
    without_marker = check("cache-without")
    assert without_marker.returncode == 1, without_marker.report()
    untyped = [e for e in without_marker.errors if e.code == "import-untyped"]
    assert untyped, without_marker.report()
    assert all('"smg_grpc_proto' in e.message for e in untyped), without_marker.report()


# --------------------------------------------------------------------------------------------
# (d) the examples for real: servicer and client on loopback
# --------------------------------------------------------------------------------------------


def _load_example(name: str) -> ModuleType:
    module_name = f"_smg_example_{name}"
    spec = importlib.util.spec_from_file_location(module_name, EXAMPLES / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses look their module up here
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    return module


@pytest.fixture(scope="module")
def client() -> Iterator[ModuleType]:
    module = _load_example("typed_client")
    yield module
    sys.modules.pop(module.__name__, None)


@pytest.fixture(scope="module")
def servicer() -> Iterator[ModuleType]:
    module = _load_example("typed_servicer")
    yield module
    sys.modules.pop(module.__name__, None)


@pytest.fixture
def target(servicer: ModuleType) -> Iterator[str]:
    server, port = servicer.serve(0)
    assert port > 0
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(None).wait(10)


def test_sync_client_streams_echo(client: ModuleType, target: str):
    request = client.build_request("sync-1", [5, 6, 7, 8], max_tokens=3, regex=r"\d+")
    assert request.sampling_params.WhichOneof("constraint") == "regex"
    assert client.describe_constraint(request.sampling_params) == "regex '\\\\d+'"
    result = client.run(target, request)
    assert result.token_ids == [5, 6, 7]
    assert result.chunks == 3
    assert result.complete
    assert result.finish_reason == "length"
    assert (result.prompt_tokens, result.completion_tokens) == (4, 3)
    assert result.matched_stop is None
    assert result.kv_transfer_params_json is None


def test_async_client_streams_echo(client: ModuleType, target: str):
    request = client.build_request(
        "async-1", [9, 8, 7, 6], json_schema='{"type": "integer"}', stop_token_ids=[7]
    )
    request.kv_transfer_params_json = ""  # optional: an explicit "" is still "present"
    result = asyncio.run(client.run_async(target, request))
    assert result.token_ids == [9, 8, 7]
    assert result.chunks == 3
    assert result.finish_reason == "stop"
    assert result.matched_stop == 7
    assert result.kv_transfer_params_json == ""


def test_non_streaming_request_gets_only_complete(client: ModuleType, target: str):
    request = client.build_request("unary-1", [1, 2], stream=False)
    with grpc.insecure_channel(target) as channel:
        responses = list(vllm_engine_pb2_grpc.VllmEngineStub(channel).Generate(request, timeout=30))
        result = client.generate(channel, request)
    assert [r.WhichOneof("response") for r in responses] == ["complete"]
    assert result.token_ids == [1, 2]
    assert result.chunks == 0
    assert result.finish_reason == "stop"


def test_unimplemented_rpc_and_unhealthy_engine(client: ModuleType, servicer: ModuleType):
    server, port = servicer.serve(0, servicer.EchoEngineServicer(healthy=False))
    try:
        target = f"127.0.0.1:{port}"
        with grpc.insecure_channel(target) as channel:
            assert client.health_check(channel) is False
            with pytest.raises(grpc.RpcError) as excinfo:
                vllm_engine_pb2_grpc.VllmEngineStub(channel).Embed(
                    vllm_engine_pb2.EmbedRequest(request_id="e"), timeout=30
                )
            assert excinfo.value.code() == grpc.StatusCode.UNIMPLEMENTED
        with pytest.raises(RuntimeError, match="not healthy"):
            client.run(target, client.build_request("x", [1]))
    finally:
        server.stop(None).wait(10)


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_client_main(
    client: ModuleType, target: str, use_async: bool, capsys: pytest.CaptureFixture[str]
):
    argv = [target, "--tokens", "3", "1", "4", "--max-tokens", "2", "--regex", "[0-9]+"]
    assert client.main([*argv, "--use-async"] if use_async else argv) == 0
    out = capsys.readouterr().out
    assert "constraint: regex '[0-9]+'" in out
    assert "tokens=[3, 1] finish_reason='length' chunks=2 matched_stop=None" in out
