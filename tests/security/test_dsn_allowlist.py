"""Finding 2 of issue 40: libpq's defaults carried the operator's credentials to a
destination the client chose.

A DSN with ``host=db-internal.example hostaddr=<a fake server>`` and no password made
libpq send the service user's ``~/.pgpass`` entry for db-internal.example, in clear
text, to the fake server; ``PG*`` variables, ``~/.postgresql/`` keys and the Kerberos
cache were there for the taking too. The DSN check was a deny-list that missed libpq
18's ``sslkeylogfile``, which made the (root) service create any file it named, and
``sslrootcert=/etc/shadow`` told from the error whether a file exists.

Now a DSN holds only the keywords of an allow-list, and every connection, in-process or
in a child (pgbench), is made with neutral values for every file and credential keyword
and nothing of the service's environment. The fake server here is a loopback port that
records what a client sends (tests/security/local_servers.py); loopback is allowed for
it through KNOBTUNE_TARGET_HOSTS, as an operator would.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.postgres.connect import libpq_env
from app.postgres.pgbench import find_pgbench
from tests.security.local_servers import FakeServer, settings_for

SECRET = "Pgpass-Secret-4f7x"  # the operator's password for db-internal.example
ENV_SECRET = "Env-Secret-9q2z"  # in the service's PGPASSWORD


@pytest.fixture
def operator_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The service user's HOME, with a .pgpass entry for the internal server, and the
    service's environment with libpq variables an operator might have set."""
    home = tmp_path / "home"
    (home / ".postgresql").mkdir(parents=True)
    pgpass = home / ".pgpass"
    pgpass.write_text(f"db-internal.example:*:*:*:{SECRET}\n*:*:*:*:{SECRET}\n")
    pgpass.chmod(0o600)
    monkeypatch.setenv("HOME", str(home))
    return home


@pytest.fixture
def api(tmp_path: Path) -> Iterator[TestClient]:
    # the fake server's loopback port, allowed as an operator would
    s = settings_for(tmp_path, run_scheduler=False, target_hosts=["*", "127.0.0.1/32"])
    with TestClient(create_app(s)) as c:
        yield c


def test_no_pgpass_password_goes_to_the_clients_hostaddr(
    api: TestClient, operator_home: Path
) -> None:
    with FakeServer() as fake:
        r = api.post(
            "/api/v1/targets",
            json={
                "name": "internal",
                "dsn": f"host=db-internal.example hostaddr=127.0.0.1 port={fake.port} "
                "user=app dbname=app connect_timeout=3",
            },
        )
        assert r.status_code == 422, r.text
        assert fake.received, "the service never reached the fake server"
        assert not fake.got(SECRET)
    assert "asks for a password" in r.json()["detail"]


def test_no_variable_of_the_services_environment_is_sent(
    api: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PGPASSWORD", ENV_SECRET)
    monkeypatch.setenv("PGUSER", "operator")
    monkeypatch.setenv("PGDATABASE", "operators_db")
    monkeypatch.setenv("PGAPPNAME", "operators-app")
    with FakeServer() as fake:
        r = api.post(
            "/api/v1/targets",
            json={"name": "env", "dsn": f"host=127.0.0.1 port={fake.port} connect_timeout=3"},
        )
        assert r.status_code == 422, r.text
        assert fake.received
        for own in (ENV_SECRET, "operator", "operators_db", "operators-app"):
            assert not fake.got(own), own


def test_pgbench_inherits_no_home_and_no_libpq_variable(
    api: TestClient, operator_home: Path, tmp_path: Path
) -> None:
    """A child (pgbench, where a client's scripts run) connects with the DSN's keywords
    and neutral ones only: no .pgpass, no ~/.postgresql/, no PG* or KRB5* of ours."""
    base = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(operator_home),
        "PGPASSWORD": ENV_SECRET,
        "PGSSLKEY": str(operator_home / ".postgresql" / "postgresql.key"),
        "KRB5CCNAME": "FILE:/tmp/krb5cc_operator",
        "PGSERVICE": "operators",
    }
    script = tmp_path / "s.sql"
    script.write_text("SELECT 1;\n")
    with FakeServer() as fake:
        # the environment the service (api: its settings) gives pgbench for this DSN
        env = libpq_env(f"host=db-internal.example hostaddr=127.0.0.1 port={fake.port}", base)
        res = subprocess.run(
            [find_pgbench(), "-n", "-t", "1", "-f", str(script)],
            env=env, capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert res.returncode != 0
        assert fake.received, res.stderr
        assert not fake.got(SECRET)
        assert not fake.got(ENV_SECRET)
    assert env["HOME"] != str(operator_home)
    assert not os.listdir(env["HOME"])
    for var in ("PGPASSFILE", "PGSSLCERT", "PGSSLKEY", "PGSSLROOTCERT", "PGSSLCRL"):
        assert env[var].startswith("/dev/null/"), var  # a path that cannot exist
    assert env["PGGSSENCMODE"] == "disable"
    assert env["KRB5CCNAME"] == "FILE:/dev/null/knobtune-none"
    assert "PGSERVICE" not in env
    assert "PGPASSWORD" not in env


def test_sslkeylogfile_is_refused_and_no_file_is_made(api: TestClient, tmp_path: Path) -> None:
    keylog = tmp_path / "nologin"
    with FakeServer() as fake:
        r = api.post(
            "/api/v1/targets",
            json={"name": "keylog", "dsn": f"host=127.0.0.1 port={fake.port} user=app "
                  f"sslmode=require sslkeylogfile={keylog}"},
        )  # fmt: skip
        assert not fake.received  # refused before any connection
    assert r.status_code == 422
    assert "sslkeylogfile" in r.json()["detail"]
    assert not keylog.exists()


@pytest.mark.parametrize(
    "keyword",
    [
        "passfile=/root/.pgpass",
        "service=internal",
        "sslcert=/root/.postgresql/postgresql.crt",
        "sslkey=/root/.postgresql/postgresql.key",
        "sslpassword=x",
        "sslcrl=/etc/shadow",
        "krbsrvname=postgres",
        "gssdelegation=1",
        "require_auth=gss",
        "oauth_issuer=https://169.254.169.254/",
    ],
)
def test_keywords_naming_the_hosts_files_or_credentials_are_refused(
    api: TestClient, keyword: str
) -> None:
    r = api.post("/api/v1/targets", json={"name": "k", "dsn": f"host=192.0.2.1 {keyword}"})
    assert r.status_code == 422, r.text
    # refused for the keyword, before any connection (192.0.2.1 would never answer)
    assert r.json()["detail"].startswith(
        f"the connection string may not hold {keyword.split('=')[0]}"
    )


def test_sslrootcert_is_system_or_nothing_and_tells_no_file_apart(api: TestClient) -> None:
    said = []
    for path in ("/etc/shadow", "/no/such/file"):
        r = api.post(
            "/api/v1/targets",
            json={"name": "ca", "dsn": f"host=192.0.2.1 sslmode=verify-full sslrootcert={path}"},
        )
        assert r.status_code == 422
        said.append(r.json()["detail"].replace(path, "PATH"))
    assert said[0] == said[1]  # the same words whether the file exists or not
    assert said[0].startswith("the connection string may not hold sslrootcert")
