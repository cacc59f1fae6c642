"""The embedded server's life: a start that fails or is interrupted halfway does not leave
a server running that nobody uses."""

from __future__ import annotations

import contextlib
import os
import stat
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from hookledger.embedded_postgres import EmbeddedPostgres, EmbeddedPostgresError
from tests.test_serve_process import postgres_running


def starts_answers_and_stops(server: EmbeddedPostgres) -> str:
    """Start ``server``, see its database answer, stop it and see it stopped; its URL."""
    url = server.start()
    try:
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT current_database()").fetchone() == ("hookledger",)
    finally:
        server.stop()
    assert not postgres_running(server.root.parent)
    return url


@pytest.mark.parametrize("interruption", [KeyboardInterrupt, SystemExit,
                                          EmbeddedPostgresError],
                         ids=["ctrl-c", "sigterm", "a failed step"])
def test_a_start_that_stops_after_the_server_came_up_stops_the_server(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        interruption: type[BaseException]) -> None:
    home = tmp_path / "home"
    server = EmbeddedPostgres(home)
    came_up: list[bool] = []

    def interrupted(binaries: object) -> None:
        came_up.append(postgres_running(home))
        raise interruption("interrupted while creating the database")

    monkeypatch.setattr(server, "_ensure_database", interrupted)
    with pytest.raises(interruption):
        server.start()
    assert came_up == [True]  # the interruption came after the server had started
    assert not postgres_running(home)
    assert not list(server.users_dir.iterdir())

    monkeypatch.undo()  # the same home starts normally afterwards
    starts_answers_and_stops(server)


def test_a_repeated_start_that_fails_keeps_the_running_server(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    server = EmbeddedPostgres(home)
    url = server.start()
    try:
        def failing(binaries: object) -> None:
            raise EmbeddedPostgresError("cannot create the database")

        monkeypatch.setattr(server, "_ensure_database", failing)
        with pytest.raises(EmbeddedPostgresError):
            server.start()
        assert postgres_running(home)  # this process still uses it
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        server.stop()
    assert not postgres_running(home)


@pytest.mark.parametrize("command", [
    ["report", "--format", "json"], ["reconcile"], ["expect", "M-1", "--kind", "sms"],
    ["resolve", "d-1", "--reason", "checked"], ["demo"], ["migrate"]])
def test_every_command_whose_embedded_server_cannot_start_says_so_without_a_traceback(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: list[str]) -> None:
    """The README: with no binaries (or a server that will not start) hookledger exits
    saying why. Commands mounted from other modules once raised the error as a traceback."""
    from click.testing import CliRunner

    from hookledger.cli import main

    for key in list(__import__("os").environ):
        if key.startswith("HOOKLEDGER_"):
            monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOOKLEDGER_API_BASE_URL", "http://127.0.0.1:9")

    def unavailable(self: EmbeddedPostgres) -> str:
        raise EmbeddedPostgresError("no PostgreSQL server binaries found (test)")

    monkeypatch.setattr(EmbeddedPostgres, "start", unavailable)
    result = CliRunner().invoke(main, command)
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit)
    assert "no PostgreSQL server binaries found (test)" in result.output


@pytest.mark.parametrize("command", [["migrate"], ["report", "--format", "json"],
                                     ["verify"], ["rebuild"]])
def test_a_database_url_that_cannot_be_reached_is_a_message_not_a_traceback(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: list[str]) -> None:
    from click.testing import CliRunner

    from hookledger.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOOKLEDGER_DATABASE_URL",
                       "postgresql://nobody:pw-not-shown@127.0.0.1:1/ledger")
    result = CliRunner().invoke(main, command)
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit)
    assert "the database cannot be used" in result.output and "127.0.0.1" in result.output
    assert "pw-not-shown" not in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("command", [["migrate"], ["reconcile"]])
def test_a_password_with_an_unescaped_at_sign_is_not_shown_in_the_message(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: list[str]) -> None:
    """libpq ends the password at its first "@" and names the rest as the host it could
    not resolve: the one-line message showed that part of the password."""
    from click.testing import CliRunner

    from hookledger.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOOKLEDGER_DATABASE_URL",
                       "postgresql://app:Tr0ub4dor@horse-staple@127.0.0.1:1/ledger")
    monkeypatch.setenv("HOOKLEDGER_API_BASE_URL", "http://127.0.0.1:1")
    result = CliRunner().invoke(main, command)
    assert result.exit_code == 2, result.output
    assert "the database cannot be used" in result.output
    assert "Tr0ub4dor" not in result.output and "horse-staple" not in result.output


