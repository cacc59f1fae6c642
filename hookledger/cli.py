"""The ``hookledger`` command line: the composition root's entry point."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import time
import tomllib
from typing import TYPE_CHECKING, Any, NoReturn

import click
import structlog
from pydantic import ValidationError
from pydantic_settings import SettingsError

from hookledger import logs, migrate
from hookledger.database import database, libpq_url, without_password
from hookledger.embedded_postgres import EmbeddedPostgres, EmbeddedPostgresError
from hookledger.settings import Settings, blank_over_file, unknown_variables
from ingest.headers import MIN_MASKED

if TYPE_CHECKING:
    from projections.live import LiveProjector

log = structlog.get_logger("hookledger")


def _fail(message: str) -> NoReturn:
    click.echo(f"hookledger: {message}", err=True)
    sys.exit(2)


def load_settings(**overrides: Any) -> Settings:
    """Settings, or an exit naming each bad key (never echoing a value: it may be a secret)
    or unknown variable."""
    unknown = unknown_variables(os.environ, Settings.model_fields)
    if unknown:
        _fail("bad configuration:\n  " + "\n  ".join(
            f"{name}: no such setting" + (f" (did you mean {meant}?)" if meant else "")
            for name, meant in unknown))
    blank = blank_over_file(os.environ, _file_settings())
    if blank:
        _fail("bad configuration:\n  " + "\n  ".join(
            f"{name}: set but blank, which would override hookledger.toml's "
            f"{name[len('HOOKLEDGER_'):].lower()} (unset it, or give it a value)"
            for name in blank))
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        lines = []
        for error in exc.errors(include_input=False, include_url=False):
            key = ".".join(str(part) for part in error["loc"]) or "settings"
            if error["type"] == "extra_forbidden":  # unknown environment variables are
                # ignored, so an unknown key is hookledger.toml's, and no variable of ours
                lines.append(f"hookledger.toml: unknown key {key!r} (keys are the variables' "
                             "names in lower case without HOOKLEDGER_, e.g. port)")
                continue
            lines.append(f"{_source_of(key)}: {error['msg']}")
        _fail("bad configuration:\n  " + "\n  ".join(lines))
    except SettingsError as exc:
        # a mapping (HOOKLEDGER_RECONCILE_RECORD_PATHS) that is not JSON fails before
        # validation; the message names the field, never the value
        field = str(exc).split('"')[1] if str(exc).count('"') >= 2 else "settings"
        _fail(f"bad configuration:\n  HOOKLEDGER_{field.upper()}: not valid JSON")
    except tomllib.TOMLDecodeError as exc:
        _fail(f"bad configuration:\n  hookledger.toml: {exc}")
    except UnicodeDecodeError:
        # TOML is UTF-8; a file saved in another encoding (Latin-1, say) stopped every
        # command with a traceback naming no file. Not the error's text: it quotes a byte
        # of the file, which may be a secret's
        _fail("bad configuration:\n  hookledger.toml: not UTF-8 text (TOML files are "
              "UTF-8; save it as such)")


def _file_settings() -> dict[str, Any]:
    """What ``hookledger.toml`` sets, read leniently: nothing when it is missing or
    unreadable (a file that is not TOML, or not UTF-8, is reported when the settings are
    read)."""
    with contextlib.suppress(OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
        with open("hookledger.toml", "rb") as handle:
            return tomllib.load(handle)
    return {}


def _source_of(key: str) -> str:
    """Where a setting's bad value came from: the variable when it is set (it wins), else
    ``hookledger.toml`` when that holds the key; a message naming an unset variable sent
    people to look in the wrong place."""
    variable = f"HOOKLEDGER_{key.upper()}"
    if variable not in os.environ and key in _file_settings():
        return f"hookledger.toml: {key}"
    return variable


def configure_logging(settings: Settings, *, warn: bool = True) -> None:
    """Logging for a command (or, ``warn`` off, for a worker ``serve`` started: the
    supervisor has said at start what is worth a warning)."""
    secrets = settings.secret_values()
    # the libraries' own records at WARNING and above: their INFO is noise beside ours
    logs.route_stdlib(fmt=settings.log_format, level="warning", secrets=secrets)
    logs.configure(fmt=settings.log_format, level=settings.log_level, secrets=secrets)
    if warn and (short := settings.secrets_shorter_than(MIN_MASKED)):
        # a last-line masking of so short a string would mangle every line; say so instead
        log.warning("secrets.too_short_to_mask", where=short, shortest_masked=MIN_MASKED)
    if warn and (host := settings.api_key_in_the_clear()):
        log.warning("settings.api_key_in_the_clear", host=host,
                    reason="HOOKLEDGER_API_BASE_URL is http:// to another machine: the API "
                           "key crosses the network unencrypted in every request; use "
                           "https:// unless that network is yours alone")


def _exit_on_signal(signum: int, _frame: object) -> None:
    """SIGTERM as SIGINT already is: an exception, so that what a command started (the
    embedded server above all) is stopped on the way out. Python's default for SIGTERM
    ends the process where it stands, and left the embedded server running."""
    raise SystemExit(128 + signum)


def _exit_cleanly(_signum: int, _frame: object) -> None:
    raise SystemExit(0)  # a stop asked for, while serve starts


def _ignore_signals() -> None:
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: None)


def _configured_url() -> str | None:
    """The database URL as configured, read without validating anything else."""
    url = os.environ.get("HOOKLEDGER_DATABASE_URL")
    if url is None:
        value = _file_settings().get("database_url")
        url = value if isinstance(value, str) else None
    return url


class _Commands(click.Group):
    """Every command's embedded server that cannot start, database that cannot be
    reached, or role the database refuses, is a message and exit 2, never a traceback:
    ``reconcile``, ``report``, ``expect``, ``resolve``, ``chat`` and ``demo`` once let the
    first through, where ``migrate`` and the others named the cause in one line."""

    def invoke(self, ctx: click.Context) -> Any:
        import psycopg
        import sqlalchemy.exc

        try:
            return super().invoke(ctx)
        except EmbeddedPostgresError as exc:
            _fail(str(exc))
        except (psycopg.OperationalError, sqlalchemy.exc.OperationalError) as exc:
            # a server that is not there, a database or role that does not exist: every
            # command once stopped with a page of traceback. libpq's words name no password
            # unless the URL has an unescaped "@" in it: masked, as the URL's user means it
            cause = exc.orig if isinstance(exc, sqlalchemy.exc.OperationalError) else exc
            reason = without_password(" ".join(str(cause).split()) or type(cause).__name__,
                                      _configured_url())
            _fail(f"the database cannot be used (HOOKLEDGER_DATABASE_URL, else the embedded "
                  f"server): {reason}")
        except (psycopg.errors.InsufficientPrivilege, sqlalchemy.exc.ProgrammingError) as exc:
            # a role not granted what the command reads (a checking role given the views
            # alone): verify stopped with a traceback and exit 1, a tampered ledger's code
            cause = exc.orig if isinstance(exc, sqlalchemy.exc.ProgrammingError) else exc
            if not isinstance(cause, psycopg.errors.InsufficientPrivilege):
                raise
            reason = without_password(str(cause).splitlines()[0], _configured_url())
            _fail(f"the database refused this role (HOOKLEDGER_DATABASE_URL): {reason}")
        except (psycopg.errors.ReadOnlySqlTransaction, sqlalchemy.exc.InternalError) as exc:
            # a replica, or sessions read-only by default: a command that writes (expect,
            # resolve, reconcile, a migration due) stopped with a page of traceback
            cause = exc.orig if isinstance(exc, sqlalchemy.exc.InternalError) else exc
            if not isinstance(cause, psycopg.errors.ReadOnlySqlTransaction):
                raise
            _fail("the database takes no writes (a standby, or sessions read-only by "
                  "default): this command writes; run it against the primary")


@click.group(cls=_Commands)
@click.version_option(package_name="hookledger")
def main() -> None:
    """hookledger: a reconciliation ledger for the provider's webhooks."""
    with contextlib.suppress(ValueError):  # only the main thread may (a test's CliRunner)
        signal.signal(signal.SIGTERM, _exit_on_signal)  # serve and project have their own


