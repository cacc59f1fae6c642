"""The ``hookledger`` command line: the composition root's entry point."""

from __future__ import annotations

import logging
import signal
import sys
import time
from typing import Any, NoReturn

import click
import structlog
from pydantic import ValidationError

from hookledger import logs, migrate
from hookledger.database import database
from hookledger.embedded_postgres import EmbeddedPostgres, EmbeddedPostgresError
from hookledger.settings import Settings

log = structlog.get_logger("hookledger")


def _fail(message: str) -> NoReturn:
    click.echo(f"hookledger: {message}", err=True)
    sys.exit(2)


def load_settings() -> Settings:
    """Settings, or an exit naming each bad key (never echoing a value: it may be a secret)."""
    try:
        return Settings()
    except ValidationError as exc:
        lines = []
        for error in exc.errors(include_input=False, include_url=False):
            key = ".".join(str(part) for part in error["loc"]) or "settings"
            lines.append(f"HOOKLEDGER_{key.upper()}: {error['msg']}")
        _fail("bad configuration:\n  " + "\n  ".join(lines))


def _secret_values(settings: Settings) -> list[str]:
    values = [s.get_secret_value() for s in settings.general_secrets.values()]
    values += [s.get_secret_value() for s in settings.chat_secrets.values()]
    values += [s.get_secret_value() for s in (settings.api_key, settings.admin_token) if s]
    return values


def _configure_logging(settings: Settings) -> None:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    logs.configure(fmt=settings.log_format, level=settings.log_level,
                   secrets=_secret_values(settings))


@click.group()
@click.version_option(package_name="hookledger")
def main() -> None:
    """hookledger: a reconciliation ledger for the provider's webhooks."""


@main.command()
def serve() -> None:
    """Migrate, then receive webhooks until SIGINT/SIGTERM (graceful, exits 0)."""
    import uvicorn

    from hookledger.app import create_app

    settings = load_settings()
    _configure_logging(settings)
    started = time.perf_counter()
    # uvicorn restores and re-raises the signal it caught after its graceful shutdown;
    # with these handlers in place that re-raise is harmless, so the embedded database is
    # stopped and the process exits 0.
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: None)
    try:
        with database(settings) as url:
            migrate.upgrade(url)
            config = uvicorn.Config(
                create_app(settings, url), host=settings.host, port=settings.port,
                log_config=None, access_log=False, lifespan="on",
                timeout_graceful_shutdown=30, server_header=False,
            )
            server = uvicorn.Server(config)
            _announce_when_ready(server, settings, started)
            server.run()
            if not server.started:
                _fail(f"could not listen on {settings.host}:{settings.port}")
    except EmbeddedPostgresError as exc:
        _fail(str(exc))
    log.info("service.exited")


def _announce_when_ready(server: Any, settings: Settings, started: float) -> None:
    original = server.startup

    async def startup(*args: Any, **kwargs: Any) -> None:
        await original(*args, **kwargs)
        if server.started:
            log.info("service.ready", host=settings.host, port=settings.port,
                     seconds=round(time.perf_counter() - started, 3))

    server.startup = startup


@main.command(name="migrate")
def migrate_command() -> None:
    """Apply the database migrations and exit."""
    settings = load_settings()
    _configure_logging(settings)
    try:
        with database(settings) as url:
            migrate.upgrade(url)
    except EmbeddedPostgresError as exc:
        _fail(str(exc))
    click.echo("migrations applied")


@main.group()
def db() -> None:
    """The database in use."""


@db.command(name="url")
def db_url() -> None:
    """Print the database URL in use (for psql and other clients)."""
    settings = load_settings()
    if settings.database_url:
        click.echo(settings.database_url)
        return
    embedded = EmbeddedPostgres(settings.home, os_user_when_root=settings.embedded_os_user)
    click.echo(embedded.url())
    if not (embedded.socket_dir / ".s.PGSQL.5432").exists():
        click.echo("note: the embedded server is not running now; it runs while "
                   "'hookledger serve' does", err=True)


if __name__ == "__main__":  # pragma: no cover
    main()