@pytest.mark.parametrize(("folder", "socket_in_home"), [("my home & 100%", True),
                                                       ("it's, mine", False)])
def test_a_home_whose_path_holds_a_space_or_url_characters_serves(
        folder: str, socket_in_home: bool) -> None:
    """The socket folder under such a home went into the URL as it was: libpq refused it
    ("unexpected spaces found", "invalid percent-encoded token"), so every command failed
    with a traceback, and ``db url`` printed a URL psql could not take. A quote or comma,
    which the server's option cannot hold, puts the socket under /tmp instead."""
    import shutil
    import tempfile

    top = Path(tempfile.mkdtemp(prefix="hl "))  # short: the socket may stay in the home
    home = top / folder
    home.mkdir()
    server = EmbeddedPostgres(home)
    try:
        assert (server.socket_dir == server.root / "run") is socket_in_home
        url = starts_answers_and_stops(server)
        assert psycopg.conninfo.conninfo_to_dict(url)["host"] == str(server.socket_dir)
    finally:
        shutil.rmtree(top, ignore_errors=True)


@pytest.mark.parametrize("folder", ["d$x", "back`tick", 'a"quote', "two\\\\slashes"])
def test_a_home_pg_ctl_cannot_start_from_is_refused_naming_the_setting(
        tmp_path: Path, folder: str) -> None:
    """pg_ctl hands the data folder to /bin/sh in double quotes: with a $ the start failed
    on a path the shell had cut ("/tmp/d/home"), with a backtick on a syntax error."""
    home = tmp_path / folder / "home"
    with pytest.raises(EmbeddedPostgresError) as refused:
        EmbeddedPostgres(home).start()
    assert "HOOKLEDGER_HOME" in str(refused.value) and str(home) in str(refused.value)
    assert not home.exists()


@pytest.mark.parametrize(("padding", "socket_bytes", "socket_in_home"), [
    ("x", 107, True), ("x", 108, False), ("é", 108, False)],
    ids=["fits", "one byte over", "over in bytes, not in characters"])
def test_a_home_deep_enough_for_the_socket_path_to_reach_its_limit_serves(
        padding: str, socket_bytes: int, socket_in_home: bool) -> None:
    """A socket's path holds at most 107 bytes (sun_path's 108 with its NUL), the socket
    file's name included. The socket stayed in the home up to a 100-character folder: a
    working directory 94 to 100 characters deep (or fewer, in characters of two bytes)
    stopped every command with the server's "Unix-domain socket path ... is too long"."""
    import shutil
    import tempfile

    top = Path(tempfile.mkdtemp(prefix="hl-"))
    top.chmod(0o755)  # under root the server's own user must reach the home
    try:
        fixed = len(f"{top}/".encode()) + len("/postgres/run/.s.PGSQL.5432")
        width = len(padding.encode())
        home = top / (padding * ((socket_bytes - fixed) // width)
                      + "x" * ((socket_bytes - fixed) % width))
        server = EmbeddedPostgres(home)
        assert len(str(server.root / "run" / ".s.PGSQL.5432").encode()) == socket_bytes
        starts_answers_and_stops(server)
        assert (server.socket_dir == server.root / "run") is socket_in_home
    finally:
        if not socket_in_home:
            shutil.rmtree(server.socket_dir, ignore_errors=True)
        shutil.rmtree(top, ignore_errors=True)


def test_a_lock_file_left_by_a_power_cut_naming_another_live_process_is_stale(
        tmp_path: Path) -> None:
    """After a power cut ``postmaster.pid`` (and the socket's lock file) still name the
    server, and after the reboot that pid may be another process of the server's user.
    pg_ctl and the server took it for the server still running: every command failed to
    connect ("Connection refused") for good, and each one's stop, finding no other user,
    sent that unrelated process the server's SIGINT."""
    import subprocess

    from hookledger.embedded_postgres import _identity

    home = tmp_path / "home"
    server = EmbeddedPostgres(home)
    server.start()
    left = {path: path.read_text() for path in (
        server.data_dir / "postmaster.pid", server.socket_dir / ".s.PGSQL.5432.lock")}
    server.stop()
    bystander = subprocess.Popen(["sleep", "600"], **_identity(server._run_as))
    try:
        for path, text in left.items():  # as the power cut left them, the pid now taken
            path.write_text("\n".join([str(bystander.pid), *text.split("\n")[1:]]))
        starts_answers_and_stops(server)
        assert bystander.poll() is None, "the server's stop signalled another process"
    finally:
        bystander.kill()
        bystander.wait()


@pytest.mark.parametrize("signum", ["SIGINT", "SIGTERM"])
def test_a_first_start_interrupted_while_the_cluster_is_made_leaves_a_home_that_starts(
        tmp_path: Path, signum: str) -> None:
    """Ctrl-C (or SIGTERM, which the commands turn into an exit) during the first start's
    initdb killed it halfway; the folder it left already held PG_VERSION, so it was taken
    for a cluster from then on: every later command failed ('database "postgres" does not
    exist'), for good, until the user found and removed the folder."""
    import os
    import signal
    import threading
    import time

    from hookledger.cli import _exit_on_signal

    previous = signal.signal(signal.SIGTERM, _exit_on_signal)  # as every command has it
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C's own
    home = tmp_path / "home"
    server = EmbeddedPostgres(home)

    def interrupt_once_the_cluster_is_being_made() -> None:
        deadline = time.monotonic() + 60
        while not list(server.root.glob("*/PG_VERSION")) and time.monotonic() < deadline:
            time.sleep(0.001)
        time.sleep(0.1)
        os.kill(os.getpid(), getattr(signal, signum))

    watcher = threading.Thread(target=interrupt_once_the_cluster_is_being_made)
    try:
        watcher.start()
        with pytest.raises((KeyboardInterrupt, SystemExit)):
            server.start()
            time.sleep(5)  # a start that outran the signal would fail the test here
    finally:
        watcher.join()
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)
    assert not postgres_running(home)
    starts_answers_and_stops(server)