def _migrate_and_check(url: str) -> None:
    """Warn once when the database's collation puts the dedupe index at risk
    (:mod:`hookledger.collation`), or its encoding the deliveries it cannot hold
    (:mod:`hookledger.encoding`), or its default isolation the hash chain or its default
    synchronous_commit the durability of an acknowledged delivery behind a pooler
    (:mod:`hookledger.isolation`), then apply migrations: what every long-running command
    and ``migrate`` do first. The command goes on all the same, and a check that cannot be
    made is no reason to stop either (a database that cannot be reached is). The checks
    come first (they read nothing migrations make): after the migrations, one that failed
    hid them."""
    _warn_of_database_settings(url)
    migrate.upgrade(url)


def _warn_of_database_settings(url: str) -> None:
    import psycopg

    from hookledger.collation import database_collation_concern
    from hookledger.encoding import database_encoding_concern
    from hookledger.isolation import database_durability_concern, database_isolation_concern

    # the checks on one new session: a start-up connection, not one per check. A database
    # that cannot be reached is the command's end, named as the migrations' own attempt
    # would name it. It waits for that session as they would (the URL's connect_timeout,
    # else libpq's): a bound of its own ended a command whose server takes longer to take
    # a session (one resuming from a pause), which the migrations would have waited for
    with psycopg.connect(url) as conn:
        try:
            concerns = [("database.collation_not_c", database_collation_concern(conn)),
                        ("database.encoding_not_utf8", database_encoding_concern(conn)),
                        ("database.isolation_not_read_committed",
                         database_isolation_concern(conn)),
                        ("database.synchronous_commit_off",
                         database_durability_concern(conn))]
        except psycopg.Error:
            return
    for event, concern in concerns:
        if concern:
            log.warning(event, reason=concern)


