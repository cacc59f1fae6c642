"""Settings: environment beats hookledger.toml, secrets parse strictly and stay hidden."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from hookledger.settings import Settings, parse_named_secrets, unknown_variables


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for key in list(__import__("os").environ):
        if key.startswith("HOOKLEDGER_"):
            monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)


def test_defaults_match_the_contract() -> None:
    s = Settings()
    assert (s.host, s.port, s.provider_timezone) == ("127.0.0.1", 8080, "Africa/Dar_es_Salaam")
    assert (s.chat_tolerance_s, s.rotation_grace_s, s.resolution_window_s,
            s.reconcile_interval_s) == (300, 600, 90, 60)
    assert s.database_url is None and s.home == Path(".hookledger")


def test_the_environment_wins_over_the_toml_file(monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path) -> None:
    (tmp_path / "hookledger.toml").write_text(
        'port = 9000\nhost = "0.0.0.0"\ngeneral_secrets = "a=1234,b=5678"\n')
    monkeypatch.setenv("HOOKLEDGER_PORT", "9100")
    s = Settings()
    assert (s.port, s.host) == (9100, "0.0.0.0")
    assert {k: v.get_secret_value() for k, v in s.general_secrets.items()} == {
        "a": "1234", "b": "5678"}


def test_at_most_three_general_webhooks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOOKLEDGER_GENERAL_SECRETS", "a=1,b=2,c=3,d=4")
    with pytest.raises(ValidationError, match="at most 3"):
        Settings()


@pytest.mark.parametrize("raw", ["novalue", "=secret", "a=", "a=1,a=2", "bad name=1"])
def test_malformed_secret_lists_are_refused(raw: str) -> None:
    with pytest.raises(ValueError):
        parse_named_secrets(raw)


@pytest.mark.parametrize("table", ['[general_secrets]\nmain = ""\n',
                                   '[general_secrets]\nmain = "   "\n',
                                   '[general_secrets]\n"" = "s3cr3t"\n'])
def test_the_toml_table_refuses_an_empty_secret_as_the_variable_does(
        table: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``main = ""`` in the table form was taken: every delivery was then verified with an
    HMAC under an empty key, which anyone can compute, and forged payments answered 200."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "hookledger.toml").write_text(table)
    with pytest.raises(ValidationError, match="general_secrets"):
        Settings()
    monkeypatch.setenv("HOOKLEDGER_GENERAL_SECRETS", "main=")
    with pytest.raises(ValidationError, match="general_secrets"):
        Settings()


def test_spaces_around_a_secret_are_layout_not_the_secret(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """``a = s3cr3t`` kept " s3cr3t" as the secret: every delivery signed with s3cr3t was
    refused, and the general system never resends."""
    parsed = parse_named_secrets("a = s3cr3t , b=zz ")
    assert {k: v.get_secret_value() for k, v in parsed.items()} == {"a": "s3cr3t", "b": "zz"}
    table = parse_named_secrets({" a ": " s3cr3t "})
    assert {k: v.get_secret_value() for k, v in table.items()} == {"a": "s3cr3t"}


def test_a_repeated_name_is_refused_without_quoting_it() -> None:
    """Written the wrong way round twice (``secret=primary,secret=backup``), the repeated
    "name" is the secret, and the refusal quoted it."""
    with pytest.raises(ValueError) as refused:
        parse_named_secrets("whsec_9f8e7d=primary,whsec_9f8e7d=backup")
    assert "whsec" not in str(refused.value) and "entry 2" in str(refused.value)


def test_a_pair_written_the_wrong_way_round_never_echoes_the_secret() -> None:
    """``secret=name``: the "name" is the secret, and its refusal once quoted it."""
    with pytest.raises(ValueError) as refused:
        parse_named_secrets("whsec+9f/Q2==x=main")
    assert "whsec" not in str(refused.value) and "9f/Q2" not in str(refused.value)


def test_a_chat_pair_written_the_wrong_way_round_never_echoes_the_secret(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``secret=100001``: a secret of id characters too long for an id was quoted in the
    refusal as "phone number id '...' is not a valid id"."""
    from click.testing import CliRunner

    from hookledger.cli import main

    monkeypatch.setenv("HOOKLEDGER_CHAT_SECRETS", "S3cr3t" * 14 + "=100001")
    result = CliRunner().invoke(main, ["db", "url"])
    assert result.exit_code == 2, result.output
    assert "HOOKLEDGER_CHAT_SECRETS" in result.output and "phone number id" in result.output
    assert "S3cr3t" not in result.output


