"""A private PostgreSQL server kept under ``HOOKLEDGER_HOME``.

Why it exists: a merchant trying hookledger on a laptop has no database server, and the
general webhook system never retries, so "install a database first" costs real deliveries.

Design, in the order the problems appear:

* **Binaries**: the self-contained ``pgserver`` wheel when it installed and its binaries run
  for the server's OS user; otherwise ``pg_ctl`` on ``PATH``; otherwise the newest
  ``/usr/lib/postgresql/*/bin``. With none, :class:`EmbeddedPostgresUnavailable` says how to
  point ``HOOKLEDGER_DATABASE_URL`` at a server instead.
* **Root**: PostgreSQL refuses to run as root, so under root the cluster belongs to a system
  user (``hookledger`` by default, created on first use) and every server command runs as it.
* **No network**: the server listens on a Unix socket only (no TCP port to collide with or to
  expose); the URL carries the socket directory as ``host``.
* **Sharing**: every process that uses the server registers its pid (and start time) under
  ``users/`` while holding an exclusive ``flock``; the last live user to leave stops the
  server. A process that died without leaving (``kill -9``) is recognised as dead, even once
  its pid is another process's, and does not keep it alive;
  a server orphaned that way is adopted by the next process.
* **Signals**: the server runs in its own session, so a Ctrl-C aimed at hookledger's terminal
  does not shut the database down under in-flight appends.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import os
import pwd
import re
import shutil
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

DATABASE_NAME = "hookledger"
SUPERUSER = "postgres"
_PORT = 5432  # only names the socket file; nothing listens on TCP
_SOCKET_FILE = f".s.PGSQL.{_PORT}"
# the socket file's whole path, in bytes: sun_path is 108 bytes with its terminating NUL
_SOCKET_PATH_MAX = 107
# what a socket folder cannot hold: the server option names it in single quotes (through
# pg_ctl's shell) in a comma-separated list; the URL's host is percent-encoded instead
_UNSAFE_FOR_SERVER = re.compile(r"[',\\\"\x00-\x1f]")
# what pg_ctl cannot start a server from: it hands the data folder and the log file to
# /bin/sh in double quotes, where these still mean something
_UNSAFE_FOR_PG_CTL = re.compile(r'["$`]|\\\\')  # and two backslashes, which it makes one
_START_TIMEOUT_S = 60
_USERADD_FALLBACK = "/usr/sbin/useradd"  # root's PATH may lack sbin

# What every embedded server runs with unless ``server_settings`` says otherwise, each from
# the first major version that has it.
#
# wal_init_zero: a young cluster grows its write-ahead log by creating 16 MB segment files,
# and by default fills each with zeros and fsyncs it while every commit waits. Under a
# saturating load on the development machine that was 15 to 18 new segments in a 15 s
# round, and in paired runs the p99 at 64 connections went from 56 to 22 ms without it
# (the bare endpoint's, on the same server, from 55 to 52; README). A segment that is
# not zero-filled is a sparse file whose blocks are allocated as WAL is written into it;
# fdatasync then also flushes that allocation, which it must anyway for the data to be
# readable after a crash, so durability is unchanged. Recycled segments are whole files,
# so an older cluster behaves the same either way.
SERVER_DEFAULTS: tuple[tuple[int, str, str], ...] = (
    (12, "wal_init_zero", "off"),
)

# shared_buffers stays PostgreSQL's 128 MB (README, "The embedded PostgreSQL"): an eighth
# of the machine's memory (2 GB here) kept a 5,000,000-event ledger's dedupe index in
# memory, but answered 19-37% fewer deliveries at 64 connections in two paired runs on a
# fresh server (likely page faults: each buffer page is faulted in the first time a
# process touches it).


def _altered_settings(auto_conf: Path) -> set[str]:
    """The names ``ALTER SYSTEM`` has set in a cluster's ``postgresql.auto.conf``."""
    try:
        lines = auto_conf.read_text().splitlines()
    except OSError:
        return set()
    names = (line.split("=", 1)[0].strip().lower() for line in lines
             if "=" in line and not line.lstrip().startswith("#"))
    return {name for name in names if name}


