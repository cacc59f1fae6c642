"""A real hookledger HTTP server on a loopback port, run in a thread for a test."""

from __future__ import annotations

import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn

from hookledger.app import create_app
from hookledger.settings import Settings


@contextmanager
def running_service(db_url: str, **settings: Any) -> Iterator[str]:
    """Serve hookledger on 127.0.0.1:<free port>; yield its base URL; stop it afterwards.

    Each service gets its own home (spool, media, reports) unless the test names one."""
    own_home = None
    if "home" not in settings:
        own_home = tempfile.mkdtemp(prefix="hookledger-test-home-")
        settings["home"] = own_home
    config_settings = Settings(database_url=db_url, **settings)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(create_app(config_settings, db_url), log_config=None,
                            access_log=False, lifespan="on",
                            timeout_keep_alive=config_settings.keep_alive_s)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("hookledger did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
        if own_home is not None:
            shutil.rmtree(own_home, ignore_errors=True)
