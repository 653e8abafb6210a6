"""Reference MLX servicer (``mlx.grpc.engine.MlxEngine``) over the toy model.

Contract points it demonstrates: text only (``text`` input is refused with
``INVALID_ARGUMENT``); one chunk per token with the *running* ``completion_tokens``; with
streaming the ``complete`` message has empty ``output_ids`` (the tokens went out in the
chunks), without streaming it has them all; ``matched_stop_token_id`` names the EOS on
``"stop"``; an aborted request's stream ends (status OK) without a ``complete`` message.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc.aio

from smg_grpc_proto.generated import mlx_engine_pb2 as pb
from smg_grpc_proto.generated import mlx_engine_pb2_grpc as pb_grpc
from smg_grpc_proto.testing._base import Context, ToyEngineCore, add_service

__all__ = ["SERVICE", "MlxToyServicer", "add_to_server"]

SERVICE = pb.DESCRIPTOR.services_by_name["MlxEngine"]


class MlxToyServicer(ToyEngineCore, pb_grpc.MlxEngineServicer):
    """The toy model behind the MLX contract."""

    async def Generate(
        self, request: pb.GenerateRequest, context: Context
    ) -> AsyncIterator[pb.GenerateResponse]:
        if request.WhichOneof("input") != "tokenized":
            await self.invalid(
                context,
                "tokenized is not set: the MLX servicer only accepts token ids "
                f"(got {request.WhichOneof('input') or 'no input'})",
            )
        params = request.sampling_params
        prompt, max_tokens = await self.check_generate(
            context, request.tokenized.input_ids, params, "max_tokens", n=1
        )
        output = self.model.generate(prompt, max_tokens=max_tokens, ignore_eos=params.ignore_eos)
        run = await self.begin(context, request.request_id, len(prompt))
        try:
            emitted: list[int] = []
            async for token in self.produce(run, output):
                emitted.append(token)
                if request.stream:
                    yield pb.GenerateResponse(
                        chunk=pb.GenerateStreamChunk(
                            token_ids=[token],
                            prompt_tokens=len(prompt),
                            completion_tokens=len(emitted),
                        )
                    )
            if run.aborted.is_set():
                return
            complete = pb.GenerateComplete(
                output_ids=[] if request.stream else emitted,
                finish_reason=output.finish_reason,
                prompt_tokens=len(prompt),
                completion_tokens=len(emitted),
            )
            if output.finish_reason == "stop" and self.model.eos_token_ids:
                complete.matched_stop_token_id = self.model.eos_token_ids[0]
            yield pb.GenerateResponse(complete=complete)
        finally:
            self.end(run)

    async def HealthCheck(
        self, request: pb.HealthCheckRequest, context: Context
    ) -> pb.HealthCheckResponse:
        return pb.HealthCheckResponse(healthy=True, message="ok")

    async def Abort(self, request: pb.AbortRequest, context: Context) -> pb.AbortResponse:
        self.abort_ids(list(request.request_ids))
        return pb.AbortResponse()

    async def GetModelInfo(
        self, request: pb.GetModelInfoRequest, context: Context
    ) -> pb.GetModelInfoResponse:
        m = self.model
        return pb.GetModelInfoResponse(
            model_path=m.model_path,
            is_generation=True,
            max_context_length=m.max_context_length,
            vocab_size=m.vocab_size,
            served_model_name=m.served_model_name,
            model_type=m.model_type,
            architectures=m.architectures,
            eos_token_ids=m.eos_token_ids,
            pad_token_id=m.pad_token_id,
            bos_token_id=m.bos_token_id,
            max_req_input_len=m.max_context_length,
        )

    async def GetServerInfo(
        self, request: pb.GetServerInfoRequest, context: Context
    ) -> pb.GetServerInfoResponse:
        return pb.GetServerInfoResponse(
            server_type="mlx-grpc",
            active_requests=self.active_requests,
            uptime_seconds=self.uptime(),
        )


def add_to_server(servicer: MlxToyServicer, server: grpc.aio.Server) -> None:
    """Register ``servicer``; MLX requests carry no tensors, so every method receives plain
    messages (the same table as ``add_MlxEngineServicer_to_server``)."""
    add_service(server, servicer, SERVICE)
