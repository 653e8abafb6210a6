"""The deterministic toy model behind every reference servicer.

Given the prompt token ids, a digest of the decoded multimodal inputs and the token budget, the
toy "model" produces output token ids that depend on nothing else: each token is a hash of
``(prompt, digest, position)`` mapped into ``[token_low, token_high)``, a range of ordinary
vocabulary entries, so the ids detokenize into plain text with the model's real tokenizer. Its
natural output length (when it "emits EOS") is derived from the same seed.

Tests compute the expected result of a request with :func:`expected_output` and
:func:`mm_digest` (or :func:`images_digest`) and compare it with what travelled over gRPC: any
change to the prompt, a placeholder range or a single byte of a decoded tensor changes the
output.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import numpy.typing as npt

from smg_grpc_proto._core import native as _native

if TYPE_CHECKING:
    from smg_grpc_proto.engines import DecodedBatch

__all__ = [
    "TOKENIZER_FILES",
    "ToyModel",
    "ToyOutput",
    "expected_output",
    "images_digest",
    "mm_digest",
    "toy_embedding",
]

_DOMAIN = b"smg-grpc-proto/toy-engine/v1\x00"

#: Files of a model directory that GetTokenizer ships (plus every ``*.jinja`` template).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "tokenizer.model",
    "spiece.model",
    "chat_template.json",
    "chat_template.jinja",
    "generation_config.json",
    "config.json",
    "preprocessor_config.json",
    "processor_config.json",
)


@dataclass(frozen=True)
class ToyOutput:
    """What the toy model generates for one request."""

    token_ids: tuple[int, ...]
    finish_reason: Literal["stop", "length"]


@dataclass(frozen=True)
class ToyModel:
    """The model a reference servicer pretends to serve; ``GetModelInfo`` reports it.

    ``token_low``/``token_high`` bound the generated ids (half-open); no EOS id may fall inside,
    so the output never contains a stop token. ``min_length``/``max_length`` bound the natural
    output length (before ``max_tokens``). ``token_delay_s`` is slept before each generated
    token so that streams last long enough to be aborted. ``merge_size`` (Qwen's
    ``spatial_merge_size``) makes the vLLM servicer check each item's placeholder count against
    its grid.
    """

    model_path: str = "toy-model"
    served_model_name: str = "toy-model"
    model_dir: Path | None = None
    vocab_size: int = 151_936
    eos_token_ids: tuple[int, ...] = (151_645,)
    bos_token_id: int = 0
    pad_token_id: int = 151_643
    model_type: str = "qwen2_vl"
    architectures: tuple[str, ...] = ("Qwen2VLForConditionalGeneration",)
    supports_vision: bool = True
    max_context_length: int = 32_768
    merge_size: int | None = 2
    token_low: int = 1_000
    token_high: int = 30_000
    min_length: int = 4
    max_length: int = 24
    token_delay_s: float = 0.0
    embedding_dim: int = 16
    tokenizer_chunk_bytes: int = 256 * 1024
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Free-form facts for servicers (e.g. ``{"model_dtype": "bfloat16"}``)."""

    def __post_init__(self) -> None:
        for name in ("vocab_size", "max_context_length", "embedding_dim", "tokenizer_chunk_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ToyModel.{name} must be a positive int, got {value!r}")
        if not 0 <= self.token_low < self.token_high <= self.vocab_size:
            raise ValueError(
                f"ToyModel token range [{self.token_low}, {self.token_high}) must be non-empty "
                f"and inside the vocabulary [0, {self.vocab_size})"
            )
        inside = [t for t in self.eos_token_ids if self.token_low <= t < self.token_high]
        if inside:
            raise ValueError(
                f"ToyModel eos_token_ids {inside} lie inside the output range "
                f"[{self.token_low}, {self.token_high}); generated ids must never be EOS"
            )
        if not 1 <= self.min_length <= self.max_length:
            raise ValueError(
                f"ToyModel lengths: need 1 <= min_length ({self.min_length}) <= max_length "
                f"({self.max_length})"
            )
        if not (math.isfinite(self.token_delay_s) and self.token_delay_s >= 0):
            raise ValueError(f"ToyModel.token_delay_s must be >= 0, got {self.token_delay_s}")
        if self.merge_size is not None and self.merge_size < 1:
            raise ValueError(f"ToyModel.merge_size must be >= 1, got {self.merge_size}")

    @classmethod
    def from_dir(cls, model_dir: str | Path, **overrides: Any) -> ToyModel:
        """Facts from a Hugging Face model directory's ``config.json`` (and
        ``generation_config.json``): model type, architectures, vocabulary size, EOS ids,
        context length, vision support and merge size. ``overrides`` win."""
        directory = Path(model_dir)
        config = _read_json(directory / "config.json")
        nested = config.get("text_config")
        text: dict[str, Any] = nested if isinstance(nested, dict) else {}
        vision = config.get("vision_config")

        def pick(*names: str) -> Any:
            for source in (config, text):
                for name in names:
                    if source.get(name) is not None:
                        return source[name]
            return None

        facts: dict[str, Any] = {"model_dir": directory, "model_path": str(directory)}
        facts["served_model_name"] = directory.name or str(directory)
        if isinstance(config.get("model_type"), str):
            facts["model_type"] = config["model_type"]
        if isinstance(config.get("architectures"), list):
            facts["architectures"] = tuple(str(a) for a in config["architectures"])
        vocab = pick("vocab_size")
        if isinstance(vocab, int) and vocab > 0:
            facts["vocab_size"] = vocab
        context = pick("max_position_embeddings", "seq_length")
        if isinstance(context, int) and context > 0:
            facts["max_context_length"] = context
        eos = _read_json(directory / "generation_config.json").get("eos_token_id")
        eos = eos if eos is not None else pick("eos_token_id")
        if isinstance(eos, int):
            facts["eos_token_ids"] = (eos,)
        elif isinstance(eos, list):
            facts["eos_token_ids"] = tuple(int(e) for e in eos)
        for name, key in (("bos_token_id", "bos_token_id"), ("pad_token_id", "pad_token_id")):
            value = pick(key)
            facts[name] = value if isinstance(value, int) else 0
        facts["supports_vision"] = isinstance(vision, dict)
        merge = vision.get("spatial_merge_size") if isinstance(vision, dict) else None
        facts["merge_size"] = merge if isinstance(merge, int) else None
        facts.update(overrides)
        vocab_size = facts.get("vocab_size", cls.vocab_size)
        high = min(facts.get("token_high", cls.token_high), vocab_size)
        facts["token_high"] = high
        facts.setdefault("token_low", min(cls.token_low, high - 1))
        return cls(**facts)

    def with_options(self, **changes: Any) -> ToyModel:
        """A copy with some fields changed (validated again)."""
        return replace(self, **changes)

    def generate(
        self,
        prompt_ids: Sequence[int],
        digest: bytes = b"",
        *,
        max_tokens: int | None = None,
        ignore_eos: bool = False,
    ) -> ToyOutput:
        """This model's output for a request (see :func:`expected_output`)."""
        return expected_output(
            prompt_ids,
            digest,
            max_tokens=max_tokens,
            ignore_eos=ignore_eos,
            token_low=self.token_low,
            token_high=self.token_high,
            min_length=self.min_length,
            max_length=self.max_length,
            context_left=self.max_context_length - len(prompt_ids),
        )

    def embed(self, input_ids: Sequence[int]) -> list[float]:
        """This model's embedding of ``input_ids`` (see :func:`toy_embedding`)."""
        return toy_embedding(input_ids, self.embedding_dim)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            loaded = json.load(f)
    except (OSError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def _seed(prompt_ids: Sequence[int], digest: bytes) -> bytes:
    h = hashlib.sha256(_DOMAIN)
    ids = np.asarray(prompt_ids, dtype="<u4")
    h.update(struct.pack("<Q", ids.shape[0]))
    h.update(ids.tobytes())
    h.update(struct.pack("<Q", len(digest)))
    h.update(digest)
    return h.digest()


def expected_output(
    prompt_ids: Sequence[int],
    digest: bytes = b"",
    *,
    max_tokens: int | None = None,
    ignore_eos: bool = False,
    token_low: int = ToyModel.token_low,
    token_high: int = ToyModel.token_high,
    min_length: int = ToyModel.min_length,
    max_length: int = ToyModel.max_length,
    context_left: int | None = None,
) -> ToyOutput:
    """The toy model's output for a prompt, a multimodal digest and a token budget.

    The natural length ``L`` lies in ``[min_length, max_length]``. Without ``ignore_eos`` the
    output has ``min(L, max_tokens)`` tokens and ends with ``"stop"`` when ``L`` fits (the
    model "emitted EOS", which is not part of the output) else ``"length"``. With
    ``ignore_eos`` it runs to ``max_tokens`` (which is then required) and ends with
    ``"length"``. ``context_left`` (context length minus prompt length) caps the output too.
    """
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"max_tokens = {max_tokens}: must be at least 1")
    if ignore_eos and max_tokens is None:
        raise ValueError("ignore_eos needs max_tokens (the output would never end)")
    seed = _seed(prompt_ids, digest)
    natural = min_length + int.from_bytes(seed[:8], "little") % (max_length - min_length + 1)
    budget = max_tokens if max_tokens is not None else natural
    if context_left is not None:
        budget = min(budget, max(context_left, 0))
    count = budget if ignore_eos else min(natural, budget)
    stop = not ignore_eos and natural <= budget
    span = token_high - token_low
    tokens = tuple(
        token_low
        + int.from_bytes(hashlib.sha256(seed + struct.pack("<Q", i)).digest()[:8], "little") % span
        for i in range(count)
    )
    return ToyOutput(tokens, "stop" if stop else "length")


