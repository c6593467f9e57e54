"""A recommendation in each managed service's form: syntax and units as the services document.

RDS: ModifyDBParameterGroup's Parameters (ParameterName, ParameterValue, ApplyMethod;
immediate only for dynamic parameters; at most 20 a request), values in the pg_settings
unit. Cloud SQL: ``gcloud sql instances patch INSTANCE --database-flags=k=v,...``. Azure:
``az postgres flexible-server parameter set --resource-group --server-name --name --value``.
CloudNativePG: ``spec.postgresql.parameters``, a map of strings. Patroni:
``postgresql.parameters``.
"""

from __future__ import annotations

import json
import shlex

import pytest
import yaml

from optimizer import managed
from optimizer.managed import ManagedFormatError, render

CHANGES = [
    ("shared_buffers", "256MB"),  # static, 8kB pages: 32768
    ("work_mem", "16MB"),  # dynamic, kB: 16384
    ("max_wal_size", "2GB"),  # dynamic (sighup), MB: 2048
    ("checkpoint_timeout", "15min"),  # s: 900
    ("random_page_cost", "1.1"),  # real, no unit
    ("effective_io_concurrency", "200"),
]


def test_rds_parameter_group_file() -> None:
    doc = json.loads(render("rds", CHANGES))
    assert isinstance(doc, list)
    by = {p["ParameterName"]: p for p in doc}
    assert set(by) == {n for n, _ in CHANGES}
    for p in doc:
        assert set(p) == {"ParameterName", "ParameterValue", "ApplyMethod"}
        assert isinstance(p["ParameterValue"], str)
    assert by["shared_buffers"] == {
        "ParameterName": "shared_buffers",
        "ParameterValue": "32768",  # 8kB pages
        "ApplyMethod": "pending-reboot",  # static: immediate is refused
    }
    assert by["work_mem"]["ParameterValue"] == "16384"  # kB
    assert by["work_mem"]["ApplyMethod"] == "immediate"
    assert by["max_wal_size"]["ParameterValue"] == "2048"  # MB
    assert by["checkpoint_timeout"]["ParameterValue"] == "900"  # s
    assert by["random_page_cost"]["ParameterValue"] == "1.1"


def test_rds_booleans_are_1_or_0_and_durability_unsafe_knobs_are_left_out() -> None:
    changes = [("jit", "off"), ("fsync", "off"), ("full_page_writes", "off")]
    doc = json.loads(render("rds", changes))
    assert doc == [{"ParameterName": "jit", "ParameterValue": "0", "ApplyMethod": "immediate"}]
    left = managed.omitted(changes)
    assert [x.split(" ")[0] for x in left] == ["fsync", "full_page_writes"]


def test_rds_refuses_more_than_20_parameters() -> None:
    many = [("work_mem", "4MB")] * 21
    with pytest.raises(ManagedFormatError, match="at most 20"):
        render("rds", many)


def test_cloudsql_patch_line() -> None:
    text = render("cloudsql", CHANGES, header=["session 7"])
    lines = [x for x in text.splitlines() if x and not x.startswith("#")]
    assert len(lines) == 1
    argv = shlex.split(lines[0])
    assert argv[:4] == ["gcloud", "sql", "instances", "patch"]
    assert argv[4] == "${INSTANCE:?set INSTANCE to the Cloud SQL instance}"
    flags = argv[5]
    assert flags.startswith("--database-flags=")
    pairs = dict(kv.split("=", 1) for kv in flags.removeprefix("--database-flags=").split(","))
    assert pairs == {
        "shared_buffers": "32768",
        "work_mem": "16384",
        "max_wal_size": "2048",
        "checkpoint_timeout": "900",
        "random_page_cost": "1.1",
        "effective_io_concurrency": "200",
    }
    assert "REPLACES every flag" in text  # the flag's documented behaviour, said up front
    assert "# session 7" in text
    assert "shared_buffers: Cloud SQL restarts" in text


def test_cloudsql_booleans_are_on_off() -> None:
    text = render("cloudsql", [("jit", "false")])
    assert "--database-flags=jit=off" in text


def test_azure_parameter_set_lines() -> None:
    text = render("azure", CHANGES)
    sets = [shlex.split(x) for x in text.splitlines() if x.startswith("az postgres")]
    restart = [a for a in sets if a[3] == "restart"]
    sets = [a for a in sets if a[3] == "parameter"]
    assert len(sets) == len(CHANGES)
    for argv in sets:
        assert argv[:5] == ["az", "postgres", "flexible-server", "parameter", "set"]
        opts = dict(zip(argv[5::2], argv[6::2], strict=True))
        assert set(opts) == {"--resource-group", "--server-name", "--name", "--value"}
    values = {dict(zip(a[5::2], a[6::2], strict=True))["--name"]: a[-1] for a in sets}
    assert values["shared_buffers"] == "32768"
    assert values["work_mem"] == "16384"
    assert len(restart) == 1  # shared_buffers is static
    assert "set -e" in text.splitlines()


def test_cnpg_yaml() -> None:
    text = render("cnpg", CHANGES, header=["session 7"])
    doc = yaml.safe_load(text)
    assert doc["apiVersion"] == "postgresql.cnpg.io/v1"
    assert doc["kind"] == "Cluster"
    params = doc["spec"]["postgresql"]["parameters"]
    assert params == {
        "shared_buffers": "256MB",
        "work_mem": "16MB",
        "max_wal_size": "2GB",
        "checkpoint_timeout": "15min",
        "random_page_cost": "1.1",
        "effective_io_concurrency": "200",
    }
    assert all(isinstance(v, str) for v in params.values())  # CNPG's map of strings


def test_patroni_yaml() -> None:
    doc = yaml.safe_load(render("patroni", [("work_mem", "8192"), ("jit", "off")]))
    assert doc == {"postgresql": {"parameters": {"work_mem": "8MB", "jit": "off"}}}


def test_nothing_changed_is_still_valid() -> None:
    assert json.loads(render("rds", [])) == []
    assert yaml.safe_load(render("cnpg", []))["spec"]["postgresql"]["parameters"] == {}
    assert "nothing to change" in render("cloudsql", [])


def test_unknown_format_and_bad_value() -> None:
    with pytest.raises(ManagedFormatError, match="no managed format"):
        render("heroku", CHANGES)
    with pytest.raises(ManagedFormatError, match="work_mem"):
        render("rds", [("work_mem", "lots")])
