"""``smg-proto preprocess``: run an :class:`ImageProcessor` over image files, write the tensors.

The argument parsing lives in :mod:`smg_grpc_proto.cli`; this module does the work. Images are
processed in chunks (each chunk in parallel across the cores) so that a progress bar can follow
a large batch; the written tensors equal those of one ``processor(all_images)`` call.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import numpy.typing as npt

from smg_grpc_proto.errors import ImageDecodeError, ImageProcessingError, SmgProtoError
from smg_grpc_proto.vision._config import FAMILIES
from smg_grpc_proto.vision._export import (
    SAFETENSORS_HINT,
    ExportFormat,
    safetensors_available,
    write_tensors,
)
from smg_grpc_proto.vision._processor import ImageProcessor

__all__ = [
    "IMAGE_SUFFIXES",
    "PreprocessError",
    "ProgressBar",
    "collect_images",
    "load_processor",
    "preprocess",
    "run",
]

IMAGE_SUFFIXES: frozenset[str] = frozenset(
    {".jpg", ".jpeg", ".jpe", ".jfif", ".png", ".apng", ".gif", ".bmp", ".dib", ".webp"}
)
"""File suffixes (case-insensitive) a directory argument expands to."""

PROGRESS_MIN_IMAGES = 8
"""The bar is drawn only for batches larger than this."""


class PreprocessError(Exception):
    """A usage or input error of ``smg-proto preprocess`` (exit code 2, no traceback)."""


def collect_images(arguments: Sequence[str | os.PathLike[str]]) -> list[Path]:
    """The image files named by ``arguments``: files as given, a directory expanded to its image
    files (by suffix, not recursive) sorted by name."""
    found: list[Path] = []
    for argument in arguments:
        path = Path(argument)
        if path.is_dir():
            inside = sorted(
                p for p in path.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES
            )
            if not inside:
                raise PreprocessError(f"{path}: the directory holds no image files")
            found.extend(inside)
        elif path.is_file():
            found.append(path)
        elif path.exists():
            raise PreprocessError(f"{path}: not a file or directory")
        else:
            raise PreprocessError(f"{path}: no such file or directory")
    if not found:
        raise PreprocessError("no images given")
    return found


def load_processor(
    *,
    config: str | os.PathLike[str] | None = None,
    model_dir: str | os.PathLike[str] | None = None,
    family: str | None = None,
    threads: int | None = None,
) -> ImageProcessor:
    """The processor of exactly one of ``config`` (a ``preprocessor_config.json``), ``model_dir``
    (a directory holding one) or ``family``; errors become :class:`PreprocessError`."""
    given = [x for x in (config, model_dir, family) if x is not None]
    if len(given) != 1:
        raise PreprocessError("give exactly one of --config, --model-dir and --family")
    if threads is not None and threads < 1:
        raise PreprocessError(f"--threads must be at least 1, got {threads}")
    try:
        if family is not None:
            if family not in FAMILIES:
                raise PreprocessError(
                    f"unknown family {family!r}: expected one of {', '.join(FAMILIES)}"
                )
            return ImageProcessor.for_family(family, threads=threads)
        source = Path(config if config is not None else model_dir)  # type: ignore[arg-type]
        if config is not None and source.is_dir():
            raise PreprocessError(f"--config {source}: is a directory (use --model-dir)")
        if model_dir is not None and not source.is_dir():
            raise PreprocessError(f"--model-dir {source}: not a directory")
        return ImageProcessor.from_pretrained(source, threads=threads)
    except PreprocessError:
        raise
    except (OSError, ValueError, TypeError, KeyError) as exc:  # JSONDecodeError is a ValueError
        what = f"--config {config}" if config is not None else f"--model-dir {model_dir}"
        if family is not None:
            what = f"--family {family}"
        raise PreprocessError(f"{what}: {_describe(exc)}") from None


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class ProgressBar:
    """A one-line text bar (``\\r``-redrawn) on ``stream``."""

    def __init__(self, total: int, stream: TextIO, width: int = 30) -> None:
        self.total = total
        self.stream = stream
        self.width = width
        self.done = 0

    def update(self, done: int) -> None:
        self.done = done
        filled = self.width * done // self.total if self.total else self.width
        bar = "#" * filled + "." * (self.width - filled)
        percent = 100 * done // self.total if self.total else 100
        self.stream.write(f"\rpreprocess [{bar}] {done}/{self.total} images {percent:3d}%")
        self.stream.flush()

    def close(self) -> None:
        self.stream.write("\n")
        self.stream.flush()


def _concat(name: str, parts: list[npt.NDArray[Any]]) -> npt.NDArray[Any]:
    if len(parts) == 1:
        return parts[0]
    if name == "pixel_values" and parts[0].ndim == 5:
        # LLaVA-NeXT: (B, tiles, 3, H, W), tiles padded with zeros to the batch's maximum
        # (transformers' _pad_for_batching), so pad every chunk to the overall maximum.
        tiles = max(p.shape[1] for p in parts)
        parts = [
            np.pad(p, [(0, 0), (0, tiles - p.shape[1])] + [(0, 0)] * 3) if p.shape[1] < tiles else p
            for p in parts
        ]
    return np.concatenate(parts, axis=0)


def _failing_image(processor: ImageProcessor, chunk: Sequence[Path], exc: Exception) -> str:
    """Which image of ``chunk`` made it fail, with the reason."""
    index = getattr(exc, "index", None)
    if isinstance(index, int) and 0 <= index < len(chunk):
        return f"{chunk[index]}: {_describe_image_error(exc)}"
    if len(chunk) > 1:
        for path in chunk:
            try:
                processor([path])
            except (SmgProtoError, OSError, ValueError) as single:
                return f"{path}: {_describe_image_error(single)}"
    return f"{chunk[0]}: {_describe_image_error(exc)}" if chunk else str(exc)


def _describe_image_error(exc: BaseException) -> str:
    if isinstance(exc, OSError):
        return _describe(exc)
    if isinstance(exc, (ImageDecodeError, ImageProcessingError)):
        return re.sub(r"^images?\[?\s*\d+\]?:\s*", "", str(exc))  # the index is chunk-relative
    return _describe(exc)


def preprocess(
    processor: ImageProcessor,
    images: Sequence[Path],
    *,
    chunk_size: int | None = None,
    on_progress: Callable[[int], None] | None = None,
) -> dict[str, npt.NDArray[Any]]:
    """Every output tensor of ``processor(images)`` (``num_image_tokens`` as int64 when the
    family knows it), computed in chunks of ``chunk_size`` images."""
    size = chunk_size or max(PROGRESS_MIN_IMAGES, 2 * (processor.threads or os.cpu_count() or 1))
    parts: dict[str, list[npt.NDArray[Any]]] = {}
    tokens: list[int] = []
    tokens_known = True
    for start in range(0, len(images), size):
        chunk = images[start : start + size]
        try:
            out = processor(list(chunk))
        except (SmgProtoError, OSError, ValueError) as exc:
            raise PreprocessError(_failing_image(processor, chunk, exc)) from None
        for name, tensor in out.tensors().items():
            parts.setdefault(name, []).append(tensor)
        if out.num_image_tokens is None:
            tokens_known = False
        else:
            tokens.extend(out.num_image_tokens)
        if on_progress is not None:
            on_progress(start + len(chunk))
    result = {name: _concat(name, arrays) for name, arrays in parts.items()}
    if tokens_known:
        result["num_image_tokens"] = np.asarray(tokens, dtype=np.int64)
    return result


def run(
    images: Sequence[str | os.PathLike[str]],
    *,
    out: str | os.PathLike[str],
    format: ExportFormat | None = None,
    config: str | os.PathLike[str] | None = None,
    model_dir: str | os.PathLike[str] | None = None,
    family: str | None = None,
    threads: int | None = None,
    progress: bool | None = None,
    stderr: TextIO | None = None,
) -> dict[str, npt.NDArray[Any]]:
    """The whole command: returns the tensors written to ``out``. ``format`` defaults to the
    suffix of ``out`` (``.npz`` → npz, else safetensors); ``progress=None`` draws the bar when
    ``stderr`` is a terminal."""
    err = stderr if stderr is not None else sys.stderr
    paths = collect_images(images)
    processor = load_processor(config=config, model_dir=model_dir, family=family, threads=threads)
    target = Path(out)
    if not target.parent.is_dir():
        raise PreprocessError(f"--out {target}: directory {target.parent} does not exist")
    if target.is_dir():
        raise PreprocessError(f"--out {target}: is a directory")
    chosen: ExportFormat = format or ("npz" if target.suffix.lower() == ".npz" else "safetensors")
    if chosen == "safetensors" and not safetensors_available():
        raise PreprocessError(
            f"--out {target}: writing safetensors needs the safetensors package "
            f"({SAFETENSORS_HINT}), or use --format npz"
        )
    show = progress if progress is not None else _isatty(err)
    bar = ProgressBar(len(paths), err) if show and len(paths) > PROGRESS_MIN_IMAGES else None
    try:
        tensors = preprocess(
            processor,
            paths,
            chunk_size=PROGRESS_MIN_IMAGES if bar is not None else None,
            on_progress=bar.update if bar is not None else None,
        )
    finally:
        if bar is not None and bar.done:
            bar.close()
    metadata = {
        "producer": "smg-proto preprocess",
        "family": processor.family,
        "config": json.dumps(processor.config, sort_keys=True),
        "images": json.dumps([os.fspath(p) for p in paths]),
    }
    try:
        write_tensors(target, tensors, chosen, metadata)
    except OSError as exc:
        raise PreprocessError(f"--out {target}: {_describe(exc)}") from None
    return tensors


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
