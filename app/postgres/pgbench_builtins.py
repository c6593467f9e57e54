"""pgbench's own builtin scripts (``pgbench -b NAME``), named once.

A module of its own, with no import, so that every layer can read the names cheaply: the
pgbench runner beside it checks a run's builtin against them, and app/workloads/kinds.py
(the registry of every builtin workload kind, which the CLI imports) adds knobtune's own.
"""

from __future__ import annotations

PGBENCH_BUILTINS = ("tpcb-like", "simple-update", "select-only")
