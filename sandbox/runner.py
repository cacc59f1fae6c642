"""Start and stop the sandbox (or any ASGI app) in-process on a free loopback port."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import uvicorn

from sandbox.delivery import DEFAULT_RETRY_SCALE, ChatDelivery, ChatDispatcher
from sandbox.faults import Faults, FaultSettings
from sandbox.jsonenc import encode
from sandbox.server import create_app
from sandbox.state import SandboxState

LOOPBACK = "127.0.0.1"
START_TIMEOUT_S = 15.0


@contextmanager
def serve_asgi(app: Any, *, host: str = LOOPBACK, port: int = 0,
               lifespan: Literal["on", "off"] = "off") -> Iterator[str]:
    """Serve ``app`` on ``host:port`` (a free port by default) in a thread; yield its URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    bound = sock.getsockname()[1]
    config = uvicorn.Config(app, log_config=None, access_log=False, lifespan=lifespan,
                            timeout_graceful_shutdown=1)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True,
                              name="sandbox-http")
    thread.start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            sock.close()
            raise RuntimeError("the server did not start")
        time.sleep(0.01)
    try:
        yield f"http://{host}:{bound}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


@dataclass
class Sandbox:
    """A running sandbox: its URL, its records, its fault switches and its chat sender."""

    url: str
    state: SandboxState
    faults: Faults
    dispatcher: ChatDispatcher

    def queue_chat(self, phone_number_id: str, body: dict[str, Any], *,
                   delivery_id: str) -> ChatDelivery | None:
        """Queue a chat delivery to the number's webhook, signed with its current secret.

        With no URL configured the event is a dead delivery, never sent (as the spec says);
        None is returned.
        """
        number = self.state.number(phone_number_id)
        if number is None or not number.webhook_url:
            self.dispatcher.dead_without_url.append(delivery_id)
            return None
        delivery = ChatDelivery(delivery_id, phone_number_id, number.webhook_url,
                                encode(body), number.secret)
        self.dispatcher.submit(delivery)
        return delivery


@contextmanager
def running_sandbox(*, state: SandboxState | None = None, api_key: str | None = None,
                    faults: FaultSettings | None = None, host: str = LOOPBACK, port: int = 0,
                    retry_scale: float = DEFAULT_RETRY_SCALE) -> Iterator[Sandbox]:
    """The sandbox API on a free loopback port for the length of the block."""
    if state is None:
        state = SandboxState() if api_key is None else SandboxState(api_key=api_key)
    elif api_key is not None:
        state.api_key = api_key
    switches = Faults(faults)
    dispatcher = ChatDispatcher(retry_scale=retry_scale)
    try:
        with serve_asgi(create_app(state, switches), host=host, port=port) as url:
            yield Sandbox(url, state, switches, dispatcher)
    finally:
        dispatcher.close()
