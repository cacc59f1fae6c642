"""Settings, read once at the edge into one typed object.

Sources, strongest first: ``HOOKLEDGER_*`` environment variables, then ``hookledger.toml``
in the working directory (same keys, lower-case, without the prefix), then defaults. A bad
value fails at start-up with the key's name (pydantic's error names it).
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from ingest.hosts import is_loopback_host

MAX_GENERAL_WEBHOOKS = 3  # the provider allows up to three callback URLs
# the longest time a duration setting may name, ten years: a "never" such as 99999999999
# overflowed the date arithmetic it feeds, after start-up, with no word of the variable
# (such a rotation grace answered every chat delivery 500; such a resolution window or
# re-check age failed every reconciliation pass)
MAX_DURATION_S = 10 * 366 * 86400
# the longest a small batch may linger for company: every answer waits it out, on top of
# the bounds the spool keeps (an infinite one never appended, and held serve's shutdown)
MAX_APPEND_WAIT_MS = 1000
PREFIX = "HOOKLEDGER_"
# variables under the prefix that are no setting: the test suite's and the benchmarks' own,
# and what ``serve`` hands its workers
RESERVED_PREFIXES = ("HOOKLEDGER_TEST_", "HOOKLEDGER_BENCH_", "HOOKLEDGER_INTERNAL_")


def parse_named_secrets(raw: str | dict[str, Any] | None) -> dict[str, SecretStr]:
    """Parse ``name=secret[,name=secret...]`` (or a TOML table) into named secrets."""
    if raw is None or raw == "":
        return {}
    if isinstance(raw, dict):
        pairs = [(str(k).strip(), str(v).strip()) for k, v in raw.items()]
    else:
        pairs = []
        for item in str(raw).split(","):
            item = item.strip()
            if not item:
                continue
            name, sep, secret = item.partition("=")
            if not sep:
                # never echo the item: it holds a secret
                raise ValueError("each entry must look like name=secret")
            # spaces around the "=" are layout, not the secret's: kept, every delivery
            # signed with the secret was refused (and the general system never resends)
            pairs.append((name.strip(), secret.strip()))
    secrets: dict[str, SecretStr] = {}
    for number, (name, secret) in enumerate(pairs, start=1):
        if not name or not secret:
            # the TOML table took ``name = ""``: an HMAC under an empty key, which anyone
            # can compute, verified forged deliveries
            raise ValueError(f"entry {number} must look like name=secret, the secret not "
                             "empty")
        if name in secrets:
            # not echoed either: written the wrong way round twice, the name is a secret
            raise ValueError(f"entry {number} repeats an earlier entry's name")
        if not name.replace("-", "").replace("_", "").isalnum():
            # not echoed: written the wrong way round (secret=name), the "name" is the secret
            raise ValueError("a name may hold only letters, digits, '-' and '_' (name=secret)")
        secrets[name] = SecretStr(secret)
    return secrets


def parse_error_causes(raw: str | dict[str, Any] | None) -> dict[str, int]:
    """Parse ``platformCode=95xxx[,...]`` (or a TOML table) into the chat failure table."""
    if raw is None or raw == "":
        return {}
    if isinstance(raw, dict):
        pairs = [(str(k).strip(), v) for k, v in raw.items()]
    else:
        pairs = []
        for item in str(raw).split(","):
            if item.strip():
                code, sep, cause = item.partition("=")
                if not sep or not code.strip():
                    raise ValueError(f"entry {item.strip()[:40]!r} must look like code=95xxx")
                pairs.append((code.strip(), cause.strip()))
    causes: dict[str, int] = {}
    for code, cause in pairs:
        try:
            value = int(cause)
        except (TypeError, ValueError):
            raise ValueError(f"cause of {code!r} must be a number like 95058") from None
        if not 95050 <= value <= 95099:
            raise ValueError(f"cause of {code!r} must be a chat failure code 95050-95099")
        causes[code] = value
    return causes


def _header_value(value: SecretStr | None, refusal: str) -> SecretStr | None:
    """A secret sent in an HTTP header, stripped (spaces and a line end around it are
    layout); blank is none; ``refusal`` (never the value) when a character is outside
    printable ASCII, which no header can carry."""
    if value is None:
        return None
    text = value.get_secret_value().strip()
    if not text:
        return None
    if not all(" " <= char <= "~" for char in text):
        raise ValueError(refusal)
    return SecretStr(text)


class Settings(BaseSettings):
    """Every knob of hookledger; names match CONTRACT.md's environment variables."""

    model_config = SettingsConfigDict(
        env_prefix="HOOKLEDGER_",
        toml_file="hookledger.toml",
        extra="forbid",
        case_sensitive=False,
    )

    database_url: str | None = None
    home: Path = Path("./.hookledger")
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    general_secrets: Annotated[dict[str, SecretStr], NoDecode] = Field(default_factory=dict)
    chat_secrets: Annotated[dict[str, SecretStr], NoDecode] = Field(default_factory=dict)
    api_base_url: str | None = None
    api_key: SecretStr | None = None
    admin_token: SecretStr | None = None
    provider_timezone: str = "Africa/Dar_es_Salaam"
    chat_tolerance_s: int = Field(default=300, gt=0, le=MAX_DURATION_S)
    rotation_grace_s: int = Field(default=600, ge=0, le=MAX_DURATION_S)
    resolution_window_s: int = Field(default=90, gt=0, le=MAX_DURATION_S)
    reconcile_interval_s: int = Field(default=60, gt=0, le=MAX_DURATION_S)
    # additions (documented in the README)
    max_body_bytes: int = Field(default=1024 * 1024, gt=0)
    body_timeout_s: float = Field(default=10.0, gt=0, le=MAX_DURATION_S)
    # longer than the idle expiry of the client or proxy sending to us, so that it, not we,
    # closes an idle connection: a close crossing its next request resets that request
    keep_alive_s: int = Field(default=75, gt=0, le=MAX_DURATION_S)
    log_format: str = Field(default="auto", pattern="^(auto|json|console)$")
    log_level: str = Field(default="info", pattern="^(debug|info|warning|error)$")
    embedded_os_user: str = "hookledger"
    db_pool_size: int = Field(default=10, gt=0)
    workers: int = Field(default=1, gt=0, le=64)
    append_max_batch: int = Field(default=256, gt=0)
    append_max_wait_ms: float = Field(default=0.0, ge=0, le=MAX_APPEND_WAIT_MS)
    append_timeout_s: float = Field(default=2.0, gt=0, le=MAX_DURATION_S)
    # a chat delivery may wait for it twice (its secrets' lookup, then its append), and
    # must still be answered inside the platform's 15 s, the spool's fsync included
    append_stall_s: float = Field(default=5.0, gt=0, le=6)
    rejected_keep: int = Field(default=100_000, gt=0)
    projector: bool = True  # off: this serve never projects; a `hookledger project` does
    projector_batch_size: int = Field(default=1000, gt=0)
    projector_coalesce_ms: float = Field(default=50.0, ge=0, le=5000)
    # chat capability: API field names the spec does not give, error table, media worker
    chat_rotate_secret_field: str = Field(default="secret", min_length=1)
    chat_webhook_field: str = Field(default="webhookUrl", min_length=1)
    chat_error_causes: Annotated[dict[str, int], NoDecode] = Field(default_factory=dict)
    chat_api_timeout_s: float = Field(default=10.0, gt=0, le=MAX_DURATION_S)
    chat_media: bool = True  # off: this process fetches no media (another one does)
    chat_media_poll_s: float = Field(default=2.0, gt=0, le=MAX_DURATION_S)
    chat_media_max_attempts: int = Field(default=5, gt=0)
    chat_media_retry_base_s: float = Field(default=2.0, ge=0, le=MAX_DURATION_S)
    # reconciliation (reconcile/): pacing, retries, re-checks, the record mapping, reports
    api_timeout_s: float = Field(default=10.0, gt=0, le=MAX_DURATION_S)
    api_max_attempts: int = Field(default=4, gt=0)
    api_concurrency: int = Field(default=16, gt=0)
    reconcile_rate_per_s: float = Field(default=0.0, ge=0)
    reconcile_max_per_pass: int = Field(default=5000, gt=0)
    reconcile_recheck_age_s: int = Field(default=86400, ge=0, le=MAX_DURATION_S)
    reconcile_recheck_per_pass: int = Field(default=500, ge=0)
    reconcile_refund_recheck_s: int = Field(default=6 * 3600, ge=0, le=MAX_DURATION_S)
    reconcile_payout_window_s: int = Field(default=86400, gt=0, le=MAX_DURATION_S)
    reconcile_give_up_s: int = Field(default=30 * 86400, ge=0, le=MAX_DURATION_S)
    reconcile_record_paths: dict[str, str] = Field(default_factory=dict)
    report_interval_s: int = Field(default=3600, ge=0, le=MAX_DURATION_S)
    report_keep_s: int = Field(default=30 * 86400, ge=0, le=100 * 366 * 86400)

    @field_validator("general_secrets", mode="before")
    @classmethod
    def _general(cls, value: Any) -> dict[str, SecretStr]:
        secrets = parse_named_secrets(value)
        if len(secrets) > MAX_GENERAL_WEBHOOKS:
            raise ValueError(
                f"at most {MAX_GENERAL_WEBHOOKS} general webhooks exist, got {len(secrets)}"
            )
        return secrets

    @field_validator("chat_secrets", mode="before")
    @classmethod
    def _chat(cls, value: Any) -> dict[str, SecretStr]:
        # the store's own rules, checked here: a worker refusing them at start-up instead
        # stopped serve with a traceback that named no variable
        from ingest.chat_secrets import MAX_PHONE_NUMBER_ID, MAX_SECRET, valid_phone_number_id

        secrets = parse_named_secrets(value)
        for number, secret in secrets.items():
            if not valid_phone_number_id(number):
                # not echoed: written the wrong way round (secret=id), the "id" is the secret
                raise ValueError(f"a phone number id must be 1-{MAX_PHONE_NUMBER_ID} letters, "
                                 f"digits, '-' or '_' (id=secret); one given ({len(number)} "
                                 "characters) is not")
            if len(secret.get_secret_value()) > MAX_SECRET or \
                    "\x00" in secret.get_secret_value():
                raise ValueError(f"the secret for {number} must be 1-{MAX_SECRET} characters, "
                                 "no NUL")
        return secrets

    @field_validator("admin_token")
    @classmethod
    def _admin_token(cls, value: SecretStr | None) -> SecretStr | None:
        """Spaces around the token are layout (a presented token is stripped too); a
        character outside printable ASCII could never match, since an HTTP header holds
        none (every call to ``/api`` was 401 with nothing said). Never echoed."""
        return _header_value(value, "the admin token must be printable ASCII (a bearer "
                                    "token); one character is not")

    @field_validator("api_key")
    @classmethod
    def _api_key(cls, value: SecretStr | None) -> SecretStr | None:
        """As the admin token: spaces and a line end around the key are layout (a key read
        from a file keeps its newline), and a character outside printable ASCII cannot be
        sent in the ``apiToken`` header. Either way every call to the provider failed, as a
        transport error that named nothing to fix (a non-ASCII key stopped serve at
        start with a UnicodeEncodeError). Never echoed."""
        return _header_value(value, "the API key must be printable ASCII (it is sent in a "
                                    "header); one character is not")

    @field_validator("chat_error_causes", mode="before")
    @classmethod
    def _chat_causes(cls, value: Any) -> dict[str, int]:
        return parse_error_causes(value)

    @field_validator("reconcile_record_paths", mode="before")
    @classmethod
    def _record_paths_text(cls, value: Any) -> Any:
        """The JSON the variable takes, given as text in ``hookledger.toml`` (where a table
        is the natural spelling): the same value, read the same way, not a type error."""
        if isinstance(value, str):
            try:
                return json.loads(value)
            except ValueError:
                raise ValueError("not valid JSON") from None
        return value

    @field_validator("embedded_os_user")
    @classmethod
    def _embedded_os_user(cls, value: str) -> str:
        """Blank, the embedded server failed at ``useradd`` with a message naming no
        setting."""
        if not value.strip():
            raise ValueError("must name an OS user")
        return value.strip()

    @field_validator("reconcile_record_paths")
    @classmethod
    def _record_paths(cls, value: dict[str, str]) -> dict[str, str]:
        """The mapping the API client will use, built here: refused by the client, it
        stopped `reconcile` with a traceback and `serve` with a worker's start failure."""
        from reconcile.errors import MappingError
        from reconcile.records import DEFAULT_PATHS, RecordMapping

        try:
            RecordMapping.create(value)
        except MappingError as exc:
            raise ValueError(f"{exc}; the fields are {', '.join(sorted(DEFAULT_PATHS))}"
                             ) from None
        for name, path in value.items():
            if not all(step.strip() for step in path.split(".")):
                raise ValueError(f"the path of {name!r} must be dotted names such as "
                                 "payment.state, with no empty step")
        return value

    @field_validator("host")
    @classmethod
    def _host(cls, value: str) -> str:
        """A blank host (``HOOKLEDGER_HOST=`` in an env file) made the socket listen on every
        interface, not on the documented default, loopback."""
        if not value.strip():
            raise ValueError("must name the address to listen on, such as 127.0.0.1 "
                             "(0.0.0.0 for every interface)")
        return value

    @field_validator("home", mode="before")
    @classmethod
    def _home(cls, value: Any) -> Any:
        """A blank home (``HOOKLEDGER_HOME=`` in an env file) was the working directory: the
        embedded cluster, the spool and the media went wherever the command ran."""
        if isinstance(value, str) and not value.strip():
            raise ValueError("must name a folder (the default is ./.hookledger)")
        return value

    @field_validator("provider_timezone")
    @classmethod
    def _zone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ValueError(f"unknown time zone {value!r}") from exc
        return value

    @field_validator("database_url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value in (None, ""):
            return None
        assert value is not None
        if not value.startswith(("postgresql://", "postgres://", "postgresql+psycopg://")):
            raise ValueError("must be a postgresql:// URL")
        from psycopg import ProgrammingError
        from psycopg.conninfo import conninfo_to_dict

        rest = value.split("://", 1)[1]
        # libpq ends the host part at the first "/": one in the user name or password (a
        # generated password may well hold one) made the rest of it the database's name
        # and the password's start the port, words a connection error then repeats. A
        # database name with an "@" and no user before it reads the same way, and is
        # refused with it (write its "@" as %40)
        head = rest.split("?", 1)[0]
        unreadable = "@" in head and "/" in head.split("@", 1)[0]
        try:  # as libpq reads it (hookledger.database.libpq_url), without connecting
            conninfo_to_dict("postgresql://" + rest)
        except ProgrammingError:
            unreadable = True
        if unreadable:
            # not libpq's message: it quotes the piece it cannot read, for a "%" not
            # written "%25" the whole password, which every command's traceback and every
            # line serve's pool and projector logged showed (SQLAlchemy, migrating first,
            # read the same URL without a word)
            raise ValueError("libpq cannot read it: in the user name or password, write "
                             "a % as %25, an @ as %40 and a / as %2F") from None
        return value

    @field_validator("api_base_url")
    @classmethod
    def _api_url(cls, value: str | None) -> str | None:
        """Refused here, not on the first reconciliation pass: without a scheme the HTTP
        client fails every request, and reconciliation would only log errors for ever."""
        value = (value or "").strip()  # a trailing newline from an env file is no part of it
        if not value:
            return None
        try:
            parts = urlsplit(value)
            parts.port  # noqa: B018 - raises ValueError for a port that is not a number
            usable = (parts.scheme in ("http", "https") and bool(parts.hostname)
                      and not parts.query and not parts.fragment
                      and value.isprintable() and " " not in value)
        except ValueError:  # that, or a malformed IPv6 address
            usable = False
        if not usable:
            raise ValueError("must be an http:// or https:// URL with a host and no query, "
                             "such as https://api.example.com")
        return value

    def _secrets_by_place(self) -> list[tuple[str, str]]:
        """Every secret this process was given (both systems', the API key, the admin
        token), each beside where it is set: the variable, and the name or number."""
        places = [(f"HOOKLEDGER_GENERAL_SECRETS {name}", secret.get_secret_value())
                  for name, secret in self.general_secrets.items()]
        places += [(f"HOOKLEDGER_CHAT_SECRETS {number}", secret.get_secret_value())
                   for number, secret in self.chat_secrets.items()]
        places += [(variable, secret.get_secret_value())
                   for variable, secret in (("HOOKLEDGER_API_KEY", self.api_key),
                                            ("HOOKLEDGER_ADMIN_TOKEN", self.admin_token))
                   if secret]
        return places

    def secret_values(self) -> list[str]:
        """Every secret this process was given: what logs and refusals must never show."""
        return [value for _, value in self._secrets_by_place()]

    def api_key_in_the_clear(self) -> str | None:
        """The host an API key is sent to over plain ``http://`` off this machine, or None:
        anyone on the path reads the key (the chat webhook URL is held to https for the
        same reason). Warned of, not refused: an internal network may be trusted."""
        if self.api_key is None or self.api_base_url is None:
            return None
        parts = urlsplit(self.api_base_url)
        host = parts.hostname or ""
        return host if parts.scheme == "http" and not is_loopback_host(host) else None

    def secrets_shorter_than(self, length: int) -> list[str]:
        """Where each configured secret shorter than ``length`` is set, never the secret:
        what the log masker cannot mask, which an operator should hear about at start."""
        return [place for place, value in self._secrets_by_place() if len(value) < length]

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.provider_timezone)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, TomlConfigSettingsSource(settings_cls))


