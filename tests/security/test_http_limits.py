"""Issue 40, finding 5 (HTTP): proxy headers, a global wrong-token budget, half-sent
request headers.

Found: wrong tokens sent with a different ``X-Forwarded-For`` each time were never
throttled, because uvicorn believes proxy headers from loopback by default; and a
connection that sent half a request line was held open for good (uvicorn times out
only the idle time between requests). Now ``knobtune serve`` believes proxy headers only
from ``KNOBTUNE_TRUSTED_PROXIES`` (none by default), every token check answers 429 for a
while once too many wrong tokens came from all addresses together, and a request's
headers must be complete within ``KNOBTUNE_HEADER_TIMEOUT_S``.
"""

from __future__ import annotations

import http.client
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from app.api.transport import uvicorn_options
from app.main import create_app
from app.settings import Settings
from tests.helpers import ServiceProcess

TOKEN = "tok-http-limits-0123456789"
HEADER_TIMEOUT_S = 1.0


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    """`knobtune serve` as deployed, with a token and a 1 s header deadline."""
    svc = ServiceProcess(
        tmp_path_factory.mktemp("http-limits"),
        KNOBTUNE_API_TOKEN=TOKEN,
        KNOBTUNE_RUN_SCHEDULER="false",
        KNOBTUNE_HEADER_TIMEOUT_S=str(HEADER_TIMEOUT_S),
        # uvicorn's own fallback when no proxies are passed: must not be used
        FORWARDED_ALLOW_IPS="*",
    )
    svc.start()
    try:
        yield svc
    finally:
        svc.stop()


def closed_after(sock: socket.socket, limit_s: float) -> float:
    """Seconds until the server closed ``sock`` (EOF); fails after ``limit_s``."""
    start = time.monotonic()
    sock.settimeout(limit_s)
    try:
        while sock.recv(4096):
            pass  # a response would be read here; we wait for the close itself
    except TimeoutError:
        pytest.fail(f"the connection was still open after {limit_s} s")
    except ConnectionResetError:
        pass
    return time.monotonic() - start


# -- half-sent request headers -------------------------------------------------------------
def test_a_half_sent_request_line_is_closed_within_the_timeout(served: ServiceProcess) -> None:
    with socket.create_connection(("127.0.0.1", served.port), timeout=5) as sock:
        sock.sendall(b"GET /healthz HT")  # half a request line, then nothing
        waited = closed_after(sock, 4 * HEADER_TIMEOUT_S + 2)
    # the deadline, not a refusal of the bytes: closed after about 1 s
    assert 0.5 * HEADER_TIMEOUT_S < waited < 4 * HEADER_TIMEOUT_S + 2


def test_headers_trickled_a_byte_at_a_time_meet_the_same_deadline(
    served: ServiceProcess,
) -> None:
    request = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 100
    with socket.create_connection(("127.0.0.1", served.port), timeout=5) as sock:
        start = time.monotonic()
        try:
            for byte in request:  # each byte resets nothing: the deadline is absolute
                sock.sendall(bytes([byte]))
                time.sleep(0.1)
                if time.monotonic() - start > 4 * HEADER_TIMEOUT_S + 2:
                    pytest.fail("still accepting header bytes long after the deadline")
        except (BrokenPipeError, ConnectionResetError):
            pass  # closed while we were writing
        closed_after(sock, 4 * HEADER_TIMEOUT_S + 2)
    assert time.monotonic() - start < 4 * HEADER_TIMEOUT_S + 4


def test_whole_requests_on_a_kept_alive_connection_are_served(served: ServiceProcess) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=5)
    try:
        for _ in range(3):
            conn.request("GET", "/healthz")
            r = conn.getresponse()
            assert r.status == 200
            r.read()
            time.sleep(0.3)  # within uvicorn's keep-alive, after the first deadline's start
    finally:
        conn.close()


# -- proxy headers ---------------------------------------------------------------------------
def test_forwarded_for_does_not_escape_the_per_address_throttle(served: ServiceProcess) -> None:
    with httpx.Client(base_url=served.url, timeout=10) as api:
        codes = [
            api.get(
                "/api/v1/targets",
                headers={"Authorization": "Bearer wrong", "X-Forwarded-For": f"10.9.0.{i}"},
            ).status_code
            for i in range(1, 8)
        ]
    # five free failures, a sixth that locks the (real) address, then 429
    assert codes[:6] == [401] * 6, codes
    assert codes[6] == 429, codes


def test_proxy_headers_only_from_the_listed_proxies() -> None:
    default = uvicorn_options(Settings())
    assert default["proxy_headers"] is False
    assert default["forwarded_allow_ips"] == []  # never None: uvicorn's env fallback
    listed = uvicorn_options(Settings(trusted_proxies="10.0.0.5, 10.1.0.0/16"))
    assert listed["proxy_headers"] is True
    assert listed["forwarded_allow_ips"] == ["10.0.0.5", "10.1.0.0/16"]
    with pytest.raises(ValueError, match="IP address or network"):
        Settings(trusted_proxies="proxy.internal")


# -- the global wrong-token budget -----------------------------------------------------------
def test_wrong_tokens_from_many_addresses_lock_every_token_check(tmp_path: Path) -> None:
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'm.db'}",
        work_dir=tmp_path,
        run_scheduler=False,
        api_token=TOKEN,
        auth_free_failures=100,  # no address alone is ever locked here
        auth_global_failures=10,
    )
    app = create_app(settings)
    right = {"Authorization": f"Bearer {TOKEN}"}
    wrong = {"Authorization": "Bearer wrong"}
    with TestClient(app) as first:  # runs the lifespan; the others share the app

        def from_(i: int) -> TestClient:
            return TestClient(app, client=(f"10.8.0.{i}", 40000))

        assert first.get("/api/v1/targets", headers=right).status_code == 200
        for i in range(11):  # the 11th wrong token in a minute is one too many
            assert from_(i).get("/api/v1/targets", headers=wrong).status_code == 401
        r = from_(50).get("/api/v1/targets", headers=right)
        assert r.status_code == 429, r.text  # a new address, the right token: not checked
        assert "KNOBTUNE_AUTH_GLOBAL_FAILURES" in r.json()["detail"]
        assert 55 <= int(r.headers["retry-after"]) <= 60
        r = from_(51).post("/login", data={"token": TOKEN, "next": "/"})
        assert r.status_code == 429  # the dashboard's login too
        # once the lock ends (shortened here), the right token is checked again
        app.state.auth_throttle.GLOBAL_LOCK_S = 0.3
        app.state.auth_throttle._all_locked_until = time.monotonic() + 0.3
        time.sleep(0.4)
        assert from_(52).get("/api/v1/targets", headers=right).status_code == 200
