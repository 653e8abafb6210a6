"""What every torch-goldens generator shares: the pinned reference, the environment record,
and how a tensor, a list of counts or an error is written into a golden case.

``scripts/gen_torch_goldens.py`` writes ``tests/goldens/torch/goldens.json`` (the kernels,
Llama 4, Phi-4-multimodal, Phi-3-vision) and, with ``--family NAME``, one file per family from the
module ``scripts/torch_goldens/NAME.py`` (see ``README.md`` here). Runs only in the torch
reference venv; never imports ``smg_grpc_proto``.
"""

from __future__ import annotations

import hashlib
import platform
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import PIL
import torch
import torchvision
import transformers

ROOT = Path(__file__).resolve().parents[2]

PINNED = {
    "torch": "2.14.1",
    "torchvision": "0.29.1",
    "transformers": "5.24.0",
    "pillow": "13.0.0",
}
N_SAMPLES = 24
WHOLE_INT_LIMIT = 64

OPENAI_CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
OPENAI_CLIP_STD = [0.26862954, 0.26130258, 0.27577711]


def _base(version: str) -> str:
    """``2.14.1+cu130`` -> ``2.14.1`` (the local build tag does not change CPU kernels)."""
    return version.split("+")[0]


def check_versions() -> None:
    found = {
        "torch": _base(torch.__version__),
        "torchvision": _base(torchvision.__version__),
        "transformers": transformers.__version__,
        "pillow": PIL.__version__,
    }
    if found != PINNED:
        raise SystemExit(f"the goldens need {PINNED}, this environment has {found}")
    if sys.byteorder != "little":
        raise SystemExit("the goldens hash little-endian bytes")


def cpu_info() -> tuple[str, bool]:
    """The CPU model string and whether it has AVX2 (torch's uint8 resize kernel is AVX2)."""
    model, avx2 = "", False
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and not model:
            model = value.strip()
        elif key.strip() == "flags":
            avx2 = avx2 or "avx2" in value.split()
    return model or platform.processor() or "unknown", avx2


def versions() -> dict[str, Any]:
    model, avx2 = cpu_info()
    return {
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "transformers": transformers.__version__,
        "pillow": PIL.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "cpu_model": model,
        "cpu_avx2": avx2,
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch_num_threads": torch.get_num_threads(),
    }


# ---------------------------------------------------------------------------------------------
# Recording


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def tensor_bytes(t: torch.Tensor) -> bytes:
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy().tobytes()


def sample_positions(n: int) -> list[int]:
    """Deterministic flat indices: 0, n - 1 and one pseudo-random index in each of 22 equal
    strata (so samples land in every tile/channel, not on a stride that aliases the layout)."""
    if n <= N_SAMPLES:
        return list(range(n))
    picks = {0, n - 1}
    strata = N_SAMPLES - 2
    for i in range(strata):
        lo, hi = i * n // strata, (i + 1) * n // strata
        picks.add(lo + (i * 2654435761 + 40503) % (hi - lo))
    return sorted(picks)


def tensor_record(name: str, t: torch.Tensor) -> dict[str, Any]:
    t = t.detach().cpu().contiguous()
    flat = t.reshape(-1)
    record: dict[str, Any] = {
        "name": name,
        "shape": list(t.shape),
        "dtype": str(t.dtype).removeprefix("torch."),
        "sha256": sha256(tensor_bytes(t)),
        "samples": [[i, float(flat[i].item())] for i in sample_positions(flat.numel())],
    }
    if not t.is_floating_point() and t.numel() <= WHOLE_INT_LIMIT:
        record["values"] = t.tolist()
    return record


def values_record(name: str, values: Iterable[Any]) -> dict[str, Any]:
    return {"name": name, "values": [int(v) for v in values]}


def error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def chw(a: np.ndarray) -> torch.Tensor:
    """uint8 HxWx3 -> uint8 3xHxW, contiguous (what the processors get, no format guessing)."""
    return torch.from_numpy(np.array(a)).permute(2, 0, 1).contiguous()


def run_processor(
    processor: Callable[..., Any],
    arrays: Sequence[np.ndarray],
    outputs: dict[str, str],
    counts: Callable[[Any], Iterable[int]] | None = None,
) -> list[dict[str, Any]]:
    """Call a transformers image processor on ``arrays`` (each as a uint8 CHW tensor, so no
    format guessing) and record its outputs: ``outputs`` maps the processor's key to the name
    the golden stores, which is our ``ProcessorOutput`` attribute; ``counts`` gives the
    placeholder tokens per image from the BatchFeature, stored as ``num_image_tokens``."""
    feature = processor([chw(a) for a in arrays], return_tensors="pt")
    records = [tensor_record(ours, torch.as_tensor(feature[key])) for key, ours in outputs.items()]
    if counts is not None:
        records.append(values_record("num_image_tokens", counts(feature)))
    return records


def processor_case(
    kind: str,
    names: Sequence[str],
    config: dict[str, Any],
    run: Callable[[], list[dict[str, Any]]],
) -> dict[str, Any]:
    """One case: its id, inputs and config, and either ``outputs`` (what ``run`` returned) or
    ``error`` (what the reference raised: ours must then raise a ``ValueError``)."""
    tag = ",".join(f"{k}={v}" for k, v in config.items()) or "default"
    case: dict[str, Any] = {
        "id": f"{kind}/{'+'.join(names)}/{tag}",
        "kind": kind,
        "input": names[0] if len(names) == 1 else list(names),
        "config": config,
    }
    try:
        case["outputs"] = run()
    except Exception as exc:  # the reference rejects the input: our side must too
        case["error"] = error_text(exc)
    return case
