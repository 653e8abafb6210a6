"""Run a reference servicer: :func:`serve` inside an event loop, :class:`ReferenceServer` from
synchronous code (a ``grpc.aio`` server on its own loop in a background thread)."""

from __future__ import annotations

import asyncio
import importlib
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any

import grpc.aio

from smg_grpc_proto import channel
from smg_grpc_proto.testing._toy import ToyModel

__all__ = ["ENGINES", "ReferenceServer", "make_servicer", "serve"]

#: Engine name -> (module under smg_grpc_proto.testing, servicer class name).
_REGISTRY: dict[str, tuple[str, str]] = {
    "vllm": ("vllm", "VllmToyServicer"),
    "sglang": ("sglang", "SglangToyServicer"),
    "tokenspeed": ("tokenspeed", "TokenSpeedToyServicer"),
    "trtllm": ("trtllm", "TrtllmToyServicer"),
    "mlx": ("mlx", "MlxToyServicer"),
}

#: The engine names :func:`serve` accepts.
ENGINES = tuple(_REGISTRY)


def _module(engine: str) -> Any:
    if engine not in _REGISTRY:
        raise ValueError(f"engine {engine!r} is not one of {', '.join(ENGINES)}")
    return importlib.import_module(f"smg_grpc_proto.testing.{_REGISTRY[engine][0]}")


def make_servicer(engine: str, model: ToyModel | None = None, **kwargs: Any) -> Any:
    """A reference servicer for ``engine`` over ``model`` (default :class:`ToyModel`);
    ``kwargs`` go to the servicer (e.g. ``kv_interval_s``). Engine modules load on demand, so
    serving one engine imports no other engine's stubs."""
    module = _module(engine)
    return getattr(module, _REGISTRY[engine][1])(model, **kwargs)


async def serve(
    engine: str,
    servicer: Any = None,
    port: int = 0,
    host: str = "127.0.0.1",
    **options: Any,
) -> tuple[grpc.aio.Server, int]:
    """Start a ``grpc.aio`` server for ``engine`` on ``host:port`` (0 = any free port) with
    :func:`smg_grpc_proto.channel.server_options` (``options`` go there, e.g.
    ``max_message_bytes``) and return it with the bound port. ``servicer`` defaults to the
    engine's reference servicer over a default :class:`ToyModel`. Stop it with
    ``await server.stop(grace)``."""
    module = _module(engine)
    if servicer is None:
        servicer = make_servicer(engine)
    server = channel.aio_server(**options)
    module.add_to_server(servicer, server)
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError as exc:
        raise OSError(f"cannot bind {address}: {exc}") from None
    if bound == 0:
        raise OSError(f"cannot bind {address}")
    await server.start()
    return server, bound


class ReferenceServer:
    """A reference servicer served from a background thread, for synchronous code and tests::

        with ReferenceServer("vllm", model=ToyModel(token_delay_s=0.01)) as server:
            channel = grpc.insecure_channel(server.target)

    :meth:`start` returns the bound port; :meth:`stop` (or leaving the ``with`` block) stops
    the server and its loop. ``servicer`` replaces the default reference servicer;
    ``servicer_kwargs`` and ``options`` go to the servicer and to
    :func:`~smg_grpc_proto.channel.server_options`.
    """

    def __init__(
        self,
        engine: str,
        servicer: Any = None,
        *,
        model: ToyModel | None = None,
        port: int = 0,
        host: str = "127.0.0.1",
        servicer_kwargs: dict[str, Any] | None = None,
        startup_timeout_s: float = 10.0,
        **options: Any,
    ) -> None:
        _module(engine)  # fail fast on an unknown name
        self.engine = engine
        self.host = host
        self._requested_port = port
        self._options = options
        self._factory: Callable[[], Any] = (
            (lambda: servicer)
            if servicer is not None
            else (lambda: make_servicer(engine, model, **(servicer_kwargs or {})))
        )
        self._timeout = startup_timeout_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: grpc.aio.Server | None = None
        self._stopped: asyncio.Event | None = None
        self.servicer: Any = None
        self.port = 0

    @property
    def target(self) -> str:
        """``"host:port"`` for a client channel."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def start(self) -> int:
        """Start serving; returns the bound port. Raises what the server raised on startup."""
        if self._thread is not None:
            raise RuntimeError("ReferenceServer already started")
        ready = threading.Event()
        failure: list[BaseException] = []
        self._thread = threading.Thread(
            target=self._run,
            args=(ready, failure),
            name=f"ReferenceServer-{self.engine}",
            daemon=True,
        )
        self._thread.start()
        if not ready.wait(self._timeout):
            raise TimeoutError(f"{self.engine} reference server not up after {self._timeout} s")
        if failure:
            self._thread.join()
            self._thread = None
            raise failure[0]
        return self.port

    def _run(self, ready: threading.Event, failure: list[BaseException]) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._main(ready, failure))
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def _main(self, ready: threading.Event, failure: list[BaseException]) -> None:
        try:
            self.servicer = self._factory()
            self._server, self.port = await serve(
                self.engine, self.servicer, self._requested_port, self.host, **self._options
            )
            self._stopped = asyncio.Event()
        except BaseException as exc:
            failure.append(exc)
            ready.set()
            return
        ready.set()
        await self._stopped.wait()

    def stop(self, grace: float | None = 0.5) -> None:
        """Stop the server (in-flight calls get ``grace`` seconds) and join its thread."""
        loop, thread, server = self._loop, self._thread, self._server
        if thread is None or loop is None or server is None:
            return
        stopped = self._stopped

        async def shutdown() -> None:
            await server.stop(grace)
            if stopped is not None:
                stopped.set()

        asyncio.run_coroutine_threadsafe(shutdown(), loop).result(timeout=(grace or 0) + 10)
        thread.join(timeout=10)
        self._thread = None
        self._server = None

    def __enter__(self) -> ReferenceServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
