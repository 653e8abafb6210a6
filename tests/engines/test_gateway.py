"""The real SMG gateway end to end: ``smg launch`` (smg 1.13.0 from PyPI, in its own venv) serves
OpenAI chat completions — text, streamed text, and an image as a data URL, inline and through
shared memory — to our reference vLLM servicer on loopback, for a weight-less Qwen2-VL model
directory (support/model_dirs.py). Our decoder must read the gateway's tensors, and the
completion the HTTP client gets must be exactly the toy engine's answer to what the gateway sent.

``TestAgreement`` then holds the gateway's request against our builder's for every vision
family both serve (one gateway launch per family; Nemotron-H-Omni, which smg sends to TokenSpeed
workers only, through the TokenSpeed reference servicer and our TokenSpeed builder), and our
``input_ids`` against transformers' processor; where the gateway differs, the difference is
asserted and explained.

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
from typing import Any, ClassVar

import numpy as np
import pytest
from PIL import Image
from support.images import CACHE, grace_hopper
from support.model_dirs import FAMILIES, TOKEN_HIGH, TOKEN_LOW, Family, qwen2_vl, write_model_dir

from smg_grpc_proto.engines import VisionModel
from smg_grpc_proto.tensors import TensorMessage
from smg_grpc_proto.testing import ReferenceServer, ToyModel, mm_digest
from smg_grpc_proto.testing.tokenspeed import TokenSpeedToyServicer
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
        self.raw: dict[str, Any] = {}  # each request as received (the inline ones re-decode)
        self.aborted: list[str] = []

    def _on_decoded(self, request_id: str, decoded: Any, seconds: float) -> None:
        self.decoded[request_id] = decoded

    async def Abort(self, request: Any, context: Any) -> Any:
        self.aborted.extend(request.request_ids)
        return await super().Abort(request, context)

    async def Generate(self, request: Any, context: Any) -> Any:  # type: ignore[override]
        message = request.message if isinstance(request, TensorMessage) else request
        if hasattr(message, "request_id"):
            self.raw[message.request_id] = request
            self.requests[message.request_id] = {
                "ids": list(message.tokenized.input_ids),
                "max_tokens": message.sampling_params.max_tokens,
                "pixel_payload": message.mm_inputs.pixel_values.WhichOneof("payload")
                if message.HasField("mm_inputs")
                else None,
            }
        async for response in super().Generate(request, context):
            yield response


class RecordingTokenSpeedServicer(TokenSpeedToyServicer):
    """The TokenSpeed reference servicer, also keeping each request as received and as our
    decoder read it."""

    def __init__(self, model: ToyModel) -> None:
        self.decoded: dict[str, Any] = {}
        super().__init__(model, on_decoded=self._on_decoded)
        self.requests: dict[str, dict[str, Any]] = {}
        self.raw: dict[str, Any] = {}

    def _on_decoded(self, request_id: str, decoded: Any, seconds: float) -> None:
        self.decoded[request_id] = decoded

    async def Generate(self, request: Any, context: Any) -> Any:  # type: ignore[override]
        message = request.message if isinstance(request, TensorMessage) else request
        if hasattr(message, "request_id"):
            self.raw[message.request_id] = request
            self.requests[message.request_id] = {"ids": list(message.tokenized.input_ids)}
        async for response in super().Generate(request, context):
            yield response


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # vision_token_id 151655 (<|image_pad|>, where vLLM's Qwen2-VL merges the embeddings) rather
    # than the published 151654: smg fills each image's run with it (see TestAgreement), and
    # these tests need a request a real vLLM would serve.
    family = qwen2_vl(vision_token_id=151655, name=MODEL)
    return write_model_dir(family, tmp_path_factory.mktemp("models") / MODEL)


@pytest.fixture(scope="module")
def engine(model_dir: Path) -> Iterator[tuple[ReferenceServer, RecordingServicer]]:
    toy = ToyModel.from_dir(model_dir, token_low=TOKEN_LOW, token_high=TOKEN_HIGH)
    servicer = RecordingServicer(toy)
    with ReferenceServer("vllm", servicer) as server:
        yield server, servicer


class _PortTaken(Exception):
    """smg could not bind the port we picked for it: someone else took it first."""


class Gateway:
    """``smg launch`` on loopback, ready when ``/readiness`` says so."""

    def __init__(self, binary: Path, worker: str, model_dir: Path, hf_port: int, log: Path,
                 *extra: str) -> None:  # fmt: skip
        self.model = model_dir.name  # the worker's served model name (ToyModel.from_dir)
        self.log = log
        # A free port is only free until someone else binds it (another program on the machine
        # can take it between our probe and smg's bind): a launch that lost its port is retried
        # on new ones; every other failure is raised at once.
        for attempt in range(3):
            try:
                self._launch(binary, worker, model_dir, hf_port, extra)
                return
            except _PortTaken:
                if attempt == 2:
                    raise RuntimeError(f"smg lost its port three times:\n{self.tail()}") from None

    def _launch(
        self, binary: Path, worker: str, model_dir: Path, hf_port: int, extra: tuple[str, ...]
    ) -> None:
        self.port = _free_port()
        command = [
            str(binary), "launch", "--host", "127.0.0.1", "--port", str(self.port),
            "--worker-urls", f"grpc://{worker}", "--model-path", str(model_dir),
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(_free_port()),
            "--worker-startup-check-interval", "1", *extra,
        ]  # fmt: skip
        env = dict(os.environ, HF_ENDPOINT=f"http://127.0.0.1:{hf_port}", HF_HUB_OFFLINE="1")
        self._log_file = open(self.log, "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            command, stdout=self._log_file, stderr=subprocess.STDOUT, env=env
        )
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.stop()
                if "address already in use" in self.tail().lower():
                    raise _PortTaken
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
            "POST", "/v1/chat/completions", {"model": self.model, "messages": messages, **params}
        )
        assert status == 200, (status, body[:2000], self.tail())
        result: dict[str, Any] = json.loads(body)
        return result

    def stream(self, messages: list[dict[str, Any]], **params: Any) -> list[dict[str, Any]]:
        status, body = self.request(
            "POST",
            "/v1/chat/completions",
            {"model": self.model, "messages": messages, "stream": True, **params},
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


def _only_new(servicer: RecordingServicer | RecordingTokenSpeedServicer, before: set[str]) -> str:
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


# -- agreement: the gateway's request against our builder's, family by family ------------------
# For the same chat (text + 1 or 2 images as data URLs) sent to the gateway, our builder makes
# the request from the same model directory and tokenizer file: VisionModel.from_pretrained,
# the chat template rendered with the published anchor once per image, and
# vllm.generate_request. Our input_ids are also checked against transformers' processor of the
# family (from the same tokenizer file), so that where the gateway differs we know who is right.

#: Families smg 1.13.0 builds requests for (crates/multimodal/src/registry/) and our builders
#: serve on main: one gateway launch each. Qwen3-Omni: images only (its audio is not ours).
AGREE = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5", "llava", "llava_next", "llama4"]
AGREE += ["phi3_v", "gemma4", "glm5_next", "qwen3_omni_moe", "gemma4_unified", "minimax_m3_vl"]
AGREE += ["inkling"]
AGREE += ["kimi_k25"]
AGREE += ["nemotron_h_omni"]
#: Families smg 1.13.0 serves where this vLLM-servicer agreement cannot compare: skipped with
#: the reason given here.
PENDING: dict[str, str] = {}
#: Families whose requests smg 1.13.0 builds for TokenSpeed workers only: agreed against our
#: TokenSpeed builder through the TokenSpeed reference servicer (``--backend tokenspeed``).
#: Nemotron-H-Omni: its spec (registry/nemotron_omni.rs) declares EncoderInputFormat::Packed,
#: which capability.rs lets only TokenSpeed read (a vLLM worker gets the raw media instead).
TOKENSPEED_AGREE = {"nemotron_h_omni"}
# smg 1.13.0's GLM spec (glm53_flash.rs) matches model_type glm53_flash or glm5_next only, not
# glm4v / glm46v / glm4v_moe (GLM-4.1V, 4.5V, 4.6V): those have nothing to agree with.
# smg 1.13.0 has no spec for Gemma 3, InternVL, Idefics3, SmolVLM, Pixtral or Phi-4-multimodal
# (its registry: deepseek_v41, gemma4, glm53_flash, inkling, kimi_k3, kimi_k25, llama4,
# minimax_m3, nemotron_omni, llava_next, llava, qwen3_asr, qwen3_omni, qwen3_vl, qwen_vl,
# phi3_v), so there is nothing to agree with for them.

#: transformers' processor of each family: (module, class).
TRANSFORMERS_PROCESSOR = {
    "qwen2_vl": ("qwen2_vl", "Qwen2VLProcessor"),
    "qwen2_5_vl": ("qwen2_5_vl", "Qwen2_5_VLProcessor"),
    "qwen3_vl": ("qwen3_vl", "Qwen3VLProcessor"),
    "qwen3_5": ("qwen3_vl", "Qwen3VLProcessor"),  # Qwen3.5's processor_config.json names it
    "llava": ("llava", "LlavaProcessor"),
    "llava_next": ("llava_next", "LlavaNextProcessor"),
    "llama4": ("llama4", "Llama4Processor"),
    "glm5_next": ("glm5_next", "Glm5NextProcessor"),
    "qwen3_omni_moe": ("qwen3_omni_moe", "Qwen3OmniMoeProcessor"),
    "minimax_m3_vl": ("minimax_m3_vl", "MiniMaxM3VLProcessor"),
    "kimi_k25": ("kimi_k25", "Kimi_K25Processor"),
    "nemotron_h_omni": ("nemotron_h_omni", "NemotronH_Omni_Reasoning_V3Processor"),
}

# -- where smg 1.13.0 and we differ, and who matches transformers (asserted below) ------------
#: smg's Qwen-VL spec (registry/qwen_vl.rs) fills each image's run, and im_token_id, with
#: config.json's vision_token_id — 151654 <|vision_pad|> in the published Qwen2-VL and
#: Qwen2.5-VL configs — where transformers' Qwen2VLProcessor / Qwen2_5_VLProcessor and vLLM's
#: models write image_token_id 151655 <|image_pad|> (as we do).
VISION_PAD_RUNS = {"qwen2_vl", "qwen2_5_vl"}
#: smg's Qwen3-VL spec sends its model-wide keep_on_cpu_keys (image_grid_thw and
#: video_grid_thw) with an image batch; vLLM's servicer consults them only for the tensors
#: present, so the extra name is harmless (our decoder ignores it the same way).
#: Gemma 4 agrees on everything but pixels: smg's Gemma 4 processor (vision/processors/gemma4.rs)
#: resizes with its own torch-style antialiased bicubic where transformers'
#: Gemma4ImageProcessorPil (and we) use Pillow's, up to 2/255 apart; the tokens (boi, one
#: <|image|> per soft token, eoi), the placeholder ranges over the whole replacement with only
#: the soft tokens embedded, and pixel_position_ids (transformers' image_position_ids, renamed
#: as vLLM's Gemma4MultiModalProcessor does) are identical. Our input_ids against
#: Gemma4Processor: tests/vision/test_gemma4.py (its constructor needs an audio feature
#: extractor and a torch-only video processor, so it is not in TRANSFORMERS_PROCESSOR).
#: Gemma 4 unified: smg 1.13.0 takes model_type gemma4_unified for Gemma 4 (its Gemma4Spec
#: matches "gemma4" | "gemma4_unified", its image processor registry the "gemma4" pattern) and
#: sends Gemma 4's unmerged 16-pixel patches, pixel_values (n, 2520, 768) and pixel_position_ids
#: (n, 2520, 2), where Gemma4UnifiedImageProcessor (and we) send the k x k merged patches
#: (n, 280, 6912) with the kernels' positions (n, 280, 2), which vLLM's
#: Gemma4UnifiedForConditionalGeneration embeds (its patch_dense takes model_patch_size² · 3 =
#: 6912 values). The tokens, ranges and masks agree (patches / k² = merged patches).
UNMERGED_PATCHES = {"gemma4_unified": {"pixel_values": 768, "pixel_position_ids": 2}}
EXTRA_CPU_KEYS = {
    "qwen3_vl": {"video_grid_thw"},
    "qwen3_5": {"video_grid_thw"},
    "glm5_next": {"video_grid_thw"},
    "minimax_m3_vl": {"video_grid_thw"},
}
#: smg's GLM-5.3-Flash / GLM-5-next spec (registry/glm53_flash.rs field_layouts) also lists its
#: video tensors in batched_keys of an image batch; vLLM's servicer registers only the tensors
#: present (and our decoder ignores the other modality's names the same way).
EXTRA_BATCHED_KEYS = {"glm5_next": {"video_grid_thw", "patches_per_video", "video_second_per_grid"}}
#: smg's Phi-3-vision spec (registry/phi3_v.rs) also sends the hub processor's num_img_tokens,
#: unlisted in batched_keys (so "shared"); vLLM's Phi3VForCausalLM takes pixel_values and
#: image_sizes only (its _get_mm_fields_config), as we send, so the extra tensor goes unused.
EXTRA_TENSORS = {"phi3_v": {"num_img_tokens"}}
#: smg's LLaVA-NeXT token count (vision/processors/llava.rs, calculate_num_tokens) unpads with
#: f32 round() where transformers' LlavaNextProcessor (and vLLM) truncate int(round(x, 7)): for
#: the 512 x 600 photo on its 2 x 2 grid (48 x 48 features) the width is 512 * 48 / 600 = 40.96
#: -> smg 41 (padding 3, 42 columns), transformers 40 (padding 4, 40 columns): 48 * 42 + 48 +
#: 576 = 2640 tokens against 48 * 40 + 48 + 576 = 2544. The 700 x 300 image agrees (1944).
LLAVA_NEXT_COUNTS = {"smg": (2640, 1944), "transformers": (2544, 1944)}
#: Pixel gaps beyond normalisation rounding, from resize geometry (ours are transformers'):
#: LLaVA-1.5's shortest-edge resize of 512 x 600 is 336 x 393 in transformers (int truncation),
#: 336 x 394 in smg (round), so its center crop is shifted; LLaVA-NeXT's anyres resize of the
#: 700 x 300 image is 785 x 336 in transformers (ceil(700 * 336 / 300) in float64) and 784 x 336
#: in smg (float32), so the pad/content boundary of its crops moves by a column.
#: Phi-3-vision's global image is a bicubic downscale (torch's interpolate in the hub processor,
#: which we match bit for bit: tests/goldens/torch); smg's own bicubic differs from it by up to
#: 0.12 after normalisation (mean 1.7e-3, 53 % of values exactly equal).
PIXEL_BOUND = {"llava": 3.0, "llava_next": 4.0, "phi3_v": 0.2}
#: smg's Inkling spec (registry/inkling.rs) starts each image's placeholder range one token
#: early, at the template's <|content_image|> (with_structural_prefix(1)), not embedded; ours
#: covers the run InklingProcessor writes in place of <|unused_200054|>. The tokens and the
#: embedded positions are the same.
STRUCTURAL_PREFIX = {"inkling": 1}
#: smg's Nemotron-Omni spec (registry/nemotron_omni.rs, with_feature_span(1, count)) places
#: each image's range over its <image> run only; ours covers the whole replacement NemotronH_
#: Omni_Reasoning_V3Processor writes (<img>, the run, </img>) with the run embedded (the
#: placeholder_token_id mask). The tokens, the embedded positions and the side tensors are the
#: same; so are the items' modality and placeholder_token_id (18).
FEATURE_SPAN_ONLY = {"nemotron_h_omni": (1, 1)}
#: Nemotron-H-Omni's pixels to TokenSpeed, both in bfloat16 (the TokenSpeed default): smg
#: normalises x / 255 - mean, then / std (vision/processors/nemotron_omni.rs), where
#: transformers (and we) compute the fused (x - 255 mean) / (255 std) in float32; the float32
#: values then differ in their last bits, which survives bfloat16 rounding in a few values:
#: 75 of 933 888 for the 512 x 600 photo, 117 of 844 800 for the 700 x 300 image, at most
#: 2^-7 apart (one bfloat16 step in [1, 2)).
TOKENSPEED_PIXELS = {"nemotron_h_omni": (2.0**-7, 2e-4)}


class Agreement:
    """One family's gateway, engine and model directory."""

    def __init__(
        self,
        family: Family,
        model_dir: Path,
        servicer: RecordingServicer | RecordingTokenSpeedServicer,
        gateway: Gateway,
    ) -> None:
        self.family = family
        self.model_dir = model_dir
        self.servicer = servicer
        self.gateway = gateway


