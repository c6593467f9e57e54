"""The builtin workload kinds a request, the CLI and the API name, in one place (issue 43).

- pgbench's own builtin scripts (tpcb-like, simple-update, select-only), named beside the
  pgbench runner (app/postgres/pgbench_builtins.py: the runner sits below this package);
- knobtune's own workloads, with their own data and scripts in this package: analytic
  (TPC-H), OLTP (TPC-C) and hybrid (CH-benCHmark).

Everything else derives from these tuples: the CLI's choices (app/cli/), the pgbench
runner's check (app/postgres/pgbench.py). The request's Literal types
(app/workloads/schemas.py: Builtin, AnyBuiltin) must spell their values out for the type
checker; tests/app/workloads/test_kinds.py holds them equal to these tuples.

Cheap to import, on purpose: the CLI reads it without loading pydantic or psycopg (so
app/workloads/__init__.py imports nothing heavy at its top; tests/app/cli/test_import_cost.py).
"""

from __future__ import annotations

from app.postgres.pgbench_builtins import PGBENCH_BUILTINS

# knobtune's own workloads (app/workloads/tpch.py, tpcc.py, chbench.py)
KNOBTUNE_BUILTINS = ("tpch", "tpcc", "chbench")
# every builtin a workload may name: pgbench's, then knobtune's (the CLI lists them so)
ALL_BUILTINS = PGBENCH_BUILTINS + KNOBTUNE_BUILTINS

__all__ = ["ALL_BUILTINS", "KNOBTUNE_BUILTINS", "PGBENCH_BUILTINS"]
