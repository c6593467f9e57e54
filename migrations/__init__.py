"""Alembic migrations of the metadata DB: the single source of its schema."""
