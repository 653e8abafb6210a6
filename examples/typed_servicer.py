"""A fully typed (toy) vLLM engine servicer, checked with ``mypy --strict``.

``EchoEngineServicer`` answers ``HealthCheck`` and streams the prompt's token ids back from
``Generate``, one ``GenerateStreamChunk`` per token followed by a ``GenerateComplete``; it honours
``SamplingParams.max_tokens`` (a proto3 ``optional`` field, read through ``HasField``) and
``stop_token_ids``. Every other RPC answers ``UNIMPLEMENTED``.

The generated ``VllmEngineServicer`` stub declares every RPC as an ``abc.abstractmethod`` (the
runtime base class instead answers ``UNIMPLEMENTED``), so a subclass that mypy accepts as
instantiable must define all of them; ``_unimplemented`` keeps that short.

Start it standalone with::

    python examples/typed_servicer.py --port 50051
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator, Sequence
from concurrent import futures
from typing import NoReturn

import grpc

from smg_grpc_proto import common_pb2, vllm_engine_pb2, vllm_engine_pb2_grpc

HOST = "127.0.0.1"


def _unimplemented(context: grpc.ServicerContext, method: str) -> NoReturn:
    """Abort the current RPC with ``UNIMPLEMENTED`` (``context.abort`` never returns)."""
    context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{method} is not implemented by this example")


class EchoEngineServicer(vllm_engine_pb2_grpc.VllmEngineServicer):
    """Echoes the prompt tokens back as the generated output."""

    def __init__(self, *, healthy: bool = True) -> None:
        """Create the servicer; ``healthy`` is what ``HealthCheck`` reports."""
        self.healthy = healthy

    def HealthCheck(
        self,
        request: vllm_engine_pb2.HealthCheckRequest,
        context: grpc.ServicerContext,
    ) -> vllm_engine_pb2.HealthCheckResponse:
        """Report the configured health state."""
        return vllm_engine_pb2.HealthCheckResponse(
            healthy=self.healthy, message="ok" if self.healthy else "configured unhealthy"
        )

    def Generate(
        self,
        request: vllm_engine_pb2.GenerateRequest,
        context: grpc.ServicerContext,
    ) -> Iterator[vllm_engine_pb2.GenerateResponse]:
        """Stream the prompt tokens back, then one ``GenerateComplete``."""
        if request.WhichOneof("input") != "tokenized":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "this example needs tokenized input")
        prompt = list(request.tokenized.input_ids)
        params = request.sampling_params
        # `optional uint32 max_tokens`: HasField tells "not sent" apart from an explicit 0.
        capped = params.HasField("max_tokens")
        limit = params.max_tokens if capped else len(prompt)
        stop_ids = frozenset(params.stop_token_ids)

        output: list[int] = []
        matched_token_id: int | None = None
        for token in prompt[:limit]:
            output.append(token)
            if request.stream:
                yield vllm_engine_pb2.GenerateResponse(
                    chunk=vllm_engine_pb2.GenerateStreamChunk(
                        token_ids=[token],
                        prompt_tokens=len(prompt),
                        completion_tokens=1,
                    )
                )
            if token in stop_ids:
                matched_token_id = token
                break

        hit_limit = capped and matched_token_id is None and len(output) == limit
        finish_reason = "length" if hit_limit else "stop"
        complete = vllm_engine_pb2.GenerateComplete(
            # stream=true: only the last increment (already sent as a chunk) is repeated.
            output_ids=output[-1:] if request.stream else output,
            finish_reason=finish_reason,
            prompt_tokens=len(prompt),
            completion_tokens=len(output[-1:]) if request.stream else len(output),
        )
        if matched_token_id is not None:
            complete.matched_token_id = matched_token_id
        if request.HasField("kv_transfer_params_json"):
            complete.kv_transfer_params_json = request.kv_transfer_params_json
        yield vllm_engine_pb2.GenerateResponse(complete=complete)

    # --- Everything else: UNIMPLEMENTED, but typed, so the class is not abstract for mypy. ---

    def Embed(
        self, request: vllm_engine_pb2.EmbedRequest, context: grpc.ServicerContext
    ) -> vllm_engine_pb2.EmbedResponse:
        """Not supported."""
        _unimplemented(context, "Embed")

    def FlushCache(
        self, request: common_pb2.FlushCacheRequest, context: grpc.ServicerContext
    ) -> common_pb2.FlushCacheResponse:
        """Not supported."""
        _unimplemented(context, "FlushCache")

    def StartProfile(
        self, request: common_pb2.StartProfileRequest, context: grpc.ServicerContext
    ) -> common_pb2.ProfileResponse:
        """Not supported."""
        _unimplemented(context, "StartProfile")

    def StopProfile(
        self, request: common_pb2.StopProfileRequest, context: grpc.ServicerContext
    ) -> common_pb2.ProfileResponse:
        """Not supported."""
        _unimplemented(context, "StopProfile")

    def Abort(
        self, request: vllm_engine_pb2.AbortRequest, context: grpc.ServicerContext
    ) -> vllm_engine_pb2.AbortResponse:
        """Not supported."""
        _unimplemented(context, "Abort")

    def GetModelInfo(
        self, request: vllm_engine_pb2.GetModelInfoRequest, context: grpc.ServicerContext
    ) -> vllm_engine_pb2.GetModelInfoResponse:
        """Not supported."""
        _unimplemented(context, "GetModelInfo")

    def GetServerInfo(
        self, request: vllm_engine_pb2.GetServerInfoRequest, context: grpc.ServicerContext
    ) -> vllm_engine_pb2.GetServerInfoResponse:
        """Not supported."""
        _unimplemented(context, "GetServerInfo")

    def GetLoads(
        self, request: vllm_engine_pb2.GetLoadsRequest, context: grpc.ServicerContext
    ) -> vllm_engine_pb2.GetLoadsResponse:
        """Not supported."""
        _unimplemented(context, "GetLoads")

    def GetTokenizer(
        self, request: common_pb2.GetTokenizerRequest, context: grpc.ServicerContext
    ) -> Iterator[common_pb2.GetTokenizerChunk]:
        """Not supported."""
        _unimplemented(context, "GetTokenizer")

    def SubscribeKvEvents(
        self, request: common_pb2.SubscribeKvEventsRequest, context: grpc.ServicerContext
    ) -> Iterator[common_pb2.KvEventBatch]:
        """Not supported."""
        _unimplemented(context, "SubscribeKvEvents")


def serve(port: int, servicer: EchoEngineServicer | None = None) -> tuple[grpc.Server, int]:
    """Start a server for ``servicer`` on ``127.0.0.1:port`` (0 = any free port).

    Returns the started server and the port it is bound to; stop it with ``server.stop(None)``.
    """
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    vllm_engine_pb2_grpc.add_VllmEngineServicer_to_server(
        servicer if servicer is not None else EchoEngineServicer(), server
    )
    bound = server.add_insecure_port(f"{HOST}:{port}")
    if bound == 0:  # older grpcio reports a failed bind this way instead of raising
        raise RuntimeError(f"could not bind {HOST}:{port}")
    server.start()
    return server, bound


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point: serve until interrupted."""
    parser = argparse.ArgumentParser(description="Typed echo VllmEngine servicer")
    parser.add_argument("--port", type=int, default=50051)
    args = parser.parse_args(argv)
    port: int = args.port
    server, bound = serve(port)
    print(f"serving VllmEngine on {HOST}:{bound}")
    try:
        server.wait_for_termination()
    except KeyboardInterrupt:
        server.stop(grace=1.0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
