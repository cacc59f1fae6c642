"""A relay in front of the test server's Unix socket: a network blip on demand."""

from __future__ import annotations

import socket
import tempfile
import threading
import time
from typing import Any
from urllib.parse import quote, urlencode

import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo


class SocketRelay:
    """A relay in front of the test server's Unix socket whose client side can be cut
    while the server's side stays open: what a network blip can leave behind (the client
    sees its connection go; the server still holds the session, idle, and its locks)."""

    def __init__(self, url: str) -> None:
        params = conninfo_to_dict(url)
        host, port = str(params.get("host") or ""), str(params.get("port") or 5432)
        if not host.startswith("/"):
            pytest.skip("the relay stands in front of a Unix socket")
        self._upstream = f"{host}/.s.PGSQL.{port}"
        folder = tempfile.mkdtemp(prefix="hl-relay-")
        self.url = make_conninfo(url, host=folder)
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(f"{folder}/.s.PGSQL.{port}")
        self._listener.listen()
        self._clients: list[socket.socket] = []
        self._flowing = threading.Event()
        self._flowing.set()
        self._servers: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            server.connect(self._upstream)
            self._clients.append(client)
            self._servers.append(server)  # kept open: the session lingers
            for source, target in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(source, target), daemon=True).start()

    def _pump(self, source: Any, target: Any) -> None:
        try:
            while data := source.recv(65536):
                self._flowing.wait()
                target.sendall(data)
        except OSError:
            pass  # never closes the other side: the server's stays open

    @property
    def postgresql_url(self) -> str:
        """The relay as a ``postgresql://`` URL, the form hookledger's settings take."""
        params = conninfo_to_dict(self.url)
        user = quote(str(params.get("user") or ""), safe="")
        query = urlencode({k: v for k, v in params.items() if k not in ("user", "dbname")})
        return f"postgresql://{user}@/{quote(str(params.get('dbname') or ''), safe='')}?{query}"

    def hold(self) -> None:
        """Stop passing bytes either way, closing nothing: packets that silently vanish."""
        self._flowing.clear()

    def release(self) -> None:
        self._flowing.set()

    def cut_clients(self) -> None:
        for client in self._clients:
            client.shutdown(socket.SHUT_RDWR)
            client.close()

    def close(self) -> None:
        self.release()
        self._listener.close()
        for connection in (*self._clients, *self._servers):
            connection.close()


class TcpRelay:
    """A TCP listener on the loopback passing bytes to and from the test server (on its
    Unix socket or its own TCP port): what a client's socket options are read on.
    ``first_answer_after_s``: the first connection is passed on only that long after it is
    made (a server slow to take its first session, as one resuming from a pause is)."""

    def __init__(self, url: str, *, first_answer_after_s: float = 0) -> None:
        self._first_delay_s = first_answer_after_s
        params = conninfo_to_dict(url)
        host = str(params.get("host") or "/var/run/postgresql")
        port = int(params.get("port") or 5432)
        self._upstream: tuple[int, Any] = (
            (socket.AF_UNIX, f"{host}/.s.PGSQL.{port}") if host.startswith("/")
            else (socket.AF_INET, (host, port)))
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen()
        self._open: list[socket.socket] = []
        user = quote(str(params.get("user") or ""), safe="")
        dbname = quote(str(params.get("dbname") or ""), safe="")
        self.postgresql_url = f"postgresql://{user}@127.0.0.1:{self._listener.getsockname()[1]}/{dbname}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            delay, self._first_delay_s = self._first_delay_s, 0
            threading.Thread(target=self._connect, args=(client, delay), daemon=True).start()

    def _connect(self, client: socket.socket, delay_s: float) -> None:
        time.sleep(delay_s)
        server = socket.socket(self._upstream[0], socket.SOCK_STREAM)
        server.connect(self._upstream[1])
        self._open += [client, server]
        for source, target in ((client, server), (server, client)):
            threading.Thread(target=_pass_on, args=(source, target), daemon=True).start()

    def close(self) -> None:
        self._listener.close()
        for connection in self._open:
            connection.close()


def _pass_on(source: socket.socket, target: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            target.sendall(data)
        target.shutdown(socket.SHUT_WR)
    except OSError:
        pass