@main.command()
def serve() -> None:
    """Migrate, then receive webhooks until SIGINT/SIGTERM (graceful, exits 0)."""
    settings = load_settings()
    configure_logging(settings)
    started = time.perf_counter()
    # Starting (the embedded server, migrations, the socket, the projector): a signal
    # leaves at once by SystemExit, so that what was started is stopped on the way out
    # (no-op handlers here once let a stop request during start-up go unheard, and serve
    # carried on). Serving: uvicorn's supervisor takes the signals from when it is made.
    # Stopping: nothing, so a second signal cannot cut the stops short.
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _exit_cleanly)
    try:
        with database(settings) as url:
            _migrate_and_check(url)
            _serve_workers(settings, url, started)
    except EmbeddedPostgresError as exc:
        _fail(str(exc))
    log.info("service.exited")


def _serve_workers(settings: Settings, url: str, started: float) -> None:
    """``HOOKLEDGER_WORKERS`` worker processes on one listening socket (the kernel spreads
    connections), one worker included.

    This process keeps the embedded database (if any), supervises, and runs the live
    projector in a thread; each worker builds the app from the environment, with the
    database URL handed down, and only ingests (reconciliation elects one leader among them,
    as among separate ``serve`` processes). One worker is run this way too: folding on the
    worker's own loop took the core it answers on. On two cores, one worker beside this
    process answered 7,064-7,207 deliveries/s at 64 connections, against 6,605 with the
    projector on its loop and 6,508-6,571 for two workers. Workers end with this process
    (:mod:`hookledger.orphans`).
    """
    import os

    import uvicorn
    from uvicorn.config import STARTUP_FAILURE
    from uvicorn.supervisors import Multiprocess

    from hookledger.app import PROJECTOR_NAME_VARIABLE, live_projector
    from hookledger.gc_tuning import tuned_for_serving
    from hookledger.http_protocol import CoalescingHttpToolsProtocol
    from hookledger.orphans import SUPERVISOR_PID_VARIABLE
    from projections.live import ProjectorThread, application_name

    os.environ["HOOKLEDGER_DATABASE_URL"] = url
    projector_name = application_name()
    os.environ[PROJECTOR_NAME_VARIABLE] = projector_name  # workers report who leads by it
    os.environ[SUPERVISOR_PID_VARIABLE] = str(os.getpid())  # workers end with this process
    config = uvicorn.Config(
        "hookledger.app:app_from_environment", factory=True, host=settings.host,
        port=settings.port, workers=settings.workers, log_config=None, access_log=False,
        lifespan="on", timeout_graceful_shutdown=30, server_header=False,
        timeout_keep_alive=settings.keep_alive_s,
        http=CoalescingHttpToolsProtocol,
    )
    try:
        sock = config.bind_socket()  # uvicorn logs why and exits when it cannot
    except SystemExit:
        _fail(f"could not listen on {settings.host}:{settings.port}")
    host, port = _bound_address(sock)
    log.info("service.workers", workers=settings.workers, host=host, port=port,
             seconds=round(time.perf_counter() - started, 3))
    # the workers only answer; folding runs here, beside the supervisor, off their loops
    projector = (ProjectorThread(live_projector(settings, url, projector_name))
                 if settings.projector else None)
    supervisor: Multiprocess | None = None
    try:
        if projector is not None:
            projector.start()
        else:
            log.info("projector.off", reason="HOOKLEDGER_PROJECTOR=off: a `hookledger "
                                             "project` process projects this database")
        with tuned_for_serving():  # as in each worker (hookledger.app), for the projector
            supervisor = Multiprocess(config, sockets=[sock])  # its handlers from here on
            supervisor.run()
    finally:
        _ignore_signals()
        if projector is not None:
            projector.stop()
    assert supervisor is not None  # else what stopped it is on its way out
    if any(worker.exitcode == STARTUP_FAILURE for worker in supervisor.processes):
        # uvicorn stops every worker when one cannot start; that is no clean stop
        _fail("an HTTP worker could not start (its error is logged above)")


