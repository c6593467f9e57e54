"""Finding 1 of issue 40: the service was a bridge to whatever its host can reach.

``host=127.0.0.1 port=5432 user=postgres`` was accepted, and a session's preflight then
ran ``COPY ... TO PROGRAM`` as that server's superuser, on the service's host. A unix
socket DSN reached the same server, and refused connections told a closed port from
Redis or SSH, with the first byte of their banner.

Now an API client's DSN may lead only where the operator allows (KNOBTUNE_TARGET_HOSTS;
by default no loopback, link-local or unspecified address and no unix socket), every
host of it checked and names resolved at registration and before every connection;
errors say only "refused", "timeout" or "not PostgreSQL". The trust server here is a
disposable cluster on loopback (tests/security/local_servers.py), never the host's own.
"""

from __future__ import annotations

import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.cli import shared
from app.main import create_app
from app.postgres.sandbox import Sandbox, free_port
from tests.security.conftest import session_body
from tests.security.local_servers import FakeServer, settings_for, trust_cluster, trust_dsn

LOOPBACK_ALLOWED = ["*", "127.0.0.1/32"]


@pytest.fixture(scope="module")
def trusting() -> Iterator[Sandbox]:
    with trust_cluster() as sb:
        yield sb


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    """The service on default settings (scheduler off: registration and preflight)."""
    tmp = tmp_path_factory.mktemp("dest")
    with TestClient(create_app(settings_for(tmp, run_scheduler=False))) as c:
        yield c


def _client(tmp: Path, **settings: Any) -> TestClient:
    return TestClient(create_app(settings_for(tmp, run_scheduler=False, **settings)))


def _refused(api: TestClient, dsn: str) -> str:
    r = api.post("/api/v1/targets", json={"name": "refused", "dsn": dsn})
    assert r.status_code == 422, (dsn, r.text)
    detail = str(r.json()["detail"])
    assert "KNOBTUNE_TARGET_HOSTS" in detail, detail  # what to configure
    return detail


def test_the_hosts_own_trusting_server_is_refused_and_no_program_runs(
    api: TestClient, trusting: Sandbox, marker: Path
) -> None:
    for dsn in (
        trust_dsn(trusting),  # loopback, trust: the service host's superuser
        trust_dsn(trusting, host=str(trusting.socket_dir)),  # its unix socket
        trust_dsn(trusting, host="localhost"),  # a name that resolves to loopback
        f"host=db.example hostaddr=127.0.0.1 port={trusting.port} user=postgres",
        f"host=192.0.2.10,127.0.0.1 port={trusting.port} user=postgres",  # every host
        f"hostaddr=127.1 port={trusting.port} user=postgres",  # inet_aton's spelling
        f"host=::ffff:127.0.0.1 port={trusting.port} user=postgres",
        f"postgresql://postgres@127.0.0.1:{trusting.port}/postgres",
        "host=127.0.0.1 port=5432 user=postgres dbname=postgres",  # refused: never connects
        "host=169.254.169.254 port=80 user=x",  # link-local: a cloud's metadata service
        "host=0.0.0.0 port=5432 user=x",
        "dbname=postgres user=postgres",  # libpq's default: the local socket
    ):
        detail = _refused(api, dsn)
        assert "cannot connect" in detail, detail
    assert api.get("/api/v1/targets").json() == []
    # so there is no target to run `COPY ... TO PROGRAM` on, and nothing ran
    copy = f"COPY (SELECT 1) TO PROGRAM 'id > {marker}';"
    r = api.post("/api/v1/sessions", json=session_body(1, copy))
    assert r.status_code == 422
    assert not marker.exists()


