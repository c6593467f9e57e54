"""Issue 40, finding 5: the password mask showed the tail of ``password=abc\\ def``
(``password=*** def``), in responses and errors: a pattern cut the value where libpq
does not. Now the mask is checked against what libpq parses, and the DSN is written
again from the parsed keywords when the pattern falls short."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from psycopg.conninfo import conninfo_to_dict

from app.main import create_app
from app.postgres.dsn import MASK, mask_dsn
from app.postgres.sandbox import free_port
from tests.security.local_servers import settings_for

# (DSN, the password libpq reads from it)
CASES = [
    ("host=h password=abc\\ def user=u", "abc def"),
    ("host=h password='abc def ghi' user=u", "abc def ghi"),
    ("host=h password='it\\'s a \\\\secret' user=u", "it's a \\secret"),
    ("host=h password = 'spaced out'", "spaced out"),
    ("password=abc\\ def\\ ghi", "abc def ghi"),
    ("postgresql://u:p%20w%40x@h/db", "p w@x"),
    ("postgresql://u@h/db?password=abc%20def&sslmode=disable", "abc def"),
    ("postgresql://u:first@h/db?password=second", "second"),
]


@pytest.mark.parametrize(("dsn", "password"), CASES)
def test_no_part_of_a_password_survives_the_mask(dsn: str, password: str) -> None:
    masked = mask_dsn(dsn)
    for part in {password, *password.split(), *password.split("@")}:
        if len(part) >= 3:  # "a" is in any text
            assert part not in masked, (dsn, masked)
    for raw in ("def", "ghi", "secret", "spaced", "first", "second", "p%20w"):
        if raw in dsn:  # as written (quoted, escaped, percent-encoded) it is gone too
            assert raw not in masked, (dsn, masked, raw)
    parsed = conninfo_to_dict(masked)
    assert parsed.get("password") == MASK
    want = {k: v for k, v in conninfo_to_dict(dsn).items() if k != "password"}
    assert {k: v for k, v in parsed.items() if k != "password"} == want


def test_a_dsn_libpq_cannot_read_loses_everything_after_its_password() -> None:
    masked = mask_dsn("host=h password='abc def")  # the quote never closes
    assert "abc" not in masked
    assert "def" not in masked


def test_a_registration_error_shows_no_tail(tmp_path: Path) -> None:
    settings = settings_for(tmp_path, run_scheduler=False, target_hosts=["127.0.0.1/32"])
    with TestClient(create_app(settings)) as api:
        dsn = f"host=127.0.0.1 port={free_port()} user=u password=Tail\\ Part-7z connect_timeout=2"
        r = api.post("/api/v1/targets", json={"name": "tail", "dsn": dsn})
    assert r.status_code == 422
    assert "cannot connect" in r.json()["detail"]
    assert "password=***" in r.text
    assert "Tail" not in r.text
    assert "Part-7z" not in r.text
