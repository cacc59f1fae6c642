"""Prometheus metrics of ingest, on a registry owned by the app (never the global one)."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


@dataclass(frozen=True)
class IngestMetrics:
    registry: CollectorRegistry
    accepted: Counter
    duplicates: Counter
    refused: Counter
    spooled: Counter
    spool_bytes: Gauge
    append_seconds: Histogram
    batch_size: Histogram

    def outcomes(self, system: str) -> SystemOutcomes:
        """One system's outcome counters, labelled once: a label lookup per delivery cost
        a microsecond on the hot path."""
        return SystemOutcomes(self.accepted.labels(system), self.duplicates.labels(system),
                              self.spooled.labels(system))

    @classmethod
    def create(cls, registry: CollectorRegistry | None = None) -> IngestMetrics:
        registry = registry or CollectorRegistry()
        return cls(
            registry=registry,
            accepted=Counter("hookledger_deliveries_accepted", "Deliveries appended to the ledger",
                             ["system"], registry=registry),
            duplicates=Counter("hookledger_deliveries_duplicate",
                               "Deliveries already in the ledger", ["system"], registry=registry),
            spooled=Counter("hookledger_deliveries_spooled",
                            "Deliveries answered 200 from the durable spool (database down)",
                            ["system"], registry=registry),
            spool_bytes=Gauge("hookledger_spool_bytes",
                              "Bytes in the spool, waiting for the database",
                              registry=registry),
            refused=Counter("hookledger_deliveries_refused", "Deliveries refused, by reason",
                            ["system", "reason"], registry=registry),
            append_seconds=Histogram(
                "hookledger_append_seconds", "Time from a delivery's hand-off to its commit",
                buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
                registry=registry),
            batch_size=Histogram(
                "hookledger_append_batch_size", "Events per group-committed append",
                buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512), registry=registry),
        )


@dataclass(frozen=True)
class SystemOutcomes:
    accepted: Counter
    duplicates: Counter
    spooled: Counter