@contextlib.contextmanager
def _socket_folder_in_tmp_open_to_all() -> Iterator[EmbeddedPostgres]:
    """A server whose home's socket path would be too long there, so that its socket goes
    to /tmp, where a folder of that name is already made and open to all; removed after."""
    import shutil
    import tempfile

    top = Path(tempfile.mkdtemp(prefix="hl-"))
    top.chmod(0o755)
    server = EmbeddedPostgres(top / ("deep-" * 20))
    assert server.socket_dir.parent == Path("/tmp")
    server.socket_dir.mkdir(mode=0o777)
    server.socket_dir.chmod(0o777)
    try:
        yield server
    finally:
        shutil.rmtree(server.socket_dir, ignore_errors=True)
        shutil.rmtree(top, ignore_errors=True)


def test_a_socket_folder_in_tmp_that_others_may_enter_is_closed_before_the_server_uses_it(
        ) -> None:
    """The socket folder in /tmp keeps other users off the server, where anyone who reaches
    the socket is its superuser (trust). A folder of that name already there, open to all
    (made by another run, or by another user for the purpose), was used as it was: every
    local user could connect, or swap the socket for one of their own."""
    with _socket_folder_in_tmp_open_to_all() as server:
        server.start()
        try:
            assert stat.S_IMODE(server.socket_dir.stat().st_mode) == 0o700
        finally:
            server.stop()


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give a folder to another user")
def test_a_socket_folder_in_tmp_owned_by_another_user_is_refused() -> None:
    """Another local user who made the folder first (its name follows from the home's
    path) kept the right to replace the server's socket, or to reach it: root even gave the
    folder to the server's user and left it open to all."""
    import pwd

    with _socket_folder_in_tmp_open_to_all() as server:
        nobody = pwd.getpwnam("nobody")
        os.chown(server.socket_dir, nobody.pw_uid, nobody.pw_gid)
        try:
            with pytest.raises(EmbeddedPostgresError) as refused:
                server.start()
            assert str(server.socket_dir) in str(refused.value)
            assert server.socket_dir.stat().st_uid == nobody.pw_uid  # left as it was
            assert not postgres_running(server.root.parent)
        finally:
            server.stop()