class EmbeddedPostgresError(RuntimeError):
    """The embedded PostgreSQL server could not be used."""


class EmbeddedPostgresUnavailable(EmbeddedPostgresError):
    """No PostgreSQL binaries were found for the embedded server."""


@dataclass(frozen=True)
class PostgresBinaries:
    """Where ``initdb``, ``pg_ctl`` and ``postgres`` live, and who provided them."""

    bin_dir: Path
    origin: str

    def tool(self, name: str) -> str:
        return str(self.bin_dir / name)


def _pgserver_bin_dir() -> Path | None:
    """Find the wheel's binaries without importing it (its import has side effects)."""
    spec = importlib.util.find_spec("pgserver")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        path = Path(location) / "pginstall" / "bin"
        if (path / "pg_ctl").exists():
            return path
    return None


def _system_bin_dirs() -> list[Path]:
    found: list[Path] = []
    on_path = shutil.which("pg_ctl")
    if on_path:
        found.append(Path(os.path.realpath(on_path)).parent)
    versions = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
        reverse=True,
    )
    found.extend(p for p in versions if (p / "pg_ctl").exists())
    return found


def find_binaries(run_as: str | None) -> PostgresBinaries:
    """Pick binaries the server's OS user can actually execute."""
    candidates: list[PostgresBinaries] = []
    pgserver_dir = _pgserver_bin_dir()
    if pgserver_dir is not None:
        candidates.append(PostgresBinaries(pgserver_dir, "pgserver wheel"))
    candidates.extend(PostgresBinaries(d, "system") for d in _system_bin_dirs())
    for candidate in candidates:
        if _runs_as(candidate, run_as):
            return candidate
    raise EmbeddedPostgresUnavailable(
        "no PostgreSQL server binaries found for the embedded database "
        "(install hookledger with its 'pgserver' dependency, or the distribution's "
        "postgresql package); or set HOOKLEDGER_DATABASE_URL=postgresql://user@host/dbname "
        "to use a server you run yourself"
    )


def _identity(run_as: str | None) -> dict[str, Any]:
    """subprocess arguments that drop root to ``run_as`` completely (uid, gid, no groups)."""
    if run_as is None:
        return {}
    entry = pwd.getpwnam(run_as)
    return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}


