"""Tamper evidence: the hash chain over the ledger, checked by ``hookledger verify``."""

from __future__ import annotations

import asyncio
import importlib
import os
import re
import subprocess
import sys
import uuid
from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from psycopg import sql as pg_sql
from sqlalchemy.exc import DBAPIError

import ledger.chain
import ledger.store
from hookledger import migrate
from ledger.chain import check_chain
from ledger.store import append_in
from tests.dbutil import tenant_in_public
from tests.projection_events import new_event


def append(url: str, count: int, prefix: str) -> None:
    async def run() -> None:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            for start in range(0, count, 7):  # several statements and transactions
                async with conn.transaction():
                    await append_in(conn, [
                        new_event("payment.confirmed", 91000, reference=f"{prefix}-{i}",
                                  amount=1000 + i)
                        for i in range(start, min(count, start + 7))])
    asyncio.run(run())


def check(url: str) -> object:
    async def run() -> object:
        async with await psycopg.AsyncConnection.connect(url) as conn:
            return await check_chain(conn)
    return asyncio.run(run())


PAYLOAD_EDIT = ("payload = jsonb_set(coalesce(payload, convert_from(raw_body, 'UTF8')::jsonb), "
                "'{amount}', '1')")


def tamper(url: str, position: int, edit: str = PAYLOAD_EDIT) -> None:
    """What an operator with superuser rights could do: switch the guard off, edit, on."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ALTER TABLE hookledger_private.ledger_events "
                     "DISABLE TRIGGER ledger_events_refuse_update_delete")
        conn.execute(f"UPDATE hookledger_private.ledger_events SET {edit} "
                     "WHERE position = %s", (position,))
        conn.execute("ALTER TABLE hookledger_private.ledger_events "
                     "ENABLE TRIGGER ledger_events_refuse_update_delete")


def verify_command(url: str, *command: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOOKLEDGER_")}
    env["HOOKLEDGER_DATABASE_URL"] = url
    return subprocess.run([sys.executable, "-m", "hookledger", *(command or ("verify",))],
                          env=env, capture_output=True, text=True, timeout=120)


def test_an_untouched_ledger_verifies_and_an_edited_event_is_named(db_url: str) -> None:
    append(db_url, 30, "CH")
    result = check(db_url)
    assert result.intact and result.checked == 30  # type: ignore[attr-defined]
    ok = verify_command(db_url)
    assert ok.returncode == 0 and "ledger intact: 30 events" in ok.stdout

    tamper(db_url, 17)
    result = check(db_url)
    assert result.first_mismatch == 17 and result.checked == 16  # type: ignore[attr-defined]
    caught = verify_command(db_url)
    assert caught.returncode == 1 and "position 17" in caught.stdout


def test_verify_on_an_empty_ledger_says_it_is_empty_and_exits_0(db_url: str) -> None:
    """No event, so no head hash: it printed ``head hash`` followed by nothing, which read
    as a hash gone missing (and a blank is no value to keep elsewhere and compare)."""
    empty = verify_command(db_url)
    assert empty.returncode == 0, empty.stderr
    assert empty.stdout.strip().splitlines()[-1] == ("ledger empty: no events to check "
                                                      "(no head hash yet)")


def test_an_edit_is_named_though_the_digest_function_was_replaced_to_hide_it(
        db_url: str) -> None:
    """The rights that switch the trigger off also replace ``ledger_event_digest``: one
    returning the old digest for the edited row, and a look-alike ``sha256`` in a schema
    the role's search path puts first, hid the edit from a check that trusted them."""
    append(db_url, 12, "FN")
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE hookledger_private.saved AS SELECT position, "
                     "hookledger_private.ledger_event_digest(e) AS digest "
                     "FROM hookledger_private.ledger_events e")
        conn.execute("ALTER FUNCTION hookledger_private.ledger_event_digest("
                     "hookledger_private.ledger_events) RENAME TO real_digest")
        conn.execute("""CREATE FUNCTION hookledger_private.ledger_event_digest(
                            e hookledger_private.ledger_events) RETURNS bytea
                        LANGUAGE sql STABLE AS $$
                        SELECT digest FROM hookledger_private.saved s
                        WHERE s.position = e.position $$""")
        conn.execute("CREATE SCHEMA evil")
        conn.execute("CREATE FUNCTION evil.sha256(bytea) RETURNS bytea LANGUAGE sql "
                     "IMMUTABLE AS $$ SELECT '\\x00'::bytea $$")
        conn.execute(pg_sql.SQL("ALTER DATABASE {} SET search_path = evil, pg_catalog, public")
                     .format(pg_sql.Identifier(conn.info.dbname)))
    tamper(db_url, 5)
    result = check(db_url)
    assert result.first_mismatch == 5 and result.checked == 4  # type: ignore[attr-defined]