def test_what_the_operator_allows_is_reachable_and_names_are_checked_again(
    trusting: Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """KNOBTUNE_TARGET_HOSTS lets a loopback CIDR in, and nothing more; a name is
    resolved again before each connection: one that now leads to another loopback
    address is refused (a DNS answer that changes cannot rebind a registered target)."""
    answers = {"db.test": "127.0.0.1"}
    real = socket.getaddrinfo

    def resolver(host: Any, *args: Any, **kwargs: Any) -> Any:
        return real(answers.get(host, host), *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", resolver)
    with _client(tmp_path, target_hosts=[*LOOPBACK_ALLOWED, "/nowhere-else"]) as api:
        dsn = f"host=db.test port={trusting.port} user=postgres dbname=postgres"
        body = {
            "name": "t",
            "dsn": dsn,
            "workload_dsn": dsn.replace("user=postgres", "user=app"),
            "ram_bytes": 1 << 30,  # a name: not known to be this host
            "cpus": 1,
        }
        r = api.post("/api/v1/targets", json=body)
        assert r.status_code == 201, r.text
        tid = r.json()["id"]
        first = api.post("/api/v1/sessions", json=session_body(tid, "SELECT 2;"))
        assert first.status_code == 202, first.text  # its preflight ran there
        api.post(f"/api/v1/sessions/{first.json()['id']}/cancel")
        answers["db.test"] = "127.0.0.2"  # DNS changed: still loopback, not in the CIDR
        r = api.post("/api/v1/sessions", json=session_body(tid, "SELECT 2;"))
        assert r.status_code == 422, r.text
        assert "db.test: it resolves to a loopback address" in r.json()["detail"]
        # a socket directory, or loopback outside the CIDR, stays refused
        _refused(api, trust_dsn(trusting, host=str(trusting.socket_dir)))
        _refused(api, f"host=127.0.0.2 port={trusting.port} user=postgres")


def test_refusals_and_failures_do_not_work_as_a_port_scanner(
    trusting: Sandbox, tmp_path: Path
) -> None:
    closed = free_port()
    with (
        FakeServer(banner=b"SSH-2.0-OpenSSH_9.6\r\n") as ssh,
        FakeServer(banner=b"+OK redis ready\r\n") as redis,
        _client(tmp_path, target_hosts=LOOPBACK_ALLOWED) as api,
    ):
        said: dict[str, str] = {}
        for name, port in (("closed", closed), ("ssh", ssh.port), ("redis", redis.port)):
            for sslmode in ("disable", "prefer"):
                r = api.post(
                    "/api/v1/targets",
                    json={"name": name, "dsn": f"host=127.0.0.1 port={port} user=x "
                          f"sslmode={sslmode} connect_timeout=3"},
                )  # fmt: skip
                assert r.status_code == 422, r.text
                said[f"{name}-{sslmode}"] = r.json()["detail"]
    assert "(connection refused)" in said["closed-disable"]
    for key in ("ssh-disable", "ssh-prefer", "redis-disable", "redis-prefer"):
        detail = said[key]
        # (an SSH server that took SSLRequest's 'S' for "yes": TLS waits for its hello)
        kinds = ["(not PostgreSQL, or it closed the connection)", "(timeout)"]
        assert any(k in detail for k in kinds[: 2 if key == "ssh-prefer" else 1]), detail
        # no banner, not even its first byte ("received S", "negotiation: +")
        for leak in ("SSH", "OpenSSH", "redis", "+OK", "received", "negotiation", ": S", ": +"):
            assert leak not in detail, (key, leak, detail)


def test_the_cli_in_process_is_the_operator_and_may_reach_local_servers(
    trusting: Sandbox,
) -> None:
    with tempfile.TemporaryDirectory() as tmp, shared.connect(
        None, None, database_url=f"sqlite:///{tmp}/m.db", work_dir=Path(tmp),
        run_scheduler=False,
    ) as api:  # fmt: skip
        got = api.call("POST", "/api/v1/targets", json={"name": "mine", "dsn": trust_dsn(trusting)})
        assert got["workload_dsn"] is None  # the operator's own DSN runs the workload
        api.call("DELETE", f"/api/v1/targets/{got['id']}")
    from app.postgres import connect

    assert not connect.current().operator  # the in-process app's allowance ended with it
