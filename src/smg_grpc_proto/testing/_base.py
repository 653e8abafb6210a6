"""What every reference servicer shares: in-flight bookkeeping and abort, the token pacing loop,
the tokenizer bundle, the KV-event heartbeat, admin RPCs, and service registration with the
zero-copy ``Generate`` deserializer.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import hashlib
import importlib
import io
import time
import zipfile
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import grpc
import grpc.aio
from google.protobuf import message_factory
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message import DecodeError, Message

from smg_grpc_proto import shm, tensors
from smg_grpc_proto.engines._tensors import release_shm
from smg_grpc_proto.errors import (
    RemoteTransferError,
    RemoteTransportUnavailableError,
    SmgProtoError,
)
from smg_grpc_proto.generated import common_pb2
from smg_grpc_proto.testing._toy import TOKENIZER_FILES, ToyModel, ToyOutput

if TYPE_CHECKING:
    from smg_grpc_proto.remote import RemotePuller

__all__ = [
    "Context",
    "DecodedObserver",
    "RejectedRequest",
    "ToyEngineCore",
    "add_service",
    "tokenizer_zip",
]

Context = grpc.aio.ServicerContext[Any, Any]
DecodedObserver = Callable[[str, Any, float], None]
"""Called as ``(request_id, decoded, seconds)`` after a servicer decoded a request's multimodal
input (``decoded`` is what the engine's ``decode_mm_inputs`` returned), in the worker thread."""
M = TypeVar("M", bound=Message)
T = TypeVar("T")


@dataclass(frozen=True)
class RejectedRequest:
    """A request whose wire bytes the tensor codec refused (unknown dtype, payload length not
    matching the shape, malformed frames). grpcio would turn a deserializer exception into
    ``UNKNOWN``; handing this to the handler lets it answer ``INVALID_ARGUMENT`` instead."""

    error: SmgProtoError


def tolerant_deserializer(
    message_type: type[M], shm_read: tensors.ShmRead | None = None
) -> Callable[[bytes], tensors.TensorMessage[M] | RejectedRequest]:
    """:func:`smg_grpc_proto.tensors.deserializer` whose errors become a
    :class:`RejectedRequest` instead of an exception inside grpcio. The shared-memory segments
    a refused request names are consumed all the same (when plain protobuf can still parse it),
    so a malformed request leaks nothing into ``/dev/shm``."""
    inner = tensors.deserializer(message_type)

    def deserialize(data: bytes) -> tensors.TensorMessage[M] | RejectedRequest:
        try:
            return inner(data)
        except SmgProtoError as exc:
            with contextlib.suppress(DecodeError):
                release_shm(message_type.FromString(data), None, shm_read)
            return RejectedRequest(exc)

    return deserialize


def _consuming(
    behavior: Callable[..., Any], streaming: bool, shm_read: tensors.ShmRead | None
) -> Callable[..., Any]:
    """``behavior`` followed, however it ends, by consuming the request's shared-memory
    segments (those a decoder read are gone already; a request refused before its decoder ran
    would otherwise leave its segments behind)."""

    def release(request: Any) -> None:
        if isinstance(request, tensors.TensorMessage):
            release_shm(request.message, None, shm_read)
        elif isinstance(request, Message):
            release_shm(request, None, shm_read)

    if streaming:

        async def stream(request: Any, context: Context) -> AsyncIterator[Any]:
            try:
                async for response in behavior(request, context):
                    yield response
            finally:
                release(request)

        return stream

    async def unary(request: Any, context: Context) -> Any:
        try:
            return await behavior(request, context)
        finally:
            release(request)

    return unary


def add_service(
    server: grpc.aio.Server | grpc.Server,
    servicer: object,
    service: ServiceDescriptor,
    *,
    tensor_methods: Iterable[str] = (),
) -> None:
    """Register every RPC of ``service`` on ``server``, served by the servicer's method of the
    same name. Methods in ``tensor_methods`` receive a :class:`~smg_grpc_proto.tensors.
    TensorMessage` (tensors as zero-copy views) or a :class:`RejectedRequest`; the others
    receive plain messages, as with the generated ``add_*Servicer_to_server``.

    The table is built from the service descriptor, so it covers exactly the RPCs of the
    contract, whatever grpcio-tools version generated the stubs.
    """
    zero_copy = frozenset(tensor_methods)
    unknown = zero_copy - {m.name for m in service.methods}
    if unknown:
        raise ValueError(f"{service.full_name} has no method(s) {sorted(unknown)}")
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}
    for method in service.methods:
        request_type = message_factory.GetMessageClass(method.input_type)
        response_type = message_factory.GetMessageClass(method.output_type)
        shm_read = getattr(servicer, "shm_read", None)
        behavior = getattr(servicer, method.name)
        deserializer: Callable[[bytes], Any] = request_type.FromString
        if method.name in zero_copy:
            deserializer = tolerant_deserializer(request_type, shm_read)
            behavior = _consuming(behavior, method.server_streaming, shm_read)
        make = (
            grpc.unary_stream_rpc_method_handler
            if method.server_streaming
            else grpc.unary_unary_rpc_method_handler
        )
        handlers[method.name] = make(
            behavior,
            request_deserializer=deserializer,
            response_serializer=response_type.SerializeToString,
        )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(service.full_name, handlers),)
    )


