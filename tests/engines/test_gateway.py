"""The real SMG gateway end to end: ``smg launch`` (smg 1.13.0 from PyPI, in its own venv) serves
OpenAI chat completions — text, streamed text, and an image as a data URL, inline and through
shared memory — to our reference vLLM servicer on loopback, for a weight-less Qwen2-VL model
directory written here. Our decoder must read the gateway's tensors, and the completion the HTTP
client gets must be exactly the toy engine's answer to what the gateway sent.

``HF_ENDPOINT`` points at a loopback port that is bound but never listens, so nothing can leave
the machine. The gateway's pixel values are compared with ours (bit-exact with transformers);
the figures are recorded in docs/engines.md.
"""

from __future__ import annotations

import base64
import http.client
import io
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image
from support.images import CACHE, grace_hopper
from support.qwen2vl_dir import TOKEN_HIGH, TOKEN_LOW, write_model_dir

from smg_grpc_proto.engines import VisionModel
from smg_grpc_proto.tensors import TensorMessage
from smg_grpc_proto.testing import ReferenceServer, ToyModel, mm_digest
from smg_grpc_proto.testing.vllm import VllmToyServicer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SMG = "smg==1.13.0"
MODEL = "Qwen2-VL-tiny"


# -- the gateway's own venv -------------------------------------------------------------------
@pytest.fixture(scope="module")
def smg_binary() -> Path:
    env = CACHE / "smg-1.13.0-venv"
    binary = env / "bin" / "smg"
    if not binary.exists():
        uv = [sys.executable, "-m", "uv"]
        subprocess.run(
            [*uv, "venv", "--quiet", "--python", sys.executable, str(env)], check=True, timeout=300
        )
        subprocess.run(
            [*uv, "pip", "install", "--quiet", "--python", str(env / "bin" / "python"), SMG],
            check=True,
            timeout=600,
        )
    return binary


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def closed_port() -> Iterator[int]:
    """A loopback port that is bound but never listens: every connection is refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield int(s.getsockname()[1])


# -- the engine: the reference servicer, recording what it received ---------------------------
class RecordingServicer(VllmToyServicer):
    """The reference servicer, also keeping each request's prompt ids and tensor transports."""

    def __init__(self, model: ToyModel) -> None:
        self.decoded: dict[str, Any] = {}
        super().__init__(model, on_decoded=self._on_decoded)
        self.requests: dict[str, dict[str, Any]] = {}
        self.aborted: list[str] = []

    def _on_decoded(self, request_id: str, decoded: Any, seconds: float) -> None:
        self.decoded[request_id] = decoded

    async def Abort(self, request: Any, context: Any) -> Any:
        self.aborted.extend(request.request_ids)
        return await super().Abort(request, context)

    async def Generate(self, request: Any, context: Any) -> Any:  # type: ignore[override]
        message = request.message if isinstance(request, TensorMessage) else request
        if hasattr(message, "request_id"):
            self.requests[message.request_id] = {
                "ids": list(message.tokenized.input_ids),
                "max_tokens": message.sampling_params.max_tokens,
                "pixel_payload": message.mm_inputs.pixel_values.WhichOneof("payload")
                if message.HasField("mm_inputs")
                else None,
            }
        async for response in super().Generate(request, context):
            yield response


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model_dir(tmp_path_factory.mktemp("models") / MODEL)


@pytest.fixture(scope="module")
def engine(model_dir: Path) -> Iterator[tuple[ReferenceServer, RecordingServicer]]:
    toy = ToyModel.from_dir(model_dir, token_low=TOKEN_LOW, token_high=TOKEN_HIGH)
    servicer = RecordingServicer(toy)
    with ReferenceServer("vllm", servicer) as server:
        yield server, servicer


