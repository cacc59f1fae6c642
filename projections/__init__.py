"""Projections: pure folds of the ledger into current state (issue 5)."""