def test_verify_reads_only_so_a_read_only_database_can_be_checked(db_url: str) -> None:
    """A standby, or a role that may only read: ``verify`` and ``rebuild --verify`` ran the
    migrations first, and failed there with a traceback and exit 1, a tampered ledger's
    code."""
    append(db_url, 5, "RO")
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(pg_sql.SQL("ALTER DATABASE {} SET default_transaction_read_only = on")
                     .format(pg_sql.Identifier(conn.info.dbname)))
    ok = verify_command(db_url)
    assert ok.returncode == 0 and "ledger intact: 5 events" in ok.stdout, ok.stderr
    rebuilt = verify_command(db_url, "rebuild", "--verify")
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert "live projections are identical to a rebuild" in rebuilt.stdout


def test_verify_refuses_a_database_not_at_this_releases_migration_and_changes_nothing(
        empty_db_url: str) -> None:
    refused = verify_command(empty_db_url)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "not this release's" in refused.stderr and "hookledger migrate" in refused.stderr
    with psycopg.connect(empty_db_url) as conn:
        assert conn.execute("SELECT to_regclass('hookledger_private.ledger_events')"
                            ).fetchone() == (None,)


def test_a_migration_the_server_refuses_says_why_not_that_the_transaction_aborted(
        empty_db_url: str) -> None:
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        conn.execute(pg_sql.SQL("ALTER DATABASE {} SET default_transaction_read_only = on")
                     .format(pg_sql.Identifier(conn.info.dbname)))
    with pytest.raises(DBAPIError) as failed:
        migrate.upgrade(empty_db_url)
    assert "read-only transaction" in str(failed.value)
    assert "current transaction is aborted" not in str(failed.value)


def test_verify_spells_the_digest_of_the_migrations_byte_for_byte() -> None:
    import ledger.chain

    template = importlib.import_module("migrations.versions.0010_chain_digest_inline")
    assert ledger.chain.DIGEST == template.DIGEST


def test_the_trigger_hashes_every_kind_of_row_as_verify_does(db_url: str) -> None:
    """The trigger writes the digest out inline (0010) and verify spells the same
    expression in its own query: rows with and without raw bytes, endpoint, occurrence time
    and stored payload must agree."""
    delivery = new_event("payment.confirmed", 91000, reference="KIND-1", amount=1000)
    own = replace(delivery, dedupe_key="own-event", raw_body=None, occurred_at=None,
                  headers={}, facts={}, payload_json='{"kind": "reconcile", "n": 1.50}')
    with_headers = replace(delivery, dedupe_key="with-headers", endpoint="general/main",
                           verified_by="main", headers={"user-agent": "t\u00e9"})

    async def run() -> None:
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
            await append_in(conn, [delivery, own, with_headers])
            await append_in(conn, [replace(own, dedupe_key="own-again")])
    asyncio.run(run())
    result = check(db_url)
    assert result.intact and result.checked == 4  # type: ignore[attr-defined]


@pytest.mark.parametrize("edit", [
    "raw_body = raw_body || '\\x20'::bytea",  # the bytes a payload is read from
    "payload = convert_from(raw_body, 'UTF8')::jsonb",  # the same value, stored: still a change
])
def test_an_edit_of_an_event_kept_as_raw_bytes_only_is_named(db_url: str, edit: str) -> None:
    append(db_url, 10, "RB")
    with psycopg.connect(db_url) as conn:
        stored = conn.execute("SELECT count(*) FROM hookledger_private.ledger_events "
                              "WHERE payload IS NULL").fetchone()
    assert stored == (10,)  # each payload is its raw body's reading: kept once (0009)
    tamper(db_url, 4, edit)
    assert check(db_url).first_mismatch == 4  # type: ignore[attr-defined]