def _cluster_of_another_user(home: Path) -> EmbeddedPostgres:
    """A running cluster under ``home`` that belongs to the OS user ``nobody``, as one a
    user made without root belongs to that user."""
    from hookledger.embedded_postgres import EmbeddedPostgresUnavailable

    owner = EmbeddedPostgres(home, os_user_when_root="nobody")
    try:
        owner.start()
    except EmbeddedPostgresUnavailable:
        pytest.skip("no PostgreSQL binaries that the user nobody can run")
    return owner


def _in_a_child_as(user: str, call: Callable[[], object]) -> str:
    """What ``call()`` raised (type: message), or "ok", run in a child process that has
    become ``user``."""
    import pickle
    import pwd
    import traceback

    entry = pwd.getpwnam(user)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        outcome = "ok"
        try:
            os.setgroups([])
            os.setgid(entry.pw_gid)
            os.setuid(entry.pw_uid)
            call()
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            outcome = f"{type(exc).__name__}: {exc}"
            if not isinstance(exc, EmbeddedPostgresError):
                outcome += "\n" + traceback.format_exc()
        os.write(write, pickle.dumps(outcome))
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        data = pipe.read()
    os.waitpid(pid, 0)
    return str(pickle.loads(data))


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as two OS users")
def test_root_on_a_home_whose_cluster_is_another_users_says_whose_and_changes_nothing(
        tmp_path: Path) -> None:
    """``sudo hookledger report`` where a user's serve runs: root took the cluster for its
    own server user's, found it "not running" (that user cannot read it), and gave the
    running server's socket folder and log to its own user, cutting the running serve off
    its database; now the socket folder's check refuses, telling the user to remove the
    running server's socket folder."""
    import pwd

    home = tmp_path / "home"
    owner = _cluster_of_another_user(home)
    try:
        before = {path: path.stat().st_uid for path in
                  (owner.data_dir, owner.root / "run", owner.log_file)}
        with pytest.raises(EmbeddedPostgresError) as refused:
            EmbeddedPostgres(home).start()  # as root: its server user is hookledger
        assert "'nobody'" in str(refused.value)
        assert "HOOKLEDGER_EMBEDDED_OS_USER=nobody" in str(refused.value)
        assert "Remove" not in str(refused.value)
        assert {path: path.stat().st_uid for path in before} == before
        assert before[owner.data_dir] == pwd.getpwnam("nobody").pw_uid
        assert postgres_running(home)

        joined = EmbeddedPostgres(home, os_user_when_root="nobody")  # as the message says
        with psycopg.connect(joined.start()) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        joined.stop()  # one process: its one registration, the owner's too
    finally:
        owner.stop()
    assert not postgres_running(home)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as two OS users")
def test_another_user_on_a_home_whose_cluster_root_made_is_told_whose_it_is(
        tmp_path: Path) -> None:
    """A home first run as root belongs to root and its cluster to the server's user: run
    again as a user, every command stopped with a PermissionError traceback."""
    home = tmp_path / "home"
    server = EmbeddedPostgres(home)
    server.start()
    server.stop()
    outcome = _in_a_child_as("nobody", lambda: EmbeddedPostgres(home).start())
    assert outcome.startswith("EmbeddedPostgresError: "), outcome
    assert "'hookledger'" in outcome and "root" in outcome


@pytest.fixture
def read_only_disk(tmp_path: Path) -> Iterator[Path]:
    """A small disk of its own, mounted read-write; remount it with ``remount(..., "ro")``."""
    import subprocess

    if os.geteuid() != 0:
        pytest.skip("mounting a disk needs root")
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m,mode=755", "tmpfs",
                       str(mount_point)], capture_output=True, check=False).returncode:
        pytest.skip("no mount here")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def remount(mount_point: Path, mode: str) -> None:
    import subprocess

    subprocess.run(["mount", "-o", f"remount,{mode}", str(mount_point)], check=True)


@pytest.mark.parametrize("cluster_made_before", [False, True],
                         ids=["a new home", "a home with its cluster"])
