"""Workload kinds: each prepares its data and describes a run as pgbench streams."""