def test_secrets_keep_equals_signs_and_never_print(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOOKLEDGER_CHAT_SECRETS", "1234567=abc=def")
    s = Settings()
    assert s.chat_secrets["1234567"].get_secret_value() == "abc=def"
    assert "abc=def" not in repr(s) and "abc=def" not in str(s.model_dump())


def test_an_unknown_zone_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOOKLEDGER_PROVIDER_TIMEZONE", "Mars/Olympus")
    with pytest.raises(ValidationError, match="provider_timezone"):
        Settings()


@pytest.mark.parametrize("raw", ["api.provider.example", "ftp://api.provider.example",
                                 "https://", "https://api.example:port", "/api/v1",
                                 "http://[::1", "https://api.example?key=1",
                                 "https://api.example#top", "https://api. example",
                                 "https://api.example/a\tb"])
def test_an_api_url_that_no_request_could_reach_is_refused_at_start(
        monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv("HOOKLEDGER_API_BASE_URL", raw)
    with pytest.raises(ValidationError, match="api_base_url"):
        Settings()


@pytest.mark.parametrize("raw", ["https://api.provider.example", "http://127.0.0.1:8081/",
                                 "https://api.provider.example/gateway", "http://[::1]:8081", ""])
def test_an_api_url_with_a_scheme_and_host_is_kept(monkeypatch: pytest.MonkeyPatch,
                                                   raw: str) -> None:
    monkeypatch.setenv("HOOKLEDGER_API_BASE_URL", raw)
    assert Settings().api_base_url == (raw or None)


def test_an_api_url_is_kept_without_the_spaces_or_newline_around_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOOKLEDGER_API_BASE_URL", " https://api.provider.example\n")
    assert Settings().api_base_url == "https://api.provider.example"


def test_the_provider_zone_is_known_without_the_hosts_zone_database(tmp_path: Path) -> None:
    """A slim container has no /usr/share/zoneinfo: the zones come from the tzdata package,
    so the default East Africa Time still reads (PYTHONTZPATH empty hides the system's)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("HOOKLEDGER_")}
    env.update(PYTHONTZPATH="", HOOKLEDGER_HOME=str(tmp_path))
    out = subprocess.run(
        [sys.executable, "-c", "import zoneinfo; from hookledger.settings import Settings; "
         "s = Settings(); print(zoneinfo.TZPATH, s.zone.key, "
         "s.zone.utcoffset(__import__('datetime').datetime(2026, 1, 1)))"],
        env=env, cwd=tmp_path, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["()", "Africa/Dar_es_Salaam", "3:00:00"]


@pytest.mark.parametrize("raw", ['{"stauts": "payment.state"}',
                                 '{"status": "payment.state", "amout": "payment.paid"}',
                                 '{"status": ""}', '{"status": "payment..state"}'])
def test_a_record_mapping_no_record_could_be_read_with_is_refused_at_start(
        monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv("HOOKLEDGER_RECONCILE_RECORD_PATHS", raw)
    with pytest.raises(ValidationError, match="reconcile_record_paths"):
        Settings()


def test_a_record_mapping_of_known_fields_is_kept(monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path) -> None:
    monkeypatch.setenv("HOOKLEDGER_RECONCILE_RECORD_PATHS",
                       '{"status": "payment.state", "amount": "payment.paid"}')
    assert Settings().reconcile_record_paths == {"status": "payment.state",
                                                 "amount": "payment.paid"}
    monkeypatch.delenv("HOOKLEDGER_RECONCILE_RECORD_PATHS")
    (tmp_path / "hookledger.toml").write_text(
        '[reconcile_record_paths]\nstatus = "payment.state"\n')
    assert Settings().reconcile_record_paths == {"status": "payment.state"}


def test_a_mistyped_record_field_stops_a_command_with_the_variables_name(
        monkeypatch: pytest.MonkeyPatch, db_url: str) -> None:
    """No traceback: one line naming the variable and the unknown field."""
    from click.testing import CliRunner

    from hookledger.cli import main

    monkeypatch.setenv("HOOKLEDGER_DATABASE_URL", db_url)
    monkeypatch.setenv("HOOKLEDGER_API_BASE_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("HOOKLEDGER_RECONCILE_RECORD_PATHS", '{"stauts": "payment.state"}')
    result = CliRunner().invoke(main, ["reconcile"])
    assert result.exit_code != 0 and not isinstance(result.exception, ValidationError)
    assert "HOOKLEDGER_RECONCILE_RECORD_PATHS" in result.output and "stauts" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(("variable", "toml", "named"), [
    ("notjson", None, "HOOKLEDGER_RECONCILE_RECORD_PATHS"),
    (None, b"port = \n", "hookledger.toml"),
    # TOML is UTF-8: a file saved as Latin-1 (a comment's umlaut) stopped every command
    # with a UnicodeDecodeError traceback that named no file
    (None, b"# Z\xfcrich office\nport = 9000\n", "hookledger.toml: not UTF-8 text"),
])
def test_an_unreadable_mapping_or_toml_file_stops_a_command_without_a_traceback(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, variable: str | None,
        toml: bytes | None, named: str) -> None:
    """A mapping that is not JSON, or a toml file that is not TOML, once raised out of the
    settings source (not a ValidationError) and stopped every command with a traceback."""
    from click.testing import CliRunner

    from hookledger.cli import main

    if variable is not None:
        monkeypatch.setenv("HOOKLEDGER_RECONCILE_RECORD_PATHS", variable)
    if toml is not None:
        (tmp_path / "hookledger.toml").write_bytes(toml)
    result = CliRunner().invoke(main, ["db", "url"])
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit)
    assert named in result.output and "Traceback" not in result.output
    assert "0xfc" not in result.output  # a byte of the file, which may be a secret's


@pytest.mark.parametrize("blank", ["", " "])
def test_a_blank_host_is_refused_rather_than_listening_on_every_interface(
        monkeypatch: pytest.MonkeyPatch, blank: str) -> None:
    """An empty HOOKLEDGER_HOST bound the socket to 0.0.0.0, not the default loopback."""
    monkeypatch.setenv("HOOKLEDGER_HOST", blank)
    with pytest.raises(ValidationError, match="host"):
        Settings()


@pytest.mark.parametrize("blank", ["", "  "])
@pytest.mark.parametrize(("variable", "named"), [
    # a blank home was taken as the working directory
    ("HOOKLEDGER_HOME", "home"),
    # a blank embedded OS user failed at useradd naming no setting
    ("HOOKLEDGER_EMBEDDED_OS_USER", "embedded_os_user"),
])
def test_a_blank_folder_or_user_is_refused_naming_the_setting(
        monkeypatch: pytest.MonkeyPatch, blank: str, variable: str, named: str) -> None:
    monkeypatch.setenv(variable, blank)
    with pytest.raises(ValidationError, match=named):
        Settings()


@pytest.mark.parametrize("key", ["HOOKLEDGER_PORT", "prot"])
def test_an_unknown_toml_key_is_named_as_the_files_not_as_a_variable(
        tmp_path: Path, key: str) -> None:
    """It was reported as a variable that does not exist (HOOKLEDGER_HOOKLEDGER_PORT,
    HOOKLEDGER_PROT), with no word of the file it is in."""
    from click.testing import CliRunner

    from hookledger.cli import main

    (tmp_path / "hookledger.toml").write_text(f"{key} = 9000\n")
    result = CliRunner().invoke(main, ["db", "url"])
    assert result.exit_code == 2, result.output
    assert f"hookledger.toml: unknown key '{key}'" in result.output
    assert "HOOKLEDGER_HOOKLEDGER" not in result.output and "HOOKLEDGER_PROT" not in result.output


def test_a_bad_toml_value_is_named_as_the_files_and_a_bad_variable_as_itself(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``port = "abc"`` in the file was reported as ``HOOKLEDGER_PORT``, set nowhere."""
    from click.testing import CliRunner

    from hookledger.cli import main

    (tmp_path / "hookledger.toml").write_text('port = "abc"\n')
    result = CliRunner().invoke(main, ["db", "url"])
    assert result.exit_code == 2 and "hookledger.toml: port:" in result.output, result.output
    monkeypatch.setenv("HOOKLEDGER_PORT", "xyz")  # the variable wins, and is the one named
    result = CliRunner().invoke(main, ["db", "url"])
    assert result.exit_code == 2 and "HOOKLEDGER_PORT:" in result.output, result.output
    assert "hookledger.toml: port" not in result.output


def test_record_paths_in_toml_may_be_the_variables_json_or_a_table(tmp_path: Path) -> None:
    (tmp_path / "hookledger.toml").write_text(
        'reconcile_record_paths = \'{"status": "payment.state"}\'\n')
    assert Settings().reconcile_record_paths == {"status": "payment.state"}
    (tmp_path / "hookledger.toml").write_text(
        'reconcile_record_paths = {status = "payment.state"}\n')
    assert Settings().reconcile_record_paths == {"status": "payment.state"}
    (tmp_path / "hookledger.toml").write_text("reconcile_record_paths = '{status'\n")
    with pytest.raises(ValidationError, match="not valid JSON"):
        Settings()


def test_a_bad_variable_stops_the_demo_with_a_message(monkeypatch: pytest.MonkeyPatch) -> None:
    """The demo built its settings itself and stopped with pydantic's traceback, which
    quotes the bad value."""
    from click.testing import CliRunner

    from hookledger.cli import main

    monkeypatch.setenv("HOOKLEDGER_PORT", "not-a-port")
    result = CliRunner().invoke(main, ["demo"])
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit)
    assert "HOOKLEDGER_PORT" in result.output and "not-a-port" not in result.output


def test_unknown_variables_are_named_with_the_setting_they_likely_meant() -> None:
    environ = {"HOOKLEDGER_GENERAL_SECRET": "main=s3cret", "HOOKLEDGER_PORT": "8080",
               "hookledger_log_levle": "info", "HOOKLEDGER_FROBNICATE": "1",
               "HOOKLEDGER_TEST_DATABASE_URL": "x", "HOOKLEDGER_BENCH_RESULTS": "x",
               "HOOKLEDGER_INTERNAL_SUPERVISOR_PID": "1", "PATH": "/bin"}
    assert unknown_variables(environ, Settings.model_fields) == [
        ("HOOKLEDGER_FROBNICATE", None),
        ("HOOKLEDGER_GENERAL_SECRET", "HOOKLEDGER_GENERAL_SECRETS"),
        ("hookledger_log_levle", "HOOKLEDGER_LOG_LEVEL")]


def test_a_misspelt_variable_stops_a_command_rather_than_being_ignored(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``HOOKLEDGER_GENERAL_SECRET`` (no S) was ignored: ``serve`` ran without secrets and
    answered every delivery 401, and the general system never sends one again."""
    from click.testing import CliRunner

    from hookledger.cli import main

    monkeypatch.setenv("HOOKLEDGER_GENERAL_SECRET", "main=whsec-not-to-be-echoed")
    result = CliRunner().invoke(main, ["db", "url"])
    assert result.exit_code == 2, result.output
    assert ("HOOKLEDGER_GENERAL_SECRET: no such setting "
            "(did you mean HOOKLEDGER_GENERAL_SECRETS?)") in result.output
    assert "whsec-not-to-be-echoed" not in result.output


DURATIONS = ("CHAT_TOLERANCE_S", "ROTATION_GRACE_S", "RESOLUTION_WINDOW_S",
             "RECONCILE_INTERVAL_S", "BODY_TIMEOUT_S", "KEEP_ALIVE_S", "APPEND_TIMEOUT_S",
             "CHAT_API_TIMEOUT_S", "CHAT_MEDIA_POLL_S", "CHAT_MEDIA_RETRY_BASE_S",
             "API_TIMEOUT_S", "RECONCILE_RECHECK_AGE_S", "RECONCILE_REFUND_RECHECK_S",
             "RECONCILE_PAYOUT_WINDOW_S", "RECONCILE_GIVE_UP_S", "REPORT_INTERVAL_S")


@pytest.mark.parametrize("name", DURATIONS)
def test_a_duration_past_what_the_clock_holds_is_refused_naming_the_variable(
        monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """A "never" such as 99999999999 was taken and overflowed the date arithmetic it feeds
    after start-up: such a rotation grace answered every chat delivery 500, such a
    resolution window failed every reconciliation pass, with a traceback naming nothing."""
    from hookledger.settings import MAX_DURATION_S

    monkeypatch.setenv(f"HOOKLEDGER_{name}", "99999999999")
    with pytest.raises(ValidationError, match=name.lower()):
        Settings()
    monkeypatch.setenv(f"HOOKLEDGER_{name}", str(MAX_DURATION_S))
    assert getattr(Settings(), name.lower()) == MAX_DURATION_S


@pytest.mark.parametrize("value", ["inf", "1001"])
def test_a_batch_may_linger_a_second_at_most(monkeypatch: pytest.MonkeyPatch,
                                            value: str) -> None:
    """``inf`` was taken: no delivery was ever appended or answered, and ``serve`` never
    stopped on SIGTERM (it waited for the linger to end)."""
    monkeypatch.setenv("HOOKLEDGER_APPEND_MAX_WAIT_MS", value)
    with pytest.raises(ValidationError, match="append_max_wait_ms"):
        Settings()
    monkeypatch.setenv("HOOKLEDGER_APPEND_MAX_WAIT_MS", "1000")
    assert Settings().append_max_wait_ms == 1000


@pytest.mark.parametrize(("variable", "toml"), [
    ("HOOKLEDGER_GENERAL_SECRETS", 'general_secrets = "main=whsec-from-the-file"\n'),
    ("HOOKLEDGER_GENERAL_SECRETS", '[general_secrets]\nmain = "whsec-from-the-file"\n'),
    ("HOOKLEDGER_DATABASE_URL", 'database_url = "postgresql://u@db.example:5432/ledger"\n'),
])
def test_a_blank_variable_never_silently_replaces_what_the_toml_file_sets(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variable: str, toml: str) -> None:
    """The environment wins, so a variable set blank (an unset ``${...}`` in a compose
    file) replaced the file's secrets with none: ``serve`` refused every delivery 401, and
    the general system never sends one again. A blank database URL put the ledger in the
    embedded database instead of the file's."""
    from click.testing import CliRunner

    from hookledger.cli import main

    (tmp_path / "hookledger.toml").write_text(toml)
    monkeypatch.setenv(variable, "")
    result = CliRunner().invoke(main, ["db", "url"])
    assert result.exit_code == 2, result.output
    key = variable[len("HOOKLEDGER_"):].lower()
    assert (f"{variable}: set but blank, which would override hookledger.toml's {key}"
            ) in result.output
    assert "whsec-from-the-file" not in result.output
    monkeypatch.delenv(variable)  # unset, the file's value is taken
    if variable == "HOOKLEDGER_DATABASE_URL":
        result = CliRunner().invoke(main, ["db", "url"])
        assert result.exit_code == 0 and "db.example" in result.output, result.output
    else:
        assert list(Settings().general_secrets) == ["main"]


def test_a_blank_variable_the_toml_file_does_not_set_is_the_default(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOOKLEDGER_GENERAL_SECRETS", "")
    monkeypatch.setenv("HOOKLEDGER_DATABASE_URL", "")
    from hookledger.cli import load_settings

    settings = load_settings()
    assert settings.general_secrets == {} and settings.database_url is None


def test_the_admin_token_is_stripped_and_one_no_header_can_carry_is_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The presented token was stripped and the configured one not, so a token set with a
    trailing newline never matched; nor could one with a character outside ASCII (headers
    are latin-1): every /api call was 401 with nothing said."""
    monkeypatch.setenv("HOOKLEDGER_ADMIN_TOKEN", "  admin-tok-7\n")
    token = Settings().admin_token
    assert token is not None and token.get_secret_value() == "admin-tok-7"
    from click.testing import CliRunner

    from hookledger.cli import main

    monkeypatch.setenv("HOOKLEDGER_ADMIN_TOKEN", "tøken-secret")
    with pytest.raises(ValidationError, match="admin_token"):
        Settings()
    result = CliRunner().invoke(main, ["db", "url"])
    assert result.exit_code == 2, result.output
    assert "HOOKLEDGER_ADMIN_TOKEN" in result.output and "printable ASCII" in result.output
    assert "tøken" not in result.output