class Gateway:
    """``smg launch`` on loopback, ready when ``/readiness`` says so."""

    def __init__(self, binary: Path, worker: str, model_dir: Path, hf_port: int, log: Path,
                 *extra: str) -> None:  # fmt: skip
        self.port = _free_port()
        command = [
            str(binary), "launch", "--host", "127.0.0.1", "--port", str(self.port),
            "--worker-urls", f"grpc://{worker}", "--model-path", str(model_dir),
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(_free_port()),
            "--worker-startup-check-interval", "1", *extra,
        ]  # fmt: skip
        env = dict(os.environ, HF_ENDPOINT=f"http://127.0.0.1:{hf_port}", HF_HUB_OFFLINE="1")
        self.log = log
        self._log_file = open(log, "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            command, stdout=self._log_file, stderr=subprocess.STDOUT, env=env
        )
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.stop()
                raise RuntimeError(f"smg exited with {self.process.returncode}:\n{self.tail()}")
            try:
                status, body = self.request("GET", "/readiness", timeout=2)
                if status == 200 and json.loads(body).get("status") == "ready":
                    return
            except (OSError, ValueError):
                pass
            time.sleep(0.25)
        self.stop()
        raise RuntimeError(f"smg not ready after 90 s:\n{self.tail()}")

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def request(
        self, method: str, path: str, body: Any = None, timeout: float = 60
    ) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            payload = json.dumps(body).encode() if body is not None else None
            headers = {"Content-Type": "application/json"} if body is not None else {}
            conn.request(method, path, payload, headers)
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def chat(self, messages: list[dict[str, Any]], **params: Any) -> dict[str, Any]:
        status, body = self.request(
            "POST", "/v1/chat/completions", {"model": MODEL, "messages": messages, **params}
        )
        assert status == 200, (status, body[:2000], self.tail())
        result: dict[str, Any] = json.loads(body)
        return result

    def stream(self, messages: list[dict[str, Any]], **params: Any) -> list[dict[str, Any]]:
        status, body = self.request(
            "POST",
            "/v1/chat/completions",
            {"model": MODEL, "messages": messages, "stream": True, **params},
        )
        assert status == 200, (status, body[:2000], self.tail())
        events = []
        for line in body.decode().splitlines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[len("data: ") :]))
        assert body.decode().rstrip().endswith("data: [DONE]")
        return events

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log_file.close()


@pytest.fixture(scope="module")
def gateways(
    smg_binary: Path,
    engine: tuple[ReferenceServer, RecordingServicer],
    model_dir: Path,
    closed_port: int,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, Gateway]]:
    server, _ = engine
    logs = tmp_path_factory.mktemp("smg-logs")
    inline = Gateway(smg_binary, server.target, model_dir, closed_port, logs / "inline.log")
    try:
        shm = Gateway(
            smg_binary, server.target, model_dir, closed_port, logs / "shm.log",
            "--multimodal-tensor-transport", "shm", "--multimodal-shm-min-bytes", "4096",
        )  # fmt: skip
    except BaseException:
        inline.stop()
        raise
    try:
        yield {"inline": inline, "shm": shm}
    finally:
        inline.stop()
        shm.stop()


# -- helpers -------------------------------------------------------------------------------------
def _expected_text(
    servicer: RecordingServicer, model_dir: Path, request_id: str
) -> tuple[str, int]:
    from tokenizers import Tokenizer

    seen = servicer.requests[request_id]
    decoded = servicer.decoded.get(request_id, ())
    max_tokens = seen["max_tokens"] or None
    output = servicer.model.generate(seen["ids"], mm_digest(decoded), max_tokens=max_tokens)
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    return tokenizer.decode(list(output.token_ids), skip_special_tokens=True), len(output.token_ids)


def _only_new(servicer: RecordingServicer, before: set[str]) -> str:
    (request_id,) = set(servicer.requests) - before
    return request_id


def _data_url(image: Image.Image) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def _photo() -> Image.Image:
    return Image.open(io.BytesIO(grace_hopper())).convert("RGB")


_lock = threading.Lock()  # the recording servicer is shared by every test of the module


# -- the tests -------------------------------------------------------------------------------
def test_text_completion(
    gateways: dict[str, Gateway], engine: tuple[ReferenceServer, RecordingServicer], model_dir: Path
) -> None:
    servicer = engine[1]
    with _lock:
        before = set(servicer.requests)
        result = gateways["inline"].chat(
            [{"role": "user", "content": "Hello, what is in the image?"}], max_tokens=16
        )
        request_id = _only_new(servicer, before)
    text, count = _expected_text(servicer, model_dir, request_id)
    choice = result["choices"][0]
    assert choice["message"]["content"] == text
    assert result["usage"]["completion_tokens"] == count
    assert result["usage"]["prompt_tokens"] == len(servicer.requests[request_id]["ids"])