@pytest.fixture(
    scope="class",
    params=[
        *AGREE,
        *(pytest.param(f, marks=pytest.mark.skip(reason=r)) for f, r in PENDING.items()),
    ],
)
def agreement(
    request: pytest.FixtureRequest,
    smg_binary: Path,
    closed_port: int,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Agreement]:
    family = FAMILIES[request.param]()
    model_dir = write_model_dir(family, tmp_path_factory.mktemp("agree") / family.name)
    # supports_vision: Phi-3-vision's config names its tower img_processor, not vision_config
    toy = ToyModel.from_dir(
        model_dir, token_low=TOKEN_LOW, token_high=TOKEN_HIGH, supports_vision=True
    )
    tokenspeed = family.family in TOKENSPEED_AGREE
    servicer = (RecordingTokenSpeedServicer if tokenspeed else RecordingServicer)(toy)
    log = tmp_path_factory.mktemp("smg-logs") / f"{family.name}.log"
    backend = ("--backend", "tokenspeed") if tokenspeed else ()
    with ReferenceServer("tokenspeed" if tokenspeed else "vllm", servicer) as server:
        gateway = Gateway(smg_binary, server.target, model_dir, closed_port, log, *backend)
        try:
            yield Agreement(family, model_dir, servicer, gateway)
        finally:
            gateway.stop()