def _runs_as(binaries: PostgresBinaries, run_as: str | None) -> bool:
    try:
        result = subprocess.run(
            [binaries.tool("postgres"), "--version"],
            capture_output=True,
            timeout=20,
            check=False,
            **_identity(run_as),
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return result.returncode == 0


def _ensure_os_user(name: str) -> None:
    try:
        pwd.getpwnam(name)
        return
    except KeyError:
        pass
    useradd = shutil.which("useradd") or _USERADD_FALLBACK
    try:
        result = subprocess.run(
            [useradd, "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
            capture_output=True,
            text=True,
            check=False,
        )
        failure = result.stderr.strip() if result.returncode != 0 else ""
    except OSError as exc:  # no useradd (a busybox or distroless image)
        failure = f"{useradd}: {exc.strerror or exc}"
    if failure and not _user_exists(name):
        raise EmbeddedPostgresError(
            f"running as root, the embedded PostgreSQL needs an unprivileged OS user "
            f"{name!r} and useradd could not create it ({failure}): create it, or set "
            f"HOOKLEDGER_EMBEDDED_OS_USER to an unprivileged user that exists, or run "
            f"hookledger as a user other than root"
        )


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def _grant_search(path: Path, os_user: str) -> list[Path]:
    """Let ``os_user`` traverse every ancestor of ``path``; return the folders changed.

    Only the search bit for others (``o+x``) is added: it allows reaching a known path,
    not listing the folder. Needed when running as root with a home under ``/root``.
    """
    uid = pwd.getpwnam(os_user).pw_uid
    changed = []
    for folder in reversed([path, *path.parents]):
        info = folder.stat()
        if info.st_uid == uid or info.st_mode & stat.S_IXOTH:
            continue
        folder.chmod(stat.S_IMODE(info.st_mode) | stat.S_IXOTH)
        changed.append(folder)
    return changed


def _runs_in(pid: int, folder: Path) -> bool | None:
    """Whether process ``pid`` works in ``folder`` (a PostgreSQL server's processes work in
    its data folder), compared by identity, so a renamed or linked folder is still itself;
    None where that cannot be read (no ``/proc``, as on macOS; another user's process)."""
    try:
        cwd, here = os.stat(f"/proc/{pid}/cwd"), os.stat(folder)
    except OSError:
        return None
    return (cwd.st_dev, cwd.st_ino) == (here.st_dev, here.st_ino)


def _ended(pid: int) -> bool:
    """Whether ``pid`` is a process that has ended and waits to be reaped (a zombie), which
    signals reach (``kill(pid, 0)`` succeeds) as if it ran; False where it cannot be read."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[:1]
    except (OSError, IndexError):
        return False
    return state == ["Z"]


def _started(pid: int) -> str:
    """When process ``pid`` started (clock ticks since boot): with the pid, it names one
    process. Empty where it cannot be read (no ``/proc``, as on macOS)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def _first_line(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace").split("\n", 1)[0].strip()
    except OSError:
        return None


def _sync_folder(folder: Path) -> None:
    """Make the names in ``folder`` (a rename into it) survive a power cut."""
    descriptor = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)  # a uid with no name here (a disk from another machine)


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (one of another user's counts too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class EmbeddedPostgres:
    """One PostgreSQL cluster under ``home/postgres``, shared by the processes using it."""

    def __init__(self, home: Path, *, os_user_when_root: str = "hookledger",
                 server_settings: dict[str, str] | None = None) -> None:
        self.root = home.resolve() / "postgres"
        self.data_dir = self.root / "data"
        self.users_dir = self.root / "users"
        self.log_file = self.root / "server.log"
        self._lock_file = self.root / "lock"
        self._run_as = os_user_when_root if os.geteuid() == 0 else None
        self._registered = False
        self._server_settings = dict(server_settings or {})

    # -- public -------------------------------------------------------------------------

    @property
    def socket_dir(self) -> Path:
        preferred = self.root / "run"
        # a quote, comma or backslash in the home (or the working directory, the default
        # home's) would break the server's option: such a folder is not the socket's.
        # Measured with the socket file's name, in bytes: a 100-character folder was taken,
        # and the server refused the 114-byte path ("is too long (maximum 107 bytes)")
        if len(os.fsencode(preferred / _SOCKET_FILE)) <= _SOCKET_PATH_MAX \
                and not _UNSAFE_FOR_SERVER.search(str(preferred)):
            return preferred
        digest = hashlib.sha256(str(self.root).encode()).hexdigest()[:16]
        return Path("/tmp") / f"hookledger-{digest}"

    def url(self, database: str = DATABASE_NAME) -> str:
        # encoded: a space, '&' or '%' in the home (or the working directory, the default
        # home's) went into the URL as it was, and libpq refused it ("unexpected spaces
        # found", "invalid percent-encoded token"): every command failed
        host = quote(str(self.socket_dir), safe="/")
        return f"postgresql://{SUPERUSER}@/{database}?host={host}&port={_PORT}"

    def socket_present(self) -> bool:
        """Whether the server's socket is there, as it is while a server runs. A socket
        folder this user may not search (a home made by root keeps it closed to all but
        the server's user) is an :class:`EmbeddedPostgresError` naming it, as
        :meth:`start`'s are: ``hookledger db url`` stopped with a PermissionError
        traceback. ``os.stat``, not ``Path.exists``, whose handling of a folder it may
        not search is not the same in every Python (``os.path.exists`` answers False),
        and a False read as "not running"."""
        try:
            os.stat(self.socket_dir / _SOCKET_FILE)
            return True
        except (FileNotFoundError, NotADirectoryError):  # no such folder: no server there
            return False
        except OSError as exc:
            owner = ""
            with contextlib.suppress(OSError):
                owner = f" ({_user_name(self.root.stat().st_uid)!r})"
            raise EmbeddedPostgresError(
                f"the embedded PostgreSQL's socket folder {self.socket_dir} cannot be read "
                f"by this user: {exc.strerror or exc}. Run hookledger as the user who made "
                f"this home{owner}, or set HOOKLEDGER_HOME to a folder of this user's, or "
                f"HOOKLEDGER_DATABASE_URL to a server of your own") from exc

    def start(self) -> str:
        """Start (or join) the server and return the URL of the ``hookledger`` database.

        A file or folder it cannot make or open (a read-only or full disk, a folder of
        another user's) is an :class:`EmbeddedPostgresError` naming it, which the commands
        show as a message: it was an ``OSError`` traceback."""
        try:
            return self._start()
        except OSError as exc:
            where = exc.filename or self.root
            raise EmbeddedPostgresError(
                f"the embedded PostgreSQL cannot use {where}: {exc.strerror or exc}. Set "
                f"HOOKLEDGER_HOME to a folder this user may write, on a writable disk with "
                f"room, or HOOKLEDGER_DATABASE_URL to a server of your own") from exc

    def _start(self) -> str:
        if _UNSAFE_FOR_PG_CTL.search(str(self.root)):
            raise EmbeddedPostgresError(
                f"the embedded PostgreSQL cannot run in {self.root}: pg_ctl passes its folder "
                f"to a shell, where a $, `, \" or two backslashes in the path break the "
                f"start. Set "
                f"HOOKLEDGER_HOME to a folder without them, or HOOKLEDGER_DATABASE_URL")
        self.root.mkdir(parents=True, exist_ok=True)
        self.users_dir.mkdir(exist_ok=True)
        self._refuse_another_users_cluster()
        with self._locked():
            # registered before anything is started: a start that fails or is interrupted
            # halfway (Ctrl-C, SIGTERM as SystemExit) leaves again, and so stops a server it
            # started that no other live process uses, instead of leaving it running
            joined_before = self._registered  # a repeated start that fails keeps the first
            (self.users_dir / str(os.getpid())).write_text(_started(os.getpid()))
            self._registered = True
            binaries: PostgresBinaries | None = None
            try:
                if self._run_as is not None:
                    _ensure_os_user(self._run_as)
                    for folder in _grant_search(self.root, self._run_as):
                        print(f"hookledger: allowed user {self._run_as!r} to traverse "
                              f"{folder} (o+x) so the embedded PostgreSQL can reach its data",
                              file=sys.stderr)
                binaries = find_binaries(self._run_as)
                if not (self.data_dir / "PG_VERSION").exists():
                    self._initdb(binaries)
                if not self._running(binaries):
                    self._start_server(binaries)
                self._ensure_database(binaries)
            except BaseException:
                if not joined_before:
                    with contextlib.suppress(Exception):  # the start's error is the one to see
                        self._leave(binaries)
                raise
        return self.url()

    def stop(self) -> None:
        """Leave the server; stop it when no other live process is using it."""
        if not self._registered:
            return
        with self._locked():
            self._leave(None)

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- internals ----------------------------------------------------------------------

    def _leave(self, binaries: PostgresBinaries | None) -> None:
        """Unregister this process and stop the server if no live user is left. Called
        holding the lock."""
        (self.users_dir / str(os.getpid())).unlink(missing_ok=True)
        self._registered = False
        if self._live_users():
            return
        binaries = binaries or find_binaries(self._run_as)
        if self._running(binaries):
            self._pg_ctl(binaries, "stop", "-m", "fast", "-w", "-t", str(_START_TIMEOUT_S))

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with open(self._lock_file, "a+") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _live_users(self) -> list[int]:
        """The registered processes still running. A registration holds its process's start
        time: one left by a process killed (or cut off by a power cut) whose pid another
        process has since was taken for a user, and the last command's stop left the server
        running for as long as that process lived."""
        live = []
        for entry in self.users_dir.iterdir():
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            try:
                recorded = entry.read_text().strip()
            except OSError:
                recorded = ""
            started = _started(pid)
            if pid_alive(pid) and (not recorded or not started or recorded == started):
                live.append(pid)
            else:
                entry.unlink(missing_ok=True)
        return live

    def _own(self, path: Path) -> None:
        if self._run_as is None:
            return
        entry = pwd.getpwnam(self._run_as)
        os.chown(path, entry.pw_uid, entry.pw_gid)

    def _refuse_another_users_cluster(self) -> None:
        """Stop, changing nothing, when the cluster belongs to another OS user than the one
        the server would run as. Root (``sudo hookledger report`` where a user's serve
        runs) found it "not running", since its server user could not read it, and gave
        the running server's socket folder and log to that user, cutting the running serve
        off its database; a user on a home first run as root stopped with a traceback."""
        try:
            owner = self.data_dir.stat().st_uid
        except FileNotFoundError:
            return
        server_uid = pwd.getpwnam(self._run_as).pw_uid if self._run_as else os.geteuid()
        if owner == server_uid:
            return
        runs_as = _user_name(server_uid)
        name = _user_name(owner)
        if self._run_as is not None:
            how = f"set HOOKLEDGER_EMBEDDED_OS_USER={name} to run it as its owner"
        elif self.root.stat().st_uid == 0:
            how = "this home was made by running hookledger as root: run it as root"
        else:
            how = f"run hookledger as {name!r}"
        raise EmbeddedPostgresError(
            f"the embedded PostgreSQL cluster in {self.data_dir} belongs to the OS user "
            f"{name!r}, and this process would run it as {runs_as!r}: {how}, or set "
            f"HOOKLEDGER_HOME to a folder of this user's")

    def _refuse_unless_ours(self, socket_dir: Path) -> None:
        """Use a socket folder found already there only if it is a folder (no link) of this
        process's user or the server's. Whoever can reach the socket is the server's
        superuser; the folder in /tmp has a name that follows from the home's path, and
        another user who made it first kept the right to replace the socket, or to reach
        it: it was used as found (under root, given to the server's user still open)."""
        info = socket_dir.lstat()
        ours = {os.geteuid()}
        if self._run_as is not None:
            ours.add(pwd.getpwnam(self._run_as).pw_uid)
        if stat.S_ISDIR(info.st_mode) and info.st_uid in ours:
            return
        raise EmbeddedPostgresError(
            f"the embedded PostgreSQL's socket folder {socket_dir} is "
            + ("a folder of another user" if stat.S_ISDIR(info.st_mode) else "not a folder")
            + f" (uid {info.st_uid}): anyone able to use its socket is the database's "
            f"superuser, so it is not used. Remove it (and find out who made it), or set "
            f"HOOKLEDGER_HOME to a short path without a quote, comma or backslash, which "
            f"keeps the socket in the home")

    def settings(self) -> dict[str, str]:
        """The settings the server starts with: :data:`SERVER_DEFAULTS` its version has,
        less those set by ``ALTER SYSTEM``, then the caller's ``server_settings``. Read
        after ``initdb``."""
        version = int((self.data_dir / "PG_VERSION").read_text().split(".")[0])
        defaults = {key: value for since, key, value in SERVER_DEFAULTS if version >= since}
        # a setting given by ALTER SYSTEM is the operator's: a -c option would override it
        chosen = _altered_settings(self.data_dir / "postgresql.auto.conf")
        defaults = {key: value for key, value in defaults.items() if key not in chosen}
        return {**defaults, **self._server_settings}

    def _initdb(self, binaries: PostgresBinaries) -> None:
        """Make the cluster in a folder of its own, named the data folder once initdb has
        finished (and synced it). initdb writes PG_VERSION first: a cluster it left half
        made (Ctrl-C, SIGTERM, a power cut during the first start) was taken for a cluster,
        and every later start failed ('database "postgres" does not exist') for good."""
        staging = self.root / "data.initdb"
        for half_made in (staging, self.data_dir):  # an interrupted initdb's
            if half_made.exists():
                shutil.rmtree(half_made)
        staging.mkdir(mode=0o700)
        self._own(staging)
        self._run(
            binaries,
            "initdb",
            "-D",
            str(staging),
            "-U",
            SUPERUSER,
            "--auth=trust",
            "--encoding=UTF8",
            "--locale=C",
            "--no-instructions",
        )
        staging.rename(self.data_dir)
        _sync_folder(self.root)  # the name, before the server writes into the cluster

    def _forget_stale_lock_files(self) -> None:
        """Remove the server's lock files (``postmaster.pid``, the socket's) that name a
        live process which is not a server of this cluster.

        A power cut (or kill -9 of the server) leaves them behind, and the pid they name
        may belong to another process of the server's user by the next start. pg_ctl and
        the server took that process for the server: pg_ctl said it was running, so none was
        started and every command failed to connect, and the last user's stop sent the
        unrelated process the server's SIGINT. So is one naming a server that ended but
        was not reaped (a zombie): in a container whose first process is hookledger, which
        reaps no orphan, a killed server (the OOM killer) could not be started again, and
        every stop waited a minute on it. A lock file naming a dead process is left:
        pg_ctl and the server see it as stale themselves. PostgreSQL's own guard against a
        second server still holds: old server processes attached to its shared memory
        make the new server refuse to start."""
        for lock in (self.data_dir / "postmaster.pid",
                     self.socket_dir / f"{_SOCKET_FILE}.lock"):
            first = _first_line(lock)
            if not first or not first.isdigit() or not pid_alive(int(first)):
                continue
            if _ended(int(first)) or _runs_in(int(first), self.data_dir) is False:
                lock.unlink(missing_ok=True)
                print(f"hookledger: removed {lock}, left by an embedded PostgreSQL that has "
                      f"ended (its pid {first} is another process now, or one that ended)",
                      file=sys.stderr)

    def _running(self, binaries: PostgresBinaries) -> bool:
        self._forget_stale_lock_files()
        result = subprocess.run(
            [binaries.tool("pg_ctl"), "status", "-D", str(self.data_dir)],
            capture_output=True,
            check=False,
            **_identity(self._run_as),
        )
        return result.returncode == 0

    def _start_server(self, binaries: PostgresBinaries) -> None:
        socket_dir = self.socket_dir
        socket_dir.mkdir(mode=0o700, exist_ok=True)
        self._refuse_unless_ours(socket_dir)
        self._own(socket_dir)
        socket_dir.chmod(0o700)  # made before with other bits, it is closed now
        if not self.log_file.exists():
            self.log_file.touch()
        self._own(self.log_file)
        options = (
            f"-c listen_addresses='' -c unix_socket_directories='{socket_dir}' "
            f"-c port={_PORT} -c max_connections=200"
        )
        for key, value in self.settings().items():
            options += f" -c {key}={value}"
        try:
            self._pg_ctl(
                binaries,
                "start",
                "-w",
                "-t",
                str(_START_TIMEOUT_S),
                "-l",
                str(self.log_file),
                "-o",
                options,
            )
        except EmbeddedPostgresError as exc:
            tail = self.log_file.read_text(errors="replace")[-2000:]
            raise EmbeddedPostgresError(f"{exc}\n--- server log ---\n{tail}") from exc

    def _ensure_database(self, binaries: PostgresBinaries) -> None:
        import psycopg

        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            exists = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE_NAME,)
            ).fetchone()
            if not exists:
                conn.execute(f'CREATE DATABASE "{DATABASE_NAME}"')

    def _pg_ctl(self, binaries: PostgresBinaries, *args: str) -> None:
        self._run(binaries, "pg_ctl", "-D", str(self.data_dir), *args, action=args[0])

    def _run(self, binaries: PostgresBinaries, tool: str, *args: str,
             action: str | None = None) -> None:
        with subprocess.Popen(
            [binaries.tool(tool), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=str(self.root),
            start_new_session=True,  # keep terminal signals away from the server
            **_identity(self._run_as),
        ) as process:
            try:
                stdout, stderr = process.communicate()
            except BaseException:
                # interrupted (Ctrl-C, SIGTERM as SystemExit): the tool and what it started
                # in its session, such as initdb's own postgres, which otherwise went on
                # writing into the folder being made (pg_ctl starts the server in a session
                # of its own, which this leaves alone)
                with contextlib.suppress(OSError):
                    os.killpg(process.pid, signal.SIGKILL)
                raise
        if process.returncode != 0:
            raise EmbeddedPostgresError(
                f"{tool} {action or (args[0] if args else '')} failed ({binaries.origin} binaries "
                f"in {binaries.bin_dir}): {(stderr or stdout).strip()}"
            )
