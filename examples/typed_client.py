"""A fully typed client for the vLLM engine service, checked with ``mypy --strict``.

It shows what the shipped stubs give a caller:

* message constructors with keyword arguments typed per field (``repeated uint32`` takes an
  ``Iterable[int]``, ``optional`` scalars also accept ``None``),
* ``WhichOneof`` returning a ``Literal`` of the member names, so a dispatch over it can be
  checked for exhaustiveness,
* ``HasField`` accepting only fields that track presence (message fields, oneof members and
  proto3 ``optional`` scalars),
* ``VllmEngineStub(channel)`` resolving to the blocking stub for a ``grpc.Channel`` and to the
  ``grpc.aio`` stub for a ``grpc.aio.Channel``.

Run it against a server (for instance ``python examples/typed_servicer.py``)::

    python examples/typed_client.py 127.0.0.1:50051 --tokens 1 2 3
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import NoReturn

import grpc
from grpc import aio

from smg_grpc_proto import vllm_engine_pb2, vllm_engine_pb2_grpc

DEFAULT_TIMEOUT_S = 30.0


def _assert_never(value: NoReturn) -> NoReturn:
    """Fail at check time if a branch was forgotten (``typing.assert_never`` is 3.11+)."""
    raise AssertionError(f"unhandled value: {value!r}")


@dataclass
class GenerationResult:
    """Everything the client assembled from one (n = 1) Generate stream."""

    token_ids: list[int] = field(default_factory=list)
    finish_reason: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    chunks: int = 0
    matched_stop: int | str | None = None
    kv_transfer_params_json: str | None = None
    complete: bool = False


def build_request(
    request_id: str,
    input_ids: Sequence[int],
    *,
    max_tokens: int | None = None,
    regex: str | None = None,
    json_schema: str | None = None,
    stop_token_ids: Iterable[int] = (),
    stream: bool = True,
) -> vllm_engine_pb2.GenerateRequest:
    """Build a tokenized ``GenerateRequest`` with an optional structured-output constraint.

    ``regex`` and ``json_schema`` are alternatives of the ``constraint`` oneof of
    ``SamplingParams``; at most one may be given.
    """
    if regex is not None and json_schema is not None:
        raise ValueError("regex and json_schema are mutually exclusive (oneof constraint)")
    sampling = vllm_engine_pb2.SamplingParams(
        temperature=0.0,  # `optional float`: an explicit 0 (greedy) survives the wire
        top_p=1.0,
        max_tokens=max_tokens,  # `optional uint32`: None leaves it unset
        stop_token_ids=stop_token_ids,
        skip_special_tokens=True,
    )
    if regex is not None:
        sampling.regex = regex
    elif json_schema is not None:
        sampling.json_schema = json_schema
    return vllm_engine_pb2.GenerateRequest(
        request_id=request_id,
        tokenized=vllm_engine_pb2.TokenizedInput(input_ids=input_ids),
        sampling_params=sampling,
        stream=stream,
    )


def describe_constraint(params: vllm_engine_pb2.SamplingParams) -> str:
    """Human-readable summary of the ``constraint`` oneof, dispatching on ``WhichOneof``."""
    which = params.WhichOneof("constraint")
    if which is None:
        return "unconstrained"
    if which == "regex":
        return f"regex {params.regex!r}"
    if which == "json_schema":
        return f"json_schema {params.json_schema}"
    if which == "grammar":
        return "grammar"
    if which == "structural_tag":
        return "structural_tag"
    if which == "json_object":
        return "json_object"
    if which == "choice":
        return f"choice of {list(params.choice.choices)}"
    _assert_never(which)


def _apply_complete(result: GenerationResult, done: vllm_engine_pb2.GenerateComplete) -> None:
    """Fold the final ``GenerateComplete`` message into ``result``."""
    result.complete = True
    result.finish_reason = done.finish_reason
    result.prompt_tokens = done.prompt_tokens
    if result.chunks == 0:
        # stream=false: the complete message carries the whole output.
        result.token_ids.extend(done.output_ids)
        result.completion_tokens = done.completion_tokens
    stop = done.WhichOneof("matched_stop")
    if stop == "matched_token_id":
        result.matched_stop = done.matched_token_id
    elif stop == "matched_stop_str":
        result.matched_stop = done.matched_stop_str
    # `optional string`: presence is tracked, so "" and "not sent" are distinguishable.
    if done.HasField("kv_transfer_params_json"):
        result.kv_transfer_params_json = done.kv_transfer_params_json


def accumulate(result: GenerationResult, response: vllm_engine_pb2.GenerateResponse) -> None:
    """Fold one streamed ``GenerateResponse`` into ``result``."""
    kind = response.WhichOneof("response")
    if kind is None:
        raise RuntimeError("GenerateResponse without chunk or complete")
    if kind == "chunk":
        chunk = response.chunk
        result.chunks += 1
        result.token_ids.extend(chunk.token_ids)
        result.prompt_tokens = chunk.prompt_tokens
        result.completion_tokens += chunk.completion_tokens  # per-chunk delta
    elif kind == "complete":
        _apply_complete(result, response.complete)
    else:
        _assert_never(kind)


def health_check(channel: grpc.Channel, timeout: float = DEFAULT_TIMEOUT_S) -> bool:
    """Return whether the engine behind ``channel`` reports itself healthy."""
    stub = vllm_engine_pb2_grpc.VllmEngineStub(channel)
    reply: vllm_engine_pb2.HealthCheckResponse = stub.HealthCheck(
        vllm_engine_pb2.HealthCheckRequest(), timeout=timeout
    )
    return reply.healthy


def generate(
    channel: grpc.Channel,
    request: vllm_engine_pb2.GenerateRequest,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> GenerationResult:
    """Run one Generate call on a blocking channel and assemble the streamed output."""
    stub = vllm_engine_pb2_grpc.VllmEngineStub(channel)
    result = GenerationResult()
    for response in stub.Generate(request, timeout=timeout):
        accumulate(result, response)
    return result


async def generate_async(
    channel: aio.Channel,
    request: vllm_engine_pb2.GenerateRequest,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> GenerationResult:
    """Same as :func:`generate`, over a ``grpc.aio`` channel with the async stub."""
    stub: vllm_engine_pb2_grpc.VllmEngineAsyncStub = vllm_engine_pb2_grpc.VllmEngineStub(channel)
    health = await stub.HealthCheck(vllm_engine_pb2.HealthCheckRequest(), timeout=timeout)
    if not health.healthy:
        raise RuntimeError(f"engine unhealthy: {health.message}")
    result = GenerationResult()
    async for response in stub.Generate(request, timeout=timeout):
        accumulate(result, response)
    return result


async def run_async(target: str, request: vllm_engine_pb2.GenerateRequest) -> GenerationResult:
    """Open a ``grpc.aio`` channel to ``target``, generate, and close the channel."""
    async with aio.insecure_channel(target) as channel:
        return await generate_async(channel, request)


def run(target: str, request: vllm_engine_pb2.GenerateRequest) -> GenerationResult:
    """Open a blocking channel to ``target``, check health, generate, and close the channel."""
    with grpc.insecure_channel(target) as channel:
        if not health_check(channel):
            raise RuntimeError(f"engine at {target} is not healthy")
        return generate(channel, request)


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point: ``typed_client.py TARGET [--tokens ...] [--use-async]``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("target", help="host:port of a VllmEngine server")
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--max-tokens", type=int, default=None)
    parser.add_argument("--regex", default=None)
    parser.add_argument("--use-async", action="store_true")
    args = parser.parse_args(argv)
    target: str = args.target
    tokens: list[int] = args.tokens
    max_tokens: int | None = args.max_tokens
    regex: str | None = args.regex
    use_async: bool = args.use_async
    request = build_request("example-1", tokens, max_tokens=max_tokens, regex=regex)
    print(f"constraint: {describe_constraint(request.sampling_params)}")
    result = asyncio.run(run_async(target, request)) if use_async else run(target, request)
    print(
        f"tokens={result.token_ids} finish_reason={result.finish_reason!r} "
        f"chunks={result.chunks} matched_stop={result.matched_stop!r}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
