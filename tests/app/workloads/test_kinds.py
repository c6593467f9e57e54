"""The builtin workload kinds are named once, in app/workloads/kinds.py (issue 43).

A Literal type must spell its values out for the type checker, so the request's Builtin
and AnyBuiltin repeat them: these tests hold every copy equal to the registry, in the same
order (the OpenAPI enums and the CLI's choices list them in it)."""

from __future__ import annotations

import typing

from app.cli.shared import BUILTINS, PGBENCH_BUILTINS
from app.postgres import pgbench
from app.sweeps.schemas import SweepIn
from app.workloads import BUILDERS, kinds, workload_for
from app.workloads.chbench import Chbench
from app.workloads.pgbench import PgbenchWorkload
from app.workloads.schemas import AnyBuiltin, Builtin, WorkloadIn
from app.workloads.tpcc import Tpcc
from app.workloads.tpch import Tpch


def test_registry_names_pgbench_then_knobtune_kinds() -> None:
    assert kinds.PGBENCH_BUILTINS == ("tpcb-like", "simple-update", "select-only")
    assert kinds.KNOBTUNE_BUILTINS == ("tpch", "tpcc", "chbench")
    assert kinds.ALL_BUILTINS == kinds.PGBENCH_BUILTINS + kinds.KNOBTUNE_BUILTINS


def test_request_literals_equal_the_registry() -> None:
    assert typing.get_args(Builtin) == kinds.PGBENCH_BUILTINS
    assert typing.get_args(AnyBuiltin) == kinds.ALL_BUILTINS


def test_request_fields_take_the_literals() -> None:
    """The fields that name a builtin use the Literal types above (not a copy of them)."""
    assert WorkloadIn.model_fields["builtin"].annotation == AnyBuiltin | None
    assert SweepIn.model_fields["builtin"].annotation == Builtin | None


def test_cli_choices_and_pgbench_runner_read_the_registry() -> None:
    assert tuple(BUILTINS) == kinds.ALL_BUILTINS
    assert tuple(PGBENCH_BUILTINS) == kinds.PGBENCH_BUILTINS
    assert pgbench.BUILTINS == kinds.PGBENCH_BUILTINS


def test_each_knobtune_kind_has_one_builder() -> None:
    assert tuple(BUILDERS) == kinds.KNOBTUNE_BUILTINS


def test_workload_for_builds_each_kind() -> None:
    built = {k: workload_for(WorkloadIn(builtin=k)) for k in kinds.ALL_BUILTINS}
    assert {k: type(w) for k, w in built.items()} == {
        "tpcb-like": PgbenchWorkload,
        "simple-update": PgbenchWorkload,
        "select-only": PgbenchWorkload,
        "tpch": Tpch,
        "tpcc": Tpcc,
        "chbench": Chbench,
    }