def _render(family: Family, messages: list[dict[str, Any]]) -> str:
    """The directory's chat template, image parts as ``{"type": "image"}`` (as smg renders)."""
    import jinja2

    parts = [
        {
            **m,
            "content": [{"type": "image"} if c["type"] == "image_url" else c for c in m["content"]],
        }
        for m in messages
    ]
    extra = family.tokenizer_extra
    template = jinja2.Environment(undefined=jinja2.StrictUndefined).from_string(family.template)
    return template.render(
        messages=parts,
        add_generation_prompt=True,
        bos_token=extra.get("bos_token") or "",
        eos_token=extra.get("eos_token") or "",
    )


def _transformers_ids(
    family: Family, model_dir: Path, text: str, images: list[bytes], outputs: dict[str, Any]
) -> list[int]:
    """transformers' processor of the family on ``text``, with a tokenizer built from the
    directory's tokenizer.json; its image processor hands back our processor's outputs (their
    bit-exactness with transformers is tests/vision's; Llama 4's is torchvision-only)."""
    import importlib

    from transformers import BatchFeature, PreTrainedTokenizerFast
    from transformers.image_processing_utils import BaseImageProcessor

    module, name = TRANSFORMERS_PROCESSOR[family.family]
    processor_class = getattr(
        importlib.import_module(f"transformers.models.{module}.processing_{module}"), name
    )

    class Outputs(BaseImageProcessor):  # type: ignore[misc]
        model_input_names: ClassVar[list[str]] = list(outputs)
        merge_size = family.preprocessor.get("merge_size", 2)
        image_grid_pinpoints = family.preprocessor.get("image_grid_pinpoints")
        size = family.preprocessor.get("size")
        downsample_ratio = family.preprocessor.get("downsample_ratio")

        def __call__(self, images: Any, **kwargs: Any) -> Any:
            return BatchFeature(outputs)

        preprocess = __call__

    class Processor(processor_class):  # type: ignore[misc, valid-type]
        # The Qwen processors check their (absent) video processor against transformers'
        # video-processor registry, which is empty without torchvision; nothing else is changed.
        def check_argument_for_proper_class(self, argument_name: str, argument: Any) -> None:
            return None

    specials = {k: v for k, v in family.tokenizer_extra.items() if k.endswith("_token") and v}
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_file=str(model_dir / "tokenizer.json"), **specials
    )
    # MiniMaxM3VLProcessor takes a video processor too (torchvision-only): none for images
    videos: dict[str, Any] = {"video_processor": None} if family.family == "minimax_m3_vl" else {}
    if family.family == "nemotron_h_omni":  # and an audio feature extractor: none for images
        videos = {"video_processor": None, "feature_extractor": None}
    processor = Processor(
        image_processor=Outputs(),
        tokenizer=tokenizer,
        **(family.processor_config or {}),
        **videos,
    )
    pil = [Image.open(io.BytesIO(b)) for b in images]
    ids = processor(text=text, images=pil)["input_ids"]
    return [int(i) for i in np.asarray(ids).reshape(-1)]