def _bound_address(sock: socket.socket) -> tuple[str, int]:
    """The host and port the socket listens on, as the kernel has them: with
    ``HOOKLEDGER_PORT=0`` the kernel picks the port, and only the socket knows it."""
    address = sock.getsockname()  # (host, port), or (host, port, flow, scope) for IPv6
    return str(address[0]), int(address[1])


@main.command()
def project() -> None:
    """Project the ledger live, without receiving webhooks, until SIGINT/SIGTERM.

    For an instance of its own beside ``serve`` processes started with
    ``HOOKLEDGER_PROJECTOR=off``, so that folding never takes their cores. Leadership is
    the same advisory lock as ``serve``'s: several may run, one projects. (It projects
    whatever ``HOOKLEDGER_PROJECTOR`` says: projecting is what it is for.)
    """
    from hookledger.app import live_projector
    from hookledger.gc_tuning import tuned_for_serving

    settings = load_settings()
    configure_logging(settings)
    signals = ProjectorSignals()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signals.handle)
    try:
        with database(settings) as url:
            _migrate_and_check(url)
            projector = live_projector(settings, url)
            with tuned_for_serving():  # as serve's projector thread runs
                asyncio.run(signals.run(projector))
    except EmbeddedPostgresError as exc:
        _fail(str(exc))
    log.info("projector.exited")


class ProjectorSignals:
    """What SIGINT and SIGTERM do to ``hookledger project``, by phase.

    Starting (the embedded server, migrations): leave at once by ``SystemExit``, so that
    what was started is stopped on the way out. Projecting: stop at the next batch
    boundary. Once projecting has ended: nothing, so that a second signal cannot cut the
    embedded server's stop short.
    """

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._projector: LiveProjector | None = None
        self._ended = False

    async def run(self, projector: LiveProjector) -> None:
        self._loop, self._projector = asyncio.get_running_loop(), projector
        try:
            await projector.run()
        finally:
            self._ended = True

    def handle(self, signum: int, _frame: object) -> None:
        if self._ended:
            return
        if self._loop is not None and self._projector is not None:
            self._loop.call_soon_threadsafe(self._projector.stop)
            return
        raise SystemExit(0)


@main.command(name="migrate")
def migrate_command() -> None:
    """Apply the database migrations and exit."""
    settings = load_settings()
    configure_logging(settings)
    try:
        with database(settings) as url:
            _migrate_and_check(url)
    except EmbeddedPostgresError as exc:
        _fail(str(exc))
    click.echo("migrations applied")


@main.command()
@click.option("--verify", is_flag=True,
              help="Rebuild into a shadow schema and compare with the live projections, "
                   "touching nothing live.")