def test_a_home_on_a_read_only_disk_is_a_message_not_a_traceback(
        read_only_disk: Path, monkeypatch: pytest.MonkeyPatch,
        cluster_made_before: bool) -> None:
    """A disk the kernel remounted read-only after errors (or mounted so): every command
    stopped with an OSError traceback ("Read-only file system")."""
    from click.testing import CliRunner

    from hookledger.cli import main

    home = read_only_disk / "home"
    if cluster_made_before:
        server = EmbeddedPostgres(home)
        server.start()
        server.stop()
    remount(read_only_disk, "ro")
    for key in list(os.environ):
        if key.startswith("HOOKLEDGER_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("HOOKLEDGER_HOME", str(home))
    result = CliRunner().invoke(main, ["migrate"])
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit)
    assert "Read-only file system" in result.output and "HOOKLEDGER_HOME" in result.output


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another OS user")
def test_a_home_in_a_folder_this_user_may_not_write_is_a_message_not_a_traceback(
        tmp_path: Path) -> None:
    """HOOKLEDGER_HOME (or the working directory, the default home's) in another user's
    folder: a PermissionError traceback."""
    tmp_path.chmod(0o755)
    outcome = _in_a_child_as("nobody", lambda: EmbeddedPostgres(tmp_path / "home").start())
    assert outcome.startswith("EmbeddedPostgresError: "), outcome
    assert "Permission denied" in outcome and "HOOKLEDGER_HOME" in outcome


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a Linux process attribute")
def test_a_server_killed_under_a_process_that_reaps_no_orphans_starts_again(
        tmp_path: Path) -> None:
    """In a container whose first process is hookledger (``CMD hookledger serve`` without
    an init), the server becomes that process's child once pg_ctl exits, and Python reaps
    no child it did not start. A server killed there (the OOM killer) stayed a zombie,
    which pg_ctl and the server took for the server running: no command could start it
    again ("Connection refused"), and each stop waited a minute on it. The test process
    takes the orphans as that first process does."""
    import ctypes
    import signal
    import time

    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_child_subreaper = 36  # <linux/prctl.h>
    if libc.prctl(pr_set_child_subreaper, 1, 0, 0, 0) != 0:
        pytest.skip("cannot take orphans here")
    home = tmp_path / "home"
    server = EmbeddedPostgres(home)
    try:
        server.start()
        postmaster = int((server.data_dir / "postmaster.pid").read_text().split()[0])
        os.kill(postmaster, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while Path(f"/proc/{postmaster}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(0.5)  # its children see it gone and end too

        started = time.monotonic()
        url = server.start()
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        server.stop()
        assert time.monotonic() - started < 30
        assert not postgres_running(home)
    finally:
        server.stop()
        libc.prctl(pr_set_child_subreaper, 0, 0, 0, 0)
        _reap_server_processes_taken(deadline=time.monotonic() + 10)


def _reap_server_processes_taken(deadline: float) -> None:
    """Reap the server processes this process took as orphans, and none of its own
    children (another test's, whose status their owner waits for)."""
    import time

    while time.monotonic() < deadline:
        taken = []
        for stat_file in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError, ValueError):
                text = stat_file.read_text()
                name, fields = text[text.index("(") + 1:text.rindex(")")], text.rsplit(")", 1)[1]
                if name == "postgres" and int(fields.split()[1]) == os.getpid():
                    taken.append(int(stat_file.parent.name))
        if not taken:
            return
        for pid in taken:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
        time.sleep(0.05)


@pytest.mark.skipif(os.geteuid() != 0, reason="the server's OS user is made under root only")
def test_root_where_the_server_user_cannot_be_made_is_told_which_setting_to_use(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under root with no useradd (a busybox or distroless image), every command stopped
    with a FileNotFoundError traceback (then with a message about HOOKLEDGER_HOME, which
    is not the cause); where useradd failed, the message named no way out."""
    import shutil

    import hookledger.embedded_postgres as embedded

    which = shutil.which
    monkeypatch.setattr(embedded.shutil, "which",
                        lambda name: None if name == "useradd" else which(name))
    monkeypatch.setattr(embedded, "_USERADD_FALLBACK", str(tmp_path / "no-useradd"))
    home = tmp_path / "home"
    with pytest.raises(EmbeddedPostgresError) as refused:
        EmbeddedPostgres(home, os_user_when_root="hl-never-made").start()
    message = str(refused.value)
    assert "'hl-never-made'" in message and "useradd" in message
    assert "HOOKLEDGER_EMBEDDED_OS_USER" in message
    assert not postgres_running(home)


def test_a_user_left_by_a_power_cut_whose_pid_is_another_process_now_keeps_nothing_running(
        tmp_path: Path) -> None:
    """Each process using the server registers its pid; one killed (or cut off by a power
    cut) leaves its registration behind, and the pid may be another process's by the next
    run. That process was taken for a user still there: the last command's stop left the
    server running, for as long as that unrelated process lived."""
    import subprocess

    home = tmp_path / "home"
    server = EmbeddedPostgres(home)
    server.start()
    registered = server.users_dir / str(os.getpid())
    bystander = subprocess.Popen(["sleep", "600"])
    try:
        # the registration a killed hookledger left, its pid given to another process since
        (server.users_dir / str(bystander.pid)).write_text(registered.read_text() or "1")
        server.stop()
        assert not postgres_running(home)
    finally:
        bystander.kill()
        bystander.wait()
        if postgres_running(home):  # left running: stopped once the bystander has gone
            server.start()
            server.stop()


def test_a_test_run_stopped_by_sigterm_stops_its_embedded_server(tmp_path: Path) -> None:
    """A CI job's timeout (or ``timeout pytest``) sends SIGTERM, which ended pytest where it
    stood: the session's embedded server was never stopped and ran on, orphaned, one more
    for every run so stopped. Ctrl-C already stopped it."""
    import signal
    import subprocess
    import textwrap
    import time

    (tmp_path / "conftest.py").write_text("from tests.conftest import *  # noqa: F403\n")
    (tmp_path / "test_waits.py").write_text(textwrap.dedent('''
        import time
        from pathlib import Path

        def test_waits(pg_admin_url):
            Path("server-up").write_text(pg_admin_url)
            time.sleep(120)
        '''))
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOOKLEDGER_")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    base = tmp_path / "base"
    run = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                            "--basetemp", str(base), "test_waits.py"],
                           cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT)
    home = base / "pg-home0"
    try:
        deadline = time.monotonic() + 90
        while not (tmp_path / "server-up").exists():
            assert run.poll() is None, run.stdout.read().decode() if run.stdout else ""
            assert time.monotonic() < deadline, "the run's server never came up"
            time.sleep(0.05)
        assert postgres_running(home)
        run.send_signal(signal.SIGTERM)
        run.wait(timeout=60)
        assert not postgres_running(home), "the run's embedded server outlived it"
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        if postgres_running(home):  # adopted and stopped
            left = EmbeddedPostgres(home)
            left.start()
            left.stop()



@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another OS user")
def test_db_url_on_a_home_root_made_is_a_message_for_another_user(tmp_path: Path) -> None:
    """A home first run as root keeps its socket folder closed to others: ``hookledger db
    url`` run by another user stopped with a PermissionError traceback, where the other
    commands name the cause in a line. (Run in a forked child: this Python may be one
    only root can start, under /root.)"""
    home = tmp_path / "home"
    server = EmbeddedPostgres(home)
    server.start()
    server.stop()
    code, out, err = _command_in_a_child_as("nobody", ["db", "url"], home)
    assert code == 2, err
    assert "Traceback" not in err and out == ""
    message = err.strip()
    assert "\n" not in message and message.startswith("hookledger: ")
    assert "Permission denied" in message and str(server.socket_dir) in message
    assert "HOOKLEDGER_HOME" in message


def _command_in_a_child_as(user: str, args: list[str],
                           home: Path) -> tuple[int, str, str]:
    """A command's exit code, standard output and error (a traceback when it raised), run
    on ``home`` in a child process that has become ``user``."""
    import pickle
    import pwd
    import traceback

    from click.testing import CliRunner

    from hookledger.cli import main

    entry = pwd.getpwnam(user)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.setgroups([])
            os.setgid(entry.pw_gid)
            os.setuid(entry.pw_uid)
            os.chdir("/")  # no hookledger.toml of the working directory's
            env: dict[str, str | None] = {k: None for k in os.environ
                                          if k.startswith("HOOKLEDGER_")}
            result = CliRunner().invoke(main, args, env={**env, "HOOKLEDGER_HOME": str(home)})
            err = result.stderr
            if result.exception is not None and not isinstance(result.exception, SystemExit):
                err += "".join(traceback.format_exception(result.exception))
            outcome = (result.exit_code, result.stdout, err)
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            outcome = (-1, "", f"{type(exc).__name__}: {exc}")
        os.write(write, pickle.dumps(outcome))
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        data = pipe.read()
    os.waitpid(pid, 0)
    code, out, err = pickle.loads(data)
    return int(code), str(out), str(err)
