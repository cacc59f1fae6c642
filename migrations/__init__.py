"""Alembic migrations, shipped inside the distribution so an installed hookledger migrates."""
