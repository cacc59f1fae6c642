"""A webhook request as the endpoints read it, straight from the ASGI scope.

A delivery is the request that comes thousands of times a second, and Starlette's
``Request`` decodes every header into a multi-dict before the endpoint asks for two of
them. This view reads the same things the same way (header names matched
case-insensitively, the first of a repeated header, latin-1 as HTTP has it) and decodes
only what is asked for. The endpoints take anything with this shape, so a Starlette
``Request`` still does for them.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

from starlette.types import Receive, Scope


class Client(NamedTuple):
    host: str
    port: int


class HeaderView(Protocol):
    def get(self, key: str, default: Any = None) -> Any: ...
    def items(self) -> Any: ...


class DeliveryRequest(Protocol):
    """What a webhook endpoint reads from a request."""

    @property
    def path_params(self) -> dict[str, Any]: ...
    @property
    def headers(self) -> HeaderView: ...
    @property
    def client(self) -> Any: ...
    @property
    def receive(self) -> Receive: ...


def ready_body(request: DeliveryRequest) -> bytes | None:
    """The body when the server had all of it before the endpoint ran (``Incoming.body_ready``)."""
    return getattr(request, "body_ready", None)


class RawHeaders:
    """The scope's header list, decoded only where asked."""

    __slots__ = ("_raw",)

    def __init__(self, raw: list[tuple[bytes, bytes]]) -> None:
        self._raw = raw

    def get(self, key: str, default: str | None = None) -> str | None:
        wanted = key.lower().encode("latin-1")
        for name, value in self._raw:
            if name == wanted:
                return value.decode("latin-1")
        return default

    def items(self) -> list[tuple[str, str]]:
        return [(name.decode("latin-1"), value.decode("latin-1")) for name, value in self._raw]


class Incoming:
    """One webhook request: its path parameter, headers, peer and body channel, and the
    whole body when the server already had it (``body_ready``; else read ``receive``)."""

    __slots__ = ("body_ready", "client", "headers", "path_params", "receive")

    def __init__(self, scope: Scope, receive: Receive, path_params: dict[str, str],
                 body_ready: bytes | None = None) -> None:
        self.body_ready = body_ready
        self.path_params = path_params
        self.headers = RawHeaders(scope["headers"])
        peer = scope.get("client")
        self.client = Client(*peer) if peer else None
        self.receive = receive


def path_label(value: str, limit: int = 128) -> str:
    """A path parameter as logs and the refusals table may hold it: at most ``limit``
    characters, anything unprintable escaped. ``%00`` in a URL decodes to a NUL, which
    PostgreSQL text refuses: the refusal went unrecorded and the NUL reached the log."""
    value = value[:limit]
    if value.isprintable():
        return value
    return value.encode("unicode_escape").decode("ascii")