def _png_url(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode()


def _agreement_images() -> list[bytes]:
    """The photo (512 x 600) and a landscape crop of it resized to 700 x 300."""
    photo = _photo()
    wide = photo.crop((0, 100, 512, 320)).resize((700, 300), Image.Resampling.BICUBIC)
    return [photo_bytes(photo), photo_bytes(wide)]


def _embedded(batch: Any) -> list[int]:
    """The prompt positions that take encoder embeddings (a range without a mask: all)."""
    out: list[int] = []
    for (offset, length), item in zip(batch.placeholders, batch.items, strict=True):
        mask = np.ones(length, dtype=bool) if item.embed_mask is None else item.embed_mask
        out += [offset + int(i) for i in np.flatnonzero(mask)]
    return out


def _without(ids: Any, ranges: Any) -> list[int]:
    """``ids`` with the placeholder ranges cut out."""
    keep = np.ones(len(ids), dtype=bool)
    for offset, length in ranges:
        keep[offset : offset + length] = False
    return [int(i) for i in np.asarray(ids)[keep]]


class TestAgreement:
    """The gateway's request as the servicer received it against our builder's."""

    @pytest.mark.parametrize("n", [1, 2])
    def test_request(self, agreement: Agreement, n: int) -> None:
        from tokenizers import Tokenizer

        from smg_grpc_proto.engines import vllm

        family, servicer, key = agreement.family, agreement.servicer, agreement.family.name
        images = _agreement_images()[:n]
        messages = [
            {
                "role": "user",
                "content": [
                    *(
                        {
                            "type": "image_url",
                            "image_url": {"url": _png_url(b)},
                        }
                        for b in images
                    ),
                    {"type": "text", "text": "Compare these two pictures."},
                ],
            }
        ]
        with _lock:
            before = set(servicer.requests)
            agreement.gateway.chat(messages, max_tokens=4)
            request_id = _only_new(servicer, before)
        if family.family in TOKENSPEED_AGREE:
            _agree_tokenspeed(agreement, request_id, messages, images)
            return
        assert isinstance(servicer, RecordingServicer)
        theirs_request = servicer.raw[request_id]
        (theirs,) = vllm.decode_mm_inputs(theirs_request)  # inline: decodable again
        (seen,) = servicer.decoded[request_id]  # the engine read it too
        assert seen.placeholders == theirs.placeholders
        theirs_mm = theirs_request.message.mm_inputs

        # ours: the same template with the published anchor, the same tokenizer file
        text = _render(family, messages)
        assert text.count(family.gateway_anchor) == n
        text = text.replace(family.gateway_anchor, family.anchor)
        tokenizer = Tokenizer.from_file(str(agreement.model_dir / "tokenizer.json"))
        prompt = tokenizer.encode(text, add_special_tokens=False).ids
        media = VisionModel.from_pretrained(agreement.model_dir).prepare(images)
        ours_request = vllm.generate_request("ours", prompt, media)
        (ours,) = vllm.decode_mm_inputs(ours_request)
        ours_mm = ours_request.message.mm_inputs
        their_ids = list(theirs_request.message.tokenized.input_ids)
        our_ids = list(ours_request.message.tokenized.input_ids)

        # we write transformers' input_ids (Phi-3-vision's processor is remote code: none)
        if family.family in TRANSFORMERS_PROCESSOR:
            outputs = {k: np.asarray(v) for k, v in media.output.tensors().items()}
            assert our_ids == _transformers_ids(family, agreement.model_dir, text, images, outputs)

        # layout: the same keys and tensors
        assert dict(theirs_mm.flat_keys) == dict(ours_mm.flat_keys)
        extra_batched = EXTRA_BATCHED_KEYS.get(family.family, set())
        assert extra_batched <= set(theirs_mm.batched_keys)
        their_batched = [k for k in theirs_mm.batched_keys if k not in extra_batched]
        assert sorted(their_batched) == sorted(ours_mm.batched_keys)
        for mm in (theirs_mm, ours_mm):
            assert not mm.HasField("encoder_input_key")  # both: pixel_values
        extra = EXTRA_CPU_KEYS.get(family.family, set())
        assert set(theirs_mm.keep_on_cpu_keys) == set(ours_mm.keep_on_cpu_keys) | extra
        extra_tensors = EXTRA_TENSORS.get(family.family, set())
        assert extra_tensors <= set(theirs.tensors)
        for name in extra_tensors:
            assert theirs.layout[name] == "shared"
        unmerged = UNMERGED_PATCHES.get(family.family, {})
        for name, width in unmerged.items():  # Gemma 4's layout: 2520 patches of 16 pixels
            assert theirs.tensors[name].shape == (n, 2520, width), name
            assert ours.tensors[name].shape[:2] == (n, 280), name
        assert {
            k: v.shape
            for k, v in theirs.tensors.items()
            if k not in extra_tensors and k not in unmerged
        } == {k: v.shape for k, v in ours.tensors.items() if k not in unmerged}
        for name, array in ours.tensors.items():  # the side tensors (grids, sizes) exactly
            if name != "pixel_values" and name not in unmerged:
                np.testing.assert_array_equal(theirs.tensors[name], array, err_msg=f"{key} {name}")

        # tokens, placeholder ranges, embed masks
        if family.family in VISION_PAD_RUNS:
            vision_pad = family.config["vision_token_id"]
            assert (vision_pad, media.token_id) == (151654, 151655)
            assert theirs.im_token_id == vision_pad
            assert ours.im_token_id == media.token_id
            assert theirs.placeholders == ours.placeholders
            swapped = [vision_pad if t == media.token_id else t for t in our_ids]
            assert their_ids == swapped
        elif family.family in STRUCTURAL_PREFIX:
            k = STRUCTURAL_PREFIX[family.family]
            assert their_ids == our_ids
            assert theirs.im_token_id == ours.im_token_id
            assert theirs.placeholders == tuple((o - k, n + k) for o, n in ours.placeholders)
            assert _embedded(theirs) == _embedded(ours)
        elif family.family == "llava_next":
            assert theirs.im_token_id == ours.im_token_id
            assert tuple(p[1] for p in theirs.placeholders) == LLAVA_NEXT_COUNTS["smg"][:n]
            assert tuple(p[1] for p in ours.placeholders) == LLAVA_NEXT_COUNTS["transformers"][:n]
            assert _without(their_ids, theirs.placeholders) == _without(our_ids, ours.placeholders)
        else:
            assert their_ids == our_ids
            assert theirs.im_token_id == ours.im_token_id
            assert theirs.placeholders == ours.placeholders
            for t, o in zip(theirs.items, ours.items, strict=True):
                if o.embed_mask is None:
                    assert t.embed_mask is None
                else:
                    assert t.embed_mask is not None
                    np.testing.assert_array_equal(t.embed_mask, o.embed_mask)

        # pixel values: the same shape, values apart by normalisation and resize rounding (and
        # for Llama 4 by bfloat16: transformers normalises in bfloat16, as we do; smg in float32)
        if unmerged:
            return
        mine = np.asarray(ours.tensors["pixel_values"], dtype=np.float32)
        gap = np.abs(np.asarray(theirs.tensors["pixel_values"], dtype=np.float32) - mine)
        print(
            f"gateway vs ours [{key}, {n} image(s), {list(mine.shape)}, smg "
            f"{theirs.wire_dtypes['pixel_values']} / ours {ours.wire_dtypes['pixel_values']}]: "
            f"max |diff| {gap.max():.4f}, mean {gap.mean():.2e}, "
            f"exactly equal {float(np.mean(gap == 0)):.1%}"
        )
        assert float(gap.max()) < PIXEL_BOUND.get(family.family, 0.1)


def _agree_tokenspeed(
    agreement: Agreement, request_id: str, messages: list[dict[str, Any]], images: list[bytes]
) -> None:
    """The gateway's TokenSpeed request against our TokenSpeed builder's: one item per image."""
    from tokenizers import Tokenizer

    from smg_grpc_proto.engines import tokenspeed
    from smg_grpc_proto.generated import common_pb2

    family, servicer, n = agreement.family, agreement.servicer, len(images)
    theirs_request = servicer.raw[request_id]
    theirs = tokenspeed.decode_mm_inputs(theirs_request)  # inline: decodable again
    assert [b.items[0].placeholders for b in servicer.decoded[request_id]] == [
        b.items[0].placeholders for b in theirs
    ]  # the engine read it too

    text = _render(family, messages)
    assert text.count(family.gateway_anchor) == n
    text = text.replace(family.gateway_anchor, family.anchor)
    tokenizer = Tokenizer.from_file(str(agreement.model_dir / "tokenizer.json"))
    prompt = tokenizer.encode(text, add_special_tokens=False).ids
    media = VisionModel.from_pretrained(agreement.model_dir).prepare(images)
    # to_message: the bytes as they travel (bfloat16 for both, TokenSpeed's default)
    ours_request = tokenspeed.generate_request("ours", prompt, media).to_message()
    ours = tokenspeed.decode_mm_inputs(ours_request)
    their_ids = list(theirs_request.message.tokenized.input_ids)
    our_ids = list(ours_request.tokenized.input_ids)

    # the prompt: the same ids, and transformers' processor writes them too
    assert their_ids == our_ids
    outputs = {k: np.asarray(v) for k, v in media.output.tensors().items()}
    assert our_ids == _transformers_ids(family, agreement.model_dir, text, images, outputs)

    # the items: one per image, in prompt order, the same modality and placeholder token
    their_items = theirs_request.message.mm_inputs.items
    our_items = ours_request.mm_inputs.items
    assert len(their_items) == len(our_items) == len(theirs) == len(ours) == n
    for t_item, o_item in zip(their_items, our_items, strict=True):
        assert t_item.modality == o_item.modality == common_pb2.IMAGE
        assert t_item.placeholder_token_id == o_item.placeholder_token_id == media.token_id
        assert len(t_item.content_hash) == len(o_item.content_hash) == 32
        assert set(t_item.model_specific_tensors) == set(o_item.model_specific_tensors)
        assert t_item.encoder_input.dtype == o_item.encoder_input.dtype == "bfloat16"

    # the ranges: smg's cover the feature run only, ours the whole replacement
    before, after = FEATURE_SPAN_ONLY[family.family]
    embedded: list[int] = []
    for t, o in zip(theirs, ours, strict=True):
        assert t.im_token_id == o.im_token_id == media.token_id
        assert t.items[0].placeholders == tuple(
            (offset + before, length - before - after) for offset, length in o.items[0].placeholders
        )
        assert t.items[0].embed_mask is None  # every position of smg's range is embedded
        assert _embedded(t) == _embedded(o)
        embedded += _embedded(o)
    assert embedded == [i for i, tok in enumerate(our_ids) if tok == media.token_id]

    # the tensors: the same names and shapes; grids and patch counts exactly
    bound, share = TOKENSPEED_PIXELS[family.family]
    for i, (t, o) in enumerate(zip(theirs, ours, strict=True)):
        assert {k: v.shape for k, v in t.tensors.items()} == {
            k: v.shape for k, v in o.tensors.items()
        }
        for name, array in o.tensors.items():
            if name != "pixel_values":
                np.testing.assert_array_equal(t.tensors[name], array, err_msg=f"[{i}] {name}")
        mine = np.asarray(o.tensors["pixel_values"], dtype=np.float32)
        gap = np.abs(np.asarray(t.tensors["pixel_values"], dtype=np.float32) - mine)
        differ = float(np.mean(gap != 0))
        print(
            f"gateway vs ours [{family.name}, TokenSpeed, image {i + 1} of {n}, "
            f"{list(mine.shape)}, bfloat16]: {int(np.count_nonzero(gap))} values differ "
            f"({differ:.4%}), max |diff| {gap.max():.6f}"
        )
        assert float(gap.max()) <= bound
        assert differ <= share