def test_streamed_text(
    gateways: dict[str, Gateway], engine: tuple[ReferenceServer, RecordingServicer], model_dir: Path
) -> None:
    servicer = engine[1]
    with _lock:
        before = set(servicer.requests)
        events = gateways["inline"].stream(
            [{"role": "user", "content": "Describe the image in detail."}], max_tokens=12
        )
        request_id = _only_new(servicer, before)
    text, _ = _expected_text(servicer, model_dir, request_id)
    deltas = [e["choices"][0]["delta"].get("content") or "" for e in events if e.get("choices")]
    assert "".join(deltas) == text
    finishes = [e["choices"][0].get("finish_reason") for e in events if e.get("choices")]
    assert finishes[-1] in ("stop", "length")


@pytest.mark.parametrize("size", [None, (1280, 960)], ids=["512x600", "1280x960"])
@pytest.mark.parametrize("transport", ["inline", "shm"])
def test_image_completion(
    transport: str,
    size: tuple[int, int] | None,
    gateways: dict[str, Gateway],
    engine: tuple[ReferenceServer, RecordingServicer],
    model_dir: Path,
) -> None:
    servicer = engine[1]
    photo = _photo() if size is None else _photo().resize(size, Image.Resampling.LANCZOS)
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is in this image?"},
                {"type": "image_url", "image_url": {"url": _data_url(photo)}},
            ],
        }
    ]
    with _lock:
        before = set(servicer.requests)
        result = gateways[transport].chat(messages, max_tokens=10)
        request_id = _only_new(servicer, before)
    seen = servicer.requests[request_id]
    assert seen["pixel_payload"] == ("shm" if transport == "shm" else "inline")
    (batch,) = servicer.decoded[request_id]  # our decoder read the gateway's tensors
    text, _ = _expected_text(servicer, model_dir, request_id)
    assert result["choices"][0]["message"]["content"] == text
    # the gateway's preprocessing against ours (bit-exact with transformers' PIL backend)
    ours = VisionModel.from_pretrained(model_dir).prepare([photo_bytes(photo)])
    np.testing.assert_array_equal(batch.tensors["image_grid_thw"], ours.output.image_grid_thw)
    theirs = np.asarray(batch.tensors["pixel_values"], dtype=np.float32)
    mine = ours.output.pixel_values
    assert theirs.shape == mine.shape
    diff = np.abs(theirs - mine)
    equal = float(np.mean(theirs == mine))
    print(
        f"gateway vs ours ({transport}, {photo.size}, {mine.nbytes / 2**20:.1f} MiB): "
        f"max |diff| {diff.max():.4f}, mean {diff.mean():.2e}, "
        f"exactly equal {equal:.1%}, within 1e-6 {float(np.mean(diff <= 1e-6)):.2%}"
    )
    assert float(diff.max()) < 0.1  # a few uint8 levels after normalisation, never garbage
    (placeholder,) = batch.placeholders
    assert placeholder[1] == ours.token_counts[0]
    # Only this gateway's segments (its pid is in their names): another program on the machine
    # may be using the contract at the same time.
    mine = f"smg-tokenspeed-{gateways[transport].process.pid}-"
    left = [n for n in os.listdir("/dev/shm") if n.startswith(mine)]
    assert left == [], "the engine unlinks every segment it read"


def photo_bytes(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def test_client_disconnect_aborts_the_engine_request(
    gateways: dict[str, Gateway], engine: tuple[ReferenceServer, RecordingServicer]
) -> None:
    """A client that hangs up mid-stream: the gateway sends Abort, the engine stops at once."""
    servicer = engine[1]
    fast = servicer.model
    with _lock:
        servicer.model = fast.with_options(token_delay_s=0.2)
        try:
            before = set(servicer.requests)
            gateway = gateways["inline"]
            conn = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=30)
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": "Count to a hundred."}],
                "stream": True,
                "max_tokens": 200,
                "ignore_eos": True,
            }
            conn.request(
                "POST",
                "/v1/chat/completions",
                json.dumps(body),
                {"Content-Type": "application/json"},
            )
            response = conn.getresponse()
            assert response.status == 200
            first = response.readline()  # the first SSE line: the stream is running
            assert first.startswith(b"data: ")
            request_id = _only_new(servicer, before)
            conn.close()  # hang up after ~1 of 200 tokens
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and request_id not in servicer.aborted:
                time.sleep(0.05)
            assert request_id in servicer.aborted, gateway.tail()
            while time.monotonic() < deadline and servicer.active_requests:
                time.sleep(0.05)
            assert servicer.active_requests == 0
        finally:
            servicer.model = fast
