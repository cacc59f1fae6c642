"""Building the reconciler from settings (used by ``serve`` and the command line)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from reconcile.client import ReferenceClient
from reconcile.records import RecordMapping
from reconcile.report import Windows
from reconcile.runner import PassConfig


def client_from(settings: Any, **overrides: Any) -> ReferenceClient:
    """The API client; the key is read from its SecretStr here and handed to httpx only."""
    if not settings.api_base_url:
        raise ValueError("HOOKLEDGER_API_BASE_URL is not set")
    key = settings.api_key.get_secret_value() if settings.api_key else None
    options: dict[str, Any] = {
        "timeout_s": settings.api_timeout_s, "max_attempts": settings.api_max_attempts,
        "concurrency": settings.api_concurrency,
        "mapping": RecordMapping.create(settings.reconcile_record_paths), **overrides}
    return ReferenceClient(settings.api_base_url, key, **options)


def config_from(settings: Any) -> PassConfig:
    return PassConfig(
        window=timedelta(seconds=settings.resolution_window_s),
        payout_window=timedelta(seconds=settings.reconcile_payout_window_s),
        recheck_age=timedelta(seconds=settings.reconcile_recheck_age_s),
        recheck_limit=settings.reconcile_recheck_per_pass,
        refund_recheck=timedelta(seconds=settings.reconcile_refund_recheck_s),
        max_subjects=settings.reconcile_max_per_pass,
        rate_per_s=settings.reconcile_rate_per_s,
        retry_base=timedelta(seconds=settings.reconcile_interval_s),
        give_up_after=(timedelta(seconds=settings.reconcile_give_up_s)
                       if settings.reconcile_give_up_s else None),
        zone=settings.zone)


def report_windows(settings: Any) -> Windows:
    """The windows a report's advice names, as reconciliation judges them."""
    return Windows(collection=timedelta(seconds=settings.resolution_window_s),
                   payout=timedelta(seconds=settings.reconcile_payout_window_s))


def report_keep(settings: Any) -> timedelta | None:
    """How long scheduled reports are kept (``HOOKLEDGER_REPORT_KEEP_S``; 0: for ever)."""
    return timedelta(seconds=settings.report_keep_s) if settings.report_keep_s else None
