"""Reconciliation against the provider's reference API (issue 6)."""