@pytest.mark.parametrize("start", ["0001", "0002", "0003", "0004", "0008"])
def test_upgrading_a_ledger_with_events_keeps_them_and_chains_them(
        empty_db_url: str, start: str, monkeypatch: pytest.MonkeyPatch) -> None:
    migrate.upgrade(empty_db_url, start)
    with monkeypatch.context() as before_0009:  # that writer stored every payload
        before_0009.setattr(ledger.store, "_stored_payload", lambda event: event.payload_json)
        append(empty_db_url, 20, "OLD")
    with psycopg.connect(empty_db_url) as conn:
        before = conn.execute("SELECT position, event_id, payload FROM "
                              "hookledger_private.ledger_events ORDER BY position").fetchall()
    migrate.upgrade(empty_db_url)
    with psycopg.connect(empty_db_url) as conn:
        after = conn.execute("SELECT position, event_id, payload FROM "
                             "hookledger_private.ledger_events ORDER BY position").fetchall()
    assert after == before
    append(empty_db_url, 5, "NEW")  # the trigger continues the chain the migration made
    result = check(empty_db_url)
    assert result.intact and result.checked == 25  # type: ignore[attr-defined]
    with psycopg.connect(empty_db_url) as conn:
        kept = conn.execute("SELECT payload IS NULL, count(*) FROM "
                            "hookledger_private.ledger_events GROUP BY 1 ORDER BY 1").fetchall()
        same = conn.execute("SELECT bool_and(payload = convert_from(raw_body, 'UTF8')::jsonb) "
                            "FROM hookledger.ledger").fetchone()
    assert kept == [(False, 20), (True, 5)] and same == (True,)


def test_a_downgrade_that_would_break_the_chain_is_refused(empty_db_url: str) -> None:
    """Below 0009 every payload is stored; filling in the derived ones would change their
    digests, so the downgrade stops and the ledger stays as it was."""
    migrate.upgrade(empty_db_url)
    append(empty_db_url, 3, "DG")
    with pytest.raises(DBAPIError, match="cannot downgrade below 0009"):
        migrate.downgrade(empty_db_url, "0008")
    result = check(empty_db_url)
    assert result.intact and result.checked == 3  # type: ignore[attr-defined]


def test_migration_0010_keeps_the_digest_function_of_0009_bit_for_bit() -> None:
    """0010 re-creates ``ledger_event_digest`` from its template; the text must be 0009's,
    or every hash stored before it would stop verifying."""
    before = importlib.import_module("migrations.versions.0009_payload_from_raw_body")
    after = importlib.import_module("migrations.versions.0010_chain_digest_inline")

    def body(sql: str) -> str:
        start = sql.index("SELECT sha256(")
        return " ".join(sql[start:sql.index("$$;", start)].split())

    assert body(after.UPGRADE) == body(before._digest(before.PAYLOAD_HASH))
    assert after.digest_of("NEW") == after.DIGEST.replace("ROW.", "NEW.")
    assert "ROW." not in after.UPGRADE  # every field rendered for the row it hashes


def test_migration_0014_qualifies_the_digest_of_0010_and_changes_nothing_else() -> None:
    """0014's trigger names every function and operator in ``pg_catalog``; with those names
    taken off, its digest must be 0010's, or new hashes would stop matching verify's."""
    template = importlib.import_module("migrations.versions.0010_chain_digest_inline")
    after = importlib.import_module("migrations.versions.0014_append_trigger_qualified")
    called = set(re.findall(r"(?<!pg_catalog\.)\b(\w+)\(", after.DIGEST_OF_NEW))
    assert called <= {"coalesce", "extract", "OPERATOR"}  # syntax, and qualified operators
    bare = re.sub(r"OPERATOR\(pg_catalog\.(\S+?)\)", r"\1", after.DIGEST_OF_NEW)
    assert bare.replace("pg_catalog.", "") == template.digest_of("NEW")