def tokenizer_zip(model_dir: Path) -> bytes:
    """A reproducible zip of the tokenizer files in ``model_dir`` (fixed timestamps, sorted
    names), so equal directories give byte-equal archives and equal SHA-256 sums."""
    files = sorted(
        p
        for p in model_dir.iterdir()
        if p.is_file() and (p.name in TOKENIZER_FILES or p.suffix == ".jinja")
    )
    if not files:
        raise FileNotFoundError(
            f"{model_dir}: no tokenizer files (looked for {', '.join(TOKENIZER_FILES)}, *.jinja)"
        )
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for path in files:
            info = zipfile.ZipInfo(path.name, date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            archive.writestr(info, path.read_bytes())
    return buffer.getvalue()


class _Run:
    """One in-flight generation: its id and the flag Abort sets."""

    __slots__ = ("aborted", "prompt_tokens", "request_id")

    def __init__(self, request_id: str, prompt_tokens: int) -> None:
        self.request_id = request_id
        self.prompt_tokens = prompt_tokens
        self.aborted = asyncio.Event()


class ToyEngineCore:
    """State and behaviour shared by the reference servicers (mixed in before the generated
    ``*Servicer`` base class). Everything runs on the grpc.aio server's event loop; only
    decoding and hashing of multimodal inputs go to a worker thread."""

    #: Seconds between KV-event heartbeats after the first batch.
    kv_interval_s: float = 1.0

    def __init__(
        self,
        model: ToyModel | None = None,
        *,
        kv_interval_s: float = 1.0,
        on_decoded: DecodedObserver | None = None,
        shm_read: tensors.ShmRead | None = None,
        puller: RemotePuller | None = None,
    ) -> None:
        self.model = model if model is not None else ToyModel()
        # Remote (NIXL) payloads are pulled with this puller, else the process default.
        self.puller = puller
        # A server that cannot tell its shared-memory namespace advertises none and takes no
        # shared-memory payloads (docs/security.md).
        self.shm_read: tensors.ShmRead | None = (
            shm_read if shm_read is not None else (None if shm.namespace_id() else "refuse")
        )
        self.kv_interval_s = kv_interval_s
        self.on_decoded = on_decoded
        self.started = time.time()
        self.last_receive = 0.0
        self._runs: dict[str, list[_Run]] = {}
        self._profiling = False
        self._tokenizer: tuple[bytes, str] | None = None
        self._tokenizer_lock: asyncio.Lock | None = None
        self._completed_tokens = 0

    # -- in-flight requests ----------------------------------------------------------------
    @property
    def active_requests(self) -> int:
        return sum(len(runs) for runs in self._runs.values())

    @property
    def queued_prompt_tokens(self) -> int:
        return sum(run.prompt_tokens for runs in self._runs.values() for run in runs)

    async def begin(self, context: Context, request_id: str, prompt_tokens: int) -> _Run:
        """Register a generation; a second in-flight request with the same non-empty id is
        refused with ``ALREADY_EXISTS`` (Abort could not tell them apart)."""
        if request_id and request_id in self._runs:
            await context.abort(
                grpc.StatusCode.ALREADY_EXISTS,
                f"request_id {request_id!r} is already in flight; ids must be unique",
            )
        self.last_receive = time.time()
        run = _Run(request_id, prompt_tokens)
        self._runs.setdefault(request_id, []).append(run)
        return run

    def end(self, run: _Run) -> None:
        runs = self._runs.get(run.request_id, [])
        if run in runs:
            runs.remove(run)
        if not runs:
            self._runs.pop(run.request_id, None)

    def abort_ids(self, request_ids: Sequence[str]) -> int:
        """Set the abort flag of every in-flight request with one of these ids (unknown ids
        are ignored, as the contracts say); returns how many were found."""
        found = 0
        for request_id in request_ids:
            for run in self._runs.get(request_id, []):
                run.aborted.set()
                found += 1
        return found

    async def produce(self, run: _Run, output: ToyOutput) -> AsyncIterator[int]:
        """The output tokens, one per step, each after ``token_delay_s``; stops as soon as the
        request is aborted (the wait is cut short by the abort flag)."""
        delay = self.model.token_delay_s
        for token in output.token_ids:
            if delay > 0:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(run.aborted.wait(), delay)
            if run.aborted.is_set():
                return
            self._completed_tokens += 1
            yield token

    # -- request checks --------------------------------------------------------------------
    @staticmethod
    async def invalid(context: Context, message: str) -> NoReturn:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, message)

    async def unwrap(
        self, context: Context, request: Any, message_type: type[M]
    ) -> tuple[tensors.TensorMessage[M] | M, M]:
        """The request as received by a tensor method and its plain message: a
        :class:`TensorMessage` (decoders read its zero-copy frames) or a plain message; a
        refused one is aborted with ``INVALID_ARGUMENT``."""
        if isinstance(request, RejectedRequest):
            await self.invalid(context, str(request.error))
        received = request
        message = request.message if isinstance(request, tensors.TensorMessage) else request
        if not isinstance(message, message_type):
            await self.invalid(context, f"expected a {message_type.DESCRIPTOR.full_name}")
        return received, message

    async def check_prompt(self, context: Context, ids: Sequence[int], field: str) -> list[int]:
        prompt = list(ids)
        if not prompt:
            await self.invalid(context, f"{field} is empty: the prompt needs at least one token")
        limit = self.model.max_context_length
        if len(prompt) >= limit:
            await self.invalid(
                context,
                f"{field} holds {len(prompt)} tokens; the context length is {limit}, leaving no "
                "room for output",
            )
        return prompt

    async def check_sampling(
        self, context: Context, *, n: int, n_field: str, max_tokens: int | None, max_field: str
    ) -> None:
        if n > 1:
            await self.invalid(
                context, f"{n_field} = {n}: the toy engine produces a single output (n = 1)"
            )
        if max_tokens is not None and max_tokens < 1:
            await self.invalid(context, f"{max_field} = {max_tokens}: must be at least 1")

    async def check_generate(
        self, context: Context, ids: Sequence[int], params: Any, max_field: str, *, n: int | None
    ) -> tuple[list[int], int | None]:
        """The checks every ``Generate`` runs: a prompt that leaves room for output, one output
        (``n``; ``None`` reads ``params.n``), a token budget of at least 1 from the optional
        ``params.<max_field>``, and ``ignore_eos`` only with a budget. Returns the prompt and
        the budget (``None`` = unset)."""
        prompt = await self.check_prompt(context, ids, "tokenized.input_ids")
        max_tokens = getattr(params, max_field) if params.HasField(max_field) else None
        await self.check_sampling(
            context,
            n=params.n if n is None else n,
            n_field="sampling_params.n",
            max_tokens=max_tokens,
            max_field=f"sampling_params.{max_field}",
        )
        if params.ignore_eos and max_tokens is None:
            await self.invalid(context, f"sampling_params.ignore_eos needs {max_field}")
        return prompt, max_tokens

    async def decode(
        self,
        context: Context,
        request_id: str,
        decode: Callable[[], Any],
        digest: Callable[[Any], bytes],
    ) -> bytes:
        """Run a multimodal decoder and fold its result into the toy model's digest, in a
        worker thread (both touch every byte); report it to ``on_decoded``. Any
        :class:`~smg_grpc_proto.errors.SmgProtoError` becomes ``INVALID_ARGUMENT`` with the
        decoder's message, which names the field and numbers; a remote payload that cannot
        be pulled (exporter unreachable, READ failed or timed out) ``UNAVAILABLE``, and one
        that needs NIXL where it is not installed ``UNIMPLEMENTED``."""

        def work() -> bytes:
            start = time.perf_counter()
            decoded = decode()
            elapsed = time.perf_counter() - start
            if self.on_decoded is not None:
                self.on_decoded(request_id, decoded, elapsed)
            return digest(decoded)

        try:
            return await asyncio.to_thread(work)
        except RemoteTransportUnavailableError as exc:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, str(exc))
        except RemoteTransferError as exc:
            # the exporter could not be reached or the READ failed/timed out: send inline
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        except SmgProtoError as exc:
            await self.invalid(context, str(exc))

    async def adapter(self, context: Context, engine: str) -> Any:
        """``smg_grpc_proto.engines.<engine>``, imported on first use; ``UNIMPLEMENTED`` when
        this installation has no decoder for that engine's multimodal input."""
        try:
            return importlib.import_module(f"smg_grpc_proto.engines.{engine}")
        except ImportError as exc:
            await context.abort(
                grpc.StatusCode.UNIMPLEMENTED,
                f"multimodal input for {engine} needs smg_grpc_proto.engines.{engine}: {exc}",
            )

    # -- tokenizer -------------------------------------------------------------------------
    async def tokenizer_chunks(
        self, context: Context
    ) -> AsyncIterator[common_pb2.GetTokenizerChunk]:
        """The tokenizer zip in ``tokenizer_chunk_bytes`` pieces; the SHA-256 of the whole
        archive rides on the last chunk only (``GetTokenizerChunk.sha256``)."""
        if self.model.model_dir is None:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                "this engine was started without a model directory: no tokenizer to send",
            )
        if self._tokenizer_lock is None:
            self._tokenizer_lock = asyncio.Lock()
        async with self._tokenizer_lock:
            if self._tokenizer is None:
                directory = self.model.model_dir
                try:
                    data = await asyncio.to_thread(tokenizer_zip, directory)
                except OSError as exc:
                    await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
                self._tokenizer = (data, hashlib.sha256(data).hexdigest())
        data, digest = self._tokenizer
        size = self.model.tokenizer_chunk_bytes
        view = memoryview(data)
        for start in range(0, len(data), size):
            last = start + size >= len(data)
            yield common_pb2.GetTokenizerChunk(
                data=bytes(view[start : start + size]), sha256=digest if last else ""
            )

    # -- KV events and load ----------------------------------------------------------------
    def engine_load(self, sample: int, *, load_only: bool) -> common_pb2.EngineLoad:
        load = common_pb2.EngineLoad(
            running_requests=self.active_requests,
            waiting_requests=0,
            waiting_uncached_tokens=0,
            token_usage=0.0,
            max_running_requests=256,
            sample=sample,
            load_only=load_only,
        )
        return load

    async def kv_events(
        self, request: common_pb2.SubscribeKvEventsRequest
    ) -> AsyncIterator[common_pb2.KvEventBatch]:
        """A first batch at once, then one every ``kv_interval_s``. The toy model caches
        nothing, so batches carry no events, only the engine's load. A subscriber that opted
        in (``load_records_before_first_batch``) gets load-only batches numbered 0; others
        get empty publisher batches numbered 1, 2, ... each with the load attached."""
        load_only = request.load_records_before_first_batch
        sequence = 0 if load_only else 1
        sample = 0
        while True:
            sample += 1
            yield common_pb2.KvEventBatch(
                sequence_number=sequence,
                timestamp=time.time(),
                load=self.engine_load(sample, load_only=load_only),
            )
            if not load_only:
                sequence += 1
            await asyncio.sleep(self.kv_interval_s)

    def timestamp(self) -> str:
        return datetime.datetime.now(datetime.timezone.utc).isoformat()

    # -- admin -----------------------------------------------------------------------------
    def flush_cache(self, request: common_pb2.FlushCacheRequest) -> common_pb2.FlushCacheResponse:
        """The toy engine holds no cache; flushing fails only while requests are in flight (the
        contract's rule for ``timeout_s = 0``; a positive timeout is not waited out here)."""
        active = self.active_requests
        if active:
            return common_pb2.FlushCacheResponse(
                success=False, message=f"{active} request(s) in flight; not flushed"
            )
        return common_pb2.FlushCacheResponse(success=True, message="flushed")

    def start_profile(self, request: common_pb2.StartProfileRequest) -> common_pb2.ProfileResponse:
        if self._profiling:
            return common_pb2.ProfileResponse(success=False, message="profiler already running")
        self._profiling = True
        return common_pb2.ProfileResponse(success=True, message="profiler started")

    def stop_profile(self, request: common_pb2.StopProfileRequest) -> common_pb2.ProfileResponse:
        if not self._profiling:
            return common_pb2.ProfileResponse(success=False, message="profiler not running")
        self._profiling = False
        return common_pb2.ProfileResponse(success=True, message="profiler stopped")

    def uptime(self) -> float:
        return time.time() - self.started

    # -- the RPCs every contract declares with the shared smg.grpc.common messages ----------
    # (registered only where the engine's service has them: add_service follows the descriptor)
    async def FlushCache(
        self, request: common_pb2.FlushCacheRequest, context: Context
    ) -> common_pb2.FlushCacheResponse:
        return self.flush_cache(request)

    async def StartProfile(
        self, request: common_pb2.StartProfileRequest, context: Context
    ) -> common_pb2.ProfileResponse:
        return self.start_profile(request)

    async def StopProfile(
        self, request: common_pb2.StopProfileRequest, context: Context
    ) -> common_pb2.ProfileResponse:
        return self.stop_profile(request)

    async def GetTokenizer(
        self, request: common_pb2.GetTokenizerRequest, context: Context
    ) -> AsyncIterator[common_pb2.GetTokenizerChunk]:
        async for chunk in self.tokenizer_chunks(context):
            yield chunk

    async def SubscribeKvEvents(
        self, request: common_pb2.SubscribeKvEventsRequest, context: Context
    ) -> AsyncIterator[common_pb2.KvEventBatch]:
        async for batch in self.kv_events(request):
            yield batch