@click.option("--batch-size", default=5000, show_default=True, type=click.IntRange(min=1))
def rebuild(verify: bool, batch_size: int) -> None:
    """Rebuild every projection from the ledger (or verify the live ones against a rebuild)."""
    import psycopg
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from projections import rebuild as rebuilding

    settings = load_settings()
    configure_logging(settings)
    try:
        with database(settings) as url:
            if verify:  # reads only: a standby or a read-only role may run it
                migrate.require_head(url)
            else:
                migrate.upgrade(url)
            head = asyncio.run(_head(url))
            with Progress("[progress.description]{task.description}", BarColumn(),
                          MofNCompleteColumn(), TimeElapsedColumn(),
                          transient=False) as bar:
                task = bar.add_task("verifying" if verify else "rebuilding", total=head or 1)

                def advance(position: int) -> None:
                    bar.update(task, completed=min(position, head))

                if verify:
                    try:
                        result = asyncio.run(rebuilding.verify(url, batch_size=batch_size,
                                                               progress=advance))
                    except psycopg.errors.ReadOnlySqlTransaction:
                        _fail("rebuild --verify folds into temporary tables, which a standby "
                              "cannot hold: run it against the primary (verify, which "
                              "checks the hash chain, runs on a standby)")
                else:
                    done = asyncio.run(rebuilding.rebuild(url, batch_size=batch_size,
                                                          progress=advance))
                bar.update(task, completed=head or 1)
    except (EmbeddedPostgresError, migrate.NotMigrated) as exc:
        _fail(str(exc))
    if not verify:
        click.echo(f"rebuilt from {done.events} events in {done.seconds:.2f} s "
                   f"({done.rate:,.0f} events/s)")
        return
    click.echo(f"verified up to position {result.checkpoint}: " + ", ".join(
        f"{table} {count} rows" for table, count in result.rows.items()))
    if result.identical:
        click.echo("live projections are identical to a rebuild")
        return
    for difference in result.differences:
        # a key is a delivery's text (a reference): its control characters shown, not obeyed
        click.echo(f"DIFFERS {difference.table} {logs.escaped(difference.key)}: "
                   f"{difference.kind}")
    sys.exit(1)


@main.command(name="verify")
def verify_chain() -> None:
    """Recompute the ledger's hash chain; name the first event that does not match."""
    import psycopg
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from ledger.chain import check_chain

    settings = load_settings()
    configure_logging(settings)

    async def run(advance: Any) -> Any:
        async with await psycopg.AsyncConnection.connect(url) as conn:
            return await check_chain(conn, progress=advance)

    try:
        with database(settings) as url:
            migrate.require_head(url)  # reads only: a standby or a read-only role may run it
            head = asyncio.run(_head(url))
            with Progress("[progress.description]{task.description}", BarColumn(),
                          MofNCompleteColumn(), TimeElapsedColumn()) as bar:
                task = bar.add_task("checking the chain", total=head or 1)
                result = asyncio.run(run(lambda p: bar.update(task, completed=min(p, head))))
                bar.update(task, completed=head or 1)
    except (EmbeddedPostgresError, migrate.NotMigrated) as exc:
        _fail(str(exc))
    if result.intact and not result.checked:
        # no event, no head hash: a blank after "head hash" read as one gone missing
        click.echo("ledger empty: no events to check (no head hash yet)")
        return
    if result.intact:
        click.echo(f"ledger intact: {result.checked} events, head position "
                   f"{result.head_position}, head hash {result.head_hash}")
        return
    click.echo(f"TAMPERED: event at position {result.first_mismatch} does not match its "
               f"hash ({result.checked} events before it are intact)")
    sys.exit(1)


async def _head(url: str) -> int:
    import psycopg

    async with await psycopg.AsyncConnection.connect(url) as conn:
        cur = await conn.execute("SELECT coalesce(max(position), 0) FROM hookledger.ledger")
        row = await cur.fetchone()
        return int(row[0]) if row else 0


@main.group()
def db() -> None:
    """The database in use."""


@db.command(name="url")
def db_url() -> None:
    """Print the database URL in use (for psql and other clients)."""
    settings = load_settings()
    if settings.database_url:
        click.echo(libpq_url(settings.database_url))  # as psql takes it, without +psycopg
        return
    embedded = EmbeddedPostgres(settings.home, os_user_when_root=settings.embedded_os_user)
    running = embedded.socket_present()  # a home of another user's is a message, exit 2
    click.echo(embedded.url())
    if not running:
        click.echo("note: the embedded server is not running now; it runs while "
                   "'hookledger serve' does", err=True)


from hookledger.chat_commands import chat  # noqa: E402
from hookledger.demo import demo  # noqa: E402
from hookledger.reconcile_commands import (  # noqa: E402
    expect_command,
    reconcile_command,
    report_command,
    resolve_command,
)
from sandbox.cli import sandbox  # noqa: E402

main.add_command(sandbox)
main.add_command(demo)
main.add_command(reconcile_command)
main.add_command(report_command)
main.add_command(expect_command)
main.add_command(resolve_command)
main.add_command(chat)


if __name__ == "__main__":  # pragma: no cover
    main()