def test_the_projectors_discrepancy_chains_to_the_newest_event_under_repeatable_read(
        db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A database whose default isolation is REPEATABLE READ (some teams set it): an event
    ingest commits while the projector folds is still the one the projector's discrepancy
    chains to, so ``verify`` finds the ledger intact."""
    import projections.projector as projector

    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(pg_sql.SQL(
            "ALTER DATABASE {} SET default_transaction_isolation = 'repeatable read'").format(
                pg_sql.Identifier(conn.info.dbname)))
    conflicting = [new_event("payment.confirmed", 91000, reference="RR-1", amount=700),
                   new_event("payment.failed", 91055, reference="RR-1", amount=0,
                             timestamp="20261122090000")]
    folding = projector.apply_events

    async def while_ingest_commits(conn: Any, events: Any, **kwargs: Any) -> Any:
        found = await folding(conn, events, **kwargs)
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as other:
            await append_in(other, [new_event("payment.confirmed", 91000,
                                              reference="RR-MEANWHILE", amount=5)])
        return found

    async def run() -> None:
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
            await append_in(conn, conflicting)
        monkeypatch.setattr(projector, "apply_events", while_ingest_commits)
        async with await projector.connect(db_url) as conn:
            assert await projector.project_batch(conn) == 2

    asyncio.run(run())
    with psycopg.connect(db_url) as conn:
        sources = [s for (s,) in conn.execute(
            "SELECT source FROM hookledger.ledger ORDER BY position").fetchall()]
    assert sources == ["general", "general", "general", "projector"]
    result = check(db_url)
    assert result.intact and result.checked == 4  # type: ignore[attr-defined]


def test_a_delivery_whose_append_waited_for_the_lock_chains_under_repeatable_read(
        db_url: str) -> None:
    """Ingest's appends, too: a delivery whose append waits on the append lock while
    another session commits an event chains to that event, whatever the database's
    default isolation."""
    import httpx

    from ledger.schema import APPEND_LOCK_KEY
    from tests.general_events import encode, general_body
    from tests.live import running_service
    from tests.signing import general_header

    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(pg_sql.SQL(
            "ALTER DATABASE {} SET default_transaction_isolation = 'repeatable read'").format(
                pg_sql.Identifier(conn.info.dbname)))
    raw = encode(general_body("payment.confirmed", 91000, reference="RR-INGEST", amount=250))

    async def waiting_for_the_append_lock() -> None:
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
            for _ in range(200):
                cur = await conn.execute(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                    " AND classid::bigint = %s AND objid::bigint = %s",
                    (APPEND_LOCK_KEY >> 32, APPEND_LOCK_KEY & 0xFFFFFFFF))
                if (await cur.fetchone() or (0,))[0]:
                    return
                await asyncio.sleep(0.02)
        raise AssertionError("the delivery's append never waited for the lock")

    async def run(base: str) -> int:
        async with await psycopg.AsyncConnection.connect(db_url) as holder:
            await append_in(holder, [new_event("payment.confirmed", 91000,
                                               reference="RR-FIRST", amount=5)])
            answer = asyncio.create_task(asyncio.to_thread(
                httpx.post, f"{base}/webhooks/general/main", content=raw, timeout=30,
                headers={"x-service-signature": general_header("s3cret", raw)}))
            await waiting_for_the_append_lock()
            await holder.commit()
            return (await answer).status_code

    with running_service(db_url, general_secrets="main=s3cret", projector=False) as base:
        assert asyncio.run(run(base)) == 200
    result = check(db_url)
    assert result.intact and result.checked == 2  # type: ignore[attr-defined]


def test_verify_as_a_role_the_ledger_is_not_granted_to_says_so_never_tampered(
        db_url: str) -> None:
    """A role for checking that was granted the views alone, or nothing: ``verify`` stopped
    with a traceback and exit 1, the code of a tampered ledger, which a nightly check
    alarms on. Exit 2 and the refusal in one line; granted what it reads, it verifies."""
    append(db_url, 4, "RG")
    role = f"hl_checker_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(pg_sql.SQL("CREATE ROLE {} LOGIN PASSWORD 'checker'").format(
            pg_sql.Identifier(role)))
    parts = urlsplit(db_url)
    checker = urlunsplit(parts._replace(
        netloc=f"{role}:checker@{parts.netloc.rpartition('@')[2]}"))
    try:
        try:
            psycopg.connect(checker).close()
        except psycopg.OperationalError:
            pytest.skip("the test server does not let this new role in")
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute(pg_sql.SQL("GRANT USAGE ON SCHEMA hookledger TO {0}; "
                                    "GRANT SELECT ON hookledger.ledger TO {0}").format(
                                        pg_sql.Identifier(role)))
        for command in (("verify",), ("rebuild", "--verify")):
            refused = verify_command(checker, *command)
            assert refused.returncode == 2, (command, refused.stdout, refused.stderr)
            assert "Traceback" not in refused.stderr
            assert "permission denied" in refused.stderr and "TAMPERED" not in refused.stdout
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute(pg_sql.SQL(
                "GRANT USAGE ON SCHEMA hookledger_private TO {0}; GRANT SELECT ON "
                "hookledger_private.alembic_version, hookledger_private.ledger_events "
                "TO {0}").format(pg_sql.Identifier(role)))
        ok = verify_command(checker)
        assert ok.returncode == 0 and "ledger intact: 4 events" in ok.stdout, ok.stderr
    finally:
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute(pg_sql.SQL("DROP OWNED BY {0}; DROP ROLE {0}").format(
                pg_sql.Identifier(role)))


def test_a_row_inserted_by_plain_sql_and_a_cut_tail_verify_as_the_readme_says(
        db_url: str) -> None:
    """What the chain cannot tell, as the README says it: an INSERT by any role that may
    insert is chained by the trigger like hookledger's own appends, and the newest events
    deleted (triggers off) leave a shorter chain that verifies; only a head hash kept
    elsewhere shows the cut, its event no longer there with that hash."""
    append(db_url, 5, "PS")
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("INSERT INTO hookledger_private.ledger_events (stream, event_type, "
                     "source, dedupe_key, payload, received_at) VALUES ('collection:PS-X', "
                     "'payment.confirmed', 'general', 'forged', '{}', now())")
    forged: Any = check(db_url)
    assert forged.intact and forged.checked == 6
    kept_position, kept_hash = forged.head_position, forged.head_hash
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("ALTER TABLE hookledger_private.ledger_events "
                     "DISABLE TRIGGER ledger_events_refuse_update_delete")
        conn.execute("DELETE FROM hookledger_private.ledger_events WHERE position >= 5")
        conn.execute("ALTER TABLE hookledger_private.ledger_events "
                     "ENABLE TRIGGER ledger_events_refuse_update_delete")
    cut: Any = check(db_url)
    assert cut.intact and cut.checked == 4 and cut.head_hash != kept_hash
    with psycopg.connect(db_url) as conn:
        assert conn.execute("SELECT encode(chain_hash, 'hex') FROM hookledger.ledger "
                            "WHERE position = %s", (kept_position,)).fetchone() is None


def test_a_role_that_may_create_in_public_cannot_reach_the_ledger_through_the_append_trigger(
        db_url: str) -> None:
    """The append trigger named its functions and operators unqualified, so they were
    looked up on the appending session's search path: a role that may only create in a
    schema there (``public``, which every role may write to on PostgreSQL 13 and 14 unless
    revoked) added a ``nextval(text)`` and a ``convert_to(text, text)``, which PostgreSQL
    prefers to its own for a quoted literal. The next append ran them with the appender's
    rights, the tables' owner's: this one switches the immutability guard off and deletes
    an event, and hashes every field as nothing, so ``verify`` calls what follows tampered.
    """
    append(db_url, 3, "SP")
    with tenant_in_public(
            db_url, """
                CREATE FUNCTION public.nextval(text) RETURNS bigint LANGUAGE plpgsql AS $f$
                BEGIN
                    EXECUTE 'CREATE OR REPLACE FUNCTION '
                        'hookledger_private.ledger_events_refuse_change() RETURNS trigger '
                        'LANGUAGE plpgsql AS $g$ BEGIN RETURN OLD; END $g$';
                    DELETE FROM hookledger_private.ledger_events WHERE position = 2;
                    RETURN pg_catalog.nextval($1::pg_catalog.regclass);
                END $f$""",
            "CREATE FUNCTION public.convert_to(text, text) RETURNS bytea "
            "LANGUAGE sql AS $$ SELECT '\\x00'::pg_catalog.bytea $$"):
        append(db_url, 3, "SP-LATER")
        with psycopg.connect(db_url) as conn:
            positions = [p for (p,) in conn.execute(
                "SELECT position FROM hookledger.ledger ORDER BY position").fetchall()]
        assert positions == [1, 2, 3, 4, 5, 6]
        result = check(db_url)
        assert result.intact and result.checked == 6  # type: ignore[attr-defined]


def _digests(url: str, query: str) -> list[tuple[int, bytes]]:
    with psycopg.connect(url) as conn:
        return [(p, bytes(d)) for p, d in conn.execute(query).fetchall()]


FUNCTION_DIGESTS = ("SELECT position, hookledger_private.ledger_event_digest(e) "
                    "FROM hookledger_private.ledger_events e ORDER BY position")
VERIFY_DIGESTS = ledger.chain.CHAIN_QUERY.replace("position, chain_hash,", "position,")


def test_the_digest_function_runs_no_function_of_another_role(db_url: str) -> None:
    """``ledger_event_digest`` named ``convert_to``, ``sha256``, ``round``, ``*`` and ``||``
    bare, as the append trigger did before 0014: a ``convert_to(text, text)`` that a role
    may create in ``public`` was preferred to PostgreSQL's own for a quoted literal, and
    ran with the rights of whoever called the documented function."""
    append(db_url, 3, "DF")
    hijack = "LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'hijacked'; END $$"
    with tenant_in_public(
            db_url, f"CREATE FUNCTION public.convert_to(text, text) RETURNS bytea {hijack}",
            f"CREATE FUNCTION public.times(numeric, integer) RETURNS numeric {hijack}",
            "CREATE OPERATOR public.* (LEFTARG = numeric, RIGHTARG = integer, "
            "FUNCTION = public.times)"):
        found = _digests(db_url, FUNCTION_DIGESTS)  # the search path: "$user", public
        assert found == _pinned_digests(db_url) and len(found) == 3


def _pinned_digests(url: str) -> list[tuple[int, bytes]]:
    """Verify's digests: its own expression, PostgreSQL's functions only."""
    with psycopg.connect(url) as conn:
        conn.execute("SET search_path TO pg_catalog")
        return [(p, bytes(d)) for p, d in conn.execute(VERIFY_DIGESTS).fetchall()]


def test_migration_0016_qualifies_the_digest_function_and_keeps_every_digest(
        empty_db_url: str) -> None:
    """0016 re-creates ``ledger_event_digest`` with its names in ``pg_catalog``: every
    digest, of every kind of row, must be the same bytes before and after (and after its
    downgrade), and verify's; the downgrade puts 0010's function back as it was."""
    after = importlib.import_module("migrations.versions.0016_digest_function_qualified")
    template = importlib.import_module("migrations.versions.0010_chain_digest_inline")
    called = set(re.findall(r"(?<!pg_catalog\.)\b(\w+)\(", after.DIGEST_OF_E))
    assert called <= {"coalesce", "extract", "OPERATOR"}
    bare = re.sub(r"OPERATOR\(pg_catalog\.(\S+?)\)", r"\1", after.DIGEST_OF_E)
    assert bare.replace("pg_catalog.", "") == template.digest_of("e")

    migrate.upgrade(empty_db_url, "0015")
    delivery = new_event("payment.confirmed", 91000, reference="Q-1", amount=1000)
    rows = [delivery,
            replace(delivery, dedupe_key="own", raw_body=None, occurred_at=None, headers={},
                    facts={}, payload_json='{"kind": "reconcile", "n": 1.50}'),
            replace(delivery, dedupe_key="headers", endpoint="general/main",
                    verified_by="main", headers={"user-agent": "t\u00e9"})]

    async def run() -> None:
        async with await psycopg.AsyncConnection.connect(empty_db_url, autocommit=True) as c:
            await append_in(c, rows)
    asyncio.run(run())

    def source() -> str:
        with psycopg.connect(empty_db_url) as conn:
            row = conn.execute("SELECT prosrc FROM pg_proc "
                               "WHERE proname = 'ledger_event_digest'").fetchone()
        assert row is not None
        return str(row[0])

    before, source_before = _digests(empty_db_url, FUNCTION_DIGESTS), source()
    assert before == _pinned_digests(empty_db_url) and len(before) == 3
    migrate.upgrade(empty_db_url)
    assert "pg_catalog.convert_to(" in source()
    assert _digests(empty_db_url, FUNCTION_DIGESTS) == before
    migrate.downgrade(empty_db_url, "0015")
    assert source() == source_before
    assert _digests(empty_db_url, FUNCTION_DIGESTS) == before
    migrate.upgrade(empty_db_url)
    assert check(empty_db_url).intact  # type: ignore[attr-defined]


def test_rebuild_verify_names_a_row_s_control_characters_escaped(db_url: str) -> None:
    """The key of a row that differs is a reference a signed delivery chose, printed as it
    came: a carriage return in it drew a forged line over the DIFFERS one (a terminal shows
    "live projections are identical to a rebuild" where a row differs)."""
    from tests.reconcile_helpers import deliver

    reference = "ROW-1\r\x1b[2Klive projections are identical to a rebuild\u2028"
    deliver(db_url, "payment.confirmed", 91000, reference=reference, amount=5)
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("UPDATE hookledger_private.payments SET amount = 6 WHERE reference = %s",
                     (reference,))
    result = verify_command(db_url, "rebuild", "--verify")
    assert result.returncode == 1, result.stderr
    lines = result.stdout.splitlines()
    assert not [line for line in lines if line.startswith("live projections")]
    (differs,) = [line for line in lines if line.startswith("DIFFERS")]
    assert "ROW-1\\r\\x1b[2Klive projections" in differs
    assert not [c for c in result.stdout if not c.isprintable() and c != "\n"]
