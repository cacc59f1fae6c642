"""Prometheus metrics of reconciliation, on the service's registry (never the global one)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

KINDS = ("missing_webhook", "status_mismatch", "amount_mismatch", "unresolved",
         "unknown_at_provider", "conflicting_events", "unsettled_paid_invoice",
         "refunded_invoice_payment", "cancelled_invoice_paid", "unprojectable_event",
         "malformed_delivery", "recorded_twice")


@dataclass(frozen=True)
class ReconcileMetrics:
    open_discrepancies: Gauge
    repaired: Counter
    arrival_lag: Histogram
    oldest_unchecked: Gauge
    passes: Counter
    lookup_errors: Counter
    last_pass: Gauge

    @classmethod
    def create(cls, registry: CollectorRegistry) -> ReconcileMetrics:
        metrics = cls(
            open_discrepancies=Gauge("hookledger_discrepancies_open",
                                     "Open discrepancies, by kind", ["kind"],
                                     registry=registry),
            repaired=Counter("hookledger_reconcile_repaired",
                             "Subjects whose state was recovered through the API (a webhook "
                             "was lost)", ["subject"], registry=registry),
            arrival_lag=Histogram(
                "hookledger_webhook_arrival_lag_seconds",
                "Provider timestamp to receipt, general deliveries (1 s resolution)",
                buckets=(1, 2, 5, 10, 30, 60, 120, 300, 900, 3600, 21600, 86400),
                registry=registry),
            oldest_unchecked=Gauge("hookledger_oldest_unchecked_expectation_seconds",
                                   "Age of the oldest expectation never checked and not "
                                   "resolved (0 when none)", registry=registry),
            passes=Counter("hookledger_reconcile_passes", "Reconciliation passes, by outcome",
                           ["outcome"], registry=registry),
            # a provider outage or a wrong API key: passes still "ran", every lookup failed
            lookup_errors=Counter("hookledger_reconcile_lookup_errors",
                                  "Reference-API lookups that gave no answer to judge, by "
                                  "error", ["error"], registry=registry),
            # a process whose passes stopped (a pass hung on a dead connection) shows its age
            last_pass=Gauge("hookledger_reconcile_last_pass_timestamp_seconds",
                            "When this process's last pass that ran ended (Unix time)",
                            registry=registry),
        )
        for kind in KINDS:
            metrics.open_discrepancies.labels(kind=kind).set(0)
        return metrics

    # PassObserver
    def recovered(self, subject: str, count: int) -> None:
        self.repaired.labels(subject=subject).inc(count)

    def after_pass(self, open_by_kind: dict[str, int], oldest_unchecked: datetime | None,
                   lags: Sequence[float]) -> None:
        for kind in set(KINDS) | set(open_by_kind):
            self.open_discrepancies.labels(kind=kind).set(open_by_kind.get(kind, 0))
        age = (datetime.now(UTC) - oldest_unchecked).total_seconds() if oldest_unchecked else 0
        self.oldest_unchecked.set(max(age, 0.0))
        for lag in lags:
            self.arrival_lag.observe(max(lag, 0.0))