def load_settings(**overrides: Any) -> Settings:
    return Settings(**overrides)


def unknown_variables(environ: Mapping[str, str], fields: Iterable[str]
                      ) -> list[tuple[str, str | None]]:
    """Each ``HOOKLEDGER_*`` variable that is no setting, with the setting it most likely
    meant (or None). The environment source ignores them, so a misspelt name
    (``HOOKLEDGER_GENERAL_SECRET``) left ``serve`` running without the secrets: every
    delivery answered 401, and the general system never sends one again."""
    known = [PREFIX + name.upper() for name in fields]
    found = []
    for name in sorted(environ):
        upper = name.upper()  # settings are read case-insensitively
        if not upper.startswith(PREFIX) or upper in known or upper.startswith(
                RESERVED_PREFIXES):
            continue
        close = difflib.get_close_matches(upper, known, n=1, cutoff=0.75)
        found.append((name, close[0] if close else None))
    return found


def blank_over_file(environ: Mapping[str, str], file_keys: Iterable[str]) -> list[str]:
    """Each ``HOOKLEDGER_*`` variable set blank whose setting ``hookledger.toml`` gives.
    The environment wins, so ``HOOKLEDGER_GENERAL_SECRETS=`` (an unset ``${...}`` in a
    compose file, say) replaced the file's secrets with none, and ``serve`` refused every
    delivery 401; a blank database URL put the ledger in the embedded database instead."""
    keys = {str(key).lower() for key in file_keys}
    return sorted(name for name, value in environ.items()
                  if name.upper().startswith(PREFIX) and not value.strip()
                  and name[len(PREFIX):].lower() in keys)
