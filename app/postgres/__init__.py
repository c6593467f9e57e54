"""Adapters to a real PostgreSQL: sandbox clusters, target control, pgbench runner."""