def mm_digest(batches: Iterable[DecodedBatch]) -> bytes:
    """Digest of decoded multimodal batches: per batch its modality, per item its placeholder
    ranges, content hash and the bytes, dtype and shape of every tensor of the item (BLAKE3,
    native, no copies). Empty (``b""``, the text-only digest) when there are no batches."""
    parts: list[bytes | npt.NDArray[Any]] = [_DOMAIN + b"mm"]
    for b, batch in enumerate(batches):
        parts.append(f"batch {b} {batch.modality} {len(batch.items)}".encode())
        for item in batch.items:
            ranges = " ".join(f"{offset}+{length}" for offset, length in item.placeholders)
            parts.append(f"item {item.index} {ranges} {item.content_hash or ''}".encode())
            for name in sorted(item.tensors):
                array = np.ascontiguousarray(item.tensors[name])
                parts += [f"{name} {array.dtype.name} {list(array.shape)}".encode(), array]
    return b"" if len(parts) == 1 else _native.media_digest(parts)


def images_digest(images: Iterable[bytes]) -> bytes:
    """Digest of encoded image files (TensorRT-LLM's multimodal input), in order."""
    h = hashlib.sha256(_DOMAIN + b"images\x00")
    for image in images:
        h.update(struct.pack("<Q", len(image)))
        h.update(image)
    return h.digest()


def toy_embedding(input_ids: Sequence[int], dim: int) -> list[float]:
    """A deterministic unit vector of ``dim`` float32 values for ``input_ids``."""
    seed = _seed(input_ids, b"embed")
    raw = b"".join(hashlib.sha256(seed + struct.pack("<Q", i)).digest() for i in range(dim))
    values = np.frombuffer(raw, dtype="<u4")[:dim].astype(np.float64) / 2**32 - 0.5
    norm = float(np.linalg.norm(values)) or 1.0
    return [float(v) for v in (values / norm).astype(np.float32)]
