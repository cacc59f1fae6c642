"""Fixtures: a real PostgreSQL for the session, and a migrated database per test.

By default the suite starts the embedded PostgreSQL (the same code ``hookledger serve``
uses) in a temporary home. With ``HOOKLEDGER_TEST_DATABASE_URL`` set, it uses that server
instead (the role needs CREATEDB). Either way migrations run once, into a template
database, and each test gets its own clone: real PostgreSQL, fast, isolated.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import structlog
from psycopg_pool import AsyncConnectionPool

from hookledger import logs, migrate
from hookledger.embedded_postgres import EmbeddedPostgres
from tests.dbutil import create_database, drop_database, unique_name, with_database

FAST_TEST_SERVER = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}
OWN_BASETEMP = pytest.StashKey[Path]()


def _interrupt_the_run(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt  # pytest then tears the fixtures down, as on Ctrl-C


def _stop_the_run_on_sigterm() -> None:
    """SIGTERM (a CI job's timeout, ``timeout pytest``) as Ctrl-C: its default ended pytest
    where it stood, and the session's embedded server, never stopped, ran on orphaned. And
    Ctrl-C itself as Python has it: a command run in-process may leave it ignored (``serve``
    ignores both while it stops), and a later test that interrupts itself was not."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt_the_run)
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_configure(config: pytest.Config) -> None:
    """Each session's temporary files in a folder of its own, not under pytest's shared
    ``pytest-of-<user>``. The embedded servers' homes live there, and under root a server
    runs as its own OS user, which needs to traverse that folder; every pytest session
    takes the others' bits off the shared one as it starts, so a second session (one test
    file run while the suite runs) cut the first one's servers off their data directories
    (PANIC, ``Permission denied``, every later test an error). ``--basetemp`` still wins.
    And SIGTERM stops the run as Ctrl-C does."""
    _stop_the_run_on_sigterm()
    if config.option.basetemp is None and not hasattr(config, "workerinput"):
        _forget_old_sessions(Path(tempfile.gettempdir()))
        folder = Path(tempfile.mkdtemp(prefix="hl-tests-"))
        config.option.basetemp = str(folder)
        config.stash[OWN_BASETEMP] = folder


def _forget_old_sessions(parent: Path, older_than_s: float = 3 * 86400) -> None:
    """Folders that failed sessions kept, once untouched for three days (pytest's own
    lock timeout): a running session adds a folder per test, so its own stays fresh."""
    cutoff = time.time() - older_than_s
    for old in parent.glob("hl-tests-*"):
        with contextlib.suppress(OSError):
            if old.is_dir() and not old.is_symlink() and old.stat().st_mtime < cutoff:
                shutil.rmtree(old, ignore_errors=True)


def pytest_unconfigure(config: pytest.Config) -> None:
    """``--help`` and the like configure but run no session: their folder is empty."""
    folder = config.stash.get(OWN_BASETEMP, None)
    if folder is not None:
        with contextlib.suppress(OSError):
            folder.rmdir()  # only when empty


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The folder goes once the session passed; after a failure it is kept to look at
    (the embedded servers' ``server.log`` among it)."""
    folder = session.config.stash.get(OWN_BASETEMP, None)
    if folder is not None and exitstatus == 0:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(autouse=True)
def _sigterm_stops_the_run() -> Iterator[None]:
    """Again after each test: a command run through CliRunner installs its own SIGTERM
    handler (an exit of the test, not of the run)."""
    yield
    _stop_the_run_on_sigterm()


@pytest.fixture(autouse=True)
def _uncached_cli_logging(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The command line configures structlog for its process with loggers cached on first
    use (right for a process that configures logging once). In the one test process, a
    command run through CliRunner pinned each module logger it used to that configuration,
    and a later test's own (JSON to a captured stderr, say) never reached them: whether a
    log assertion passed depended on which tests ran before it."""
    real = logs.configure
    monkeypatch.setattr(logs, "configure", lambda **kw: real(**{**kw, "cache": False}))
    yield
    structlog.reset_defaults()


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def pg_admin_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A URL to a database on the test server from which databases can be created."""
    configured = os.environ.get("HOOKLEDGER_TEST_DATABASE_URL")
    if configured:
        yield configured
        return
    home = tmp_path_factory.mktemp("pg-home")
    server = EmbeddedPostgres(Path(home), server_settings=FAST_TEST_SERVER)
    url = server.start()
    try:
        yield with_database(url, "postgres")
    finally:
        server.stop()


@pytest.fixture(scope="session")
def template_database(pg_admin_url: str) -> Iterator[str]:
    name = unique_name("hookledger_template")
    url = create_database(pg_admin_url, name)
    migrate.upgrade(url)
    try:
        yield name
    finally:
        drop_database(pg_admin_url, name)


@pytest.fixture
def db_url(pg_admin_url: str, template_database: str) -> Iterator[str]:
    """A freshly migrated database for this test alone."""
    name = unique_name("hookledger_test")
    url = create_database(pg_admin_url, name, template=template_database)
    try:
        yield url
    finally:
        drop_database(pg_admin_url, name)


@pytest.fixture
def empty_db_url(pg_admin_url: str) -> Iterator[str]:
    """An empty database (no migrations) for migration tests."""
    name = unique_name("hookledger_empty")
    url = create_database(pg_admin_url, name)
    try:
        yield url
    finally:
        drop_database(pg_admin_url, name)


@pytest.fixture
async def pool(db_url: str) -> AsyncIterator[AsyncConnectionPool]:
    async with AsyncConnectionPool(db_url, min_size=1, max_size=20, open=False,
                                   kwargs={"autocommit": True}) as p:
        yield p


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The fault tests' figures: what was sent, acknowledged and found in the ledger."""
    from tests.fault_report import FIGURES

    if FIGURES:
        terminalreporter.section("fault cases")
        for line in FIGURES:
            terminalreporter.write_line(line)


@pytest.fixture
def bench_tmpdir() -> Iterator[Path]:
    """A short, world-traversable TMPDIR: the embedded server's socket path must fit in
    ``sun_path``, and under root the server runs as its own OS user."""
    folder = Path(tempfile.mkdtemp(prefix="hl-bench-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)
