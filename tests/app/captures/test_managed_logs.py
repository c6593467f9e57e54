# ruff: noqa: E501  (log lines as the services write them)
"""Logs downloaded from managed services, with their default log_line_prefix: RDS's
'%t:%r:%u@%d:[%p]:' and Cloud SQL's '%m [%p]: [%l-1] db=%d,user=%u '. No session id
there: a session is a pid, and a pid seen again after its disconnection is a new one."""

from __future__ import annotations

import time

import pytest

from app.captures.logparse import PREFIX_SCAN, LogFormatError, parse_log

RDS = """\
2026-11-26 11:49:50 UTC::@:[100]:LOG:  checkpoint starting: time
2026-11-26 11:49:53 UTC:10.0.1.5(53422):[unknown]@[unknown]:[4242]:LOG:  connection received: host=10.0.1.5 port=53422
2026-11-26 11:49:53 UTC:10.0.1.5(53422):app@shop:[4242]:LOG:  connection authorized: user=app database=shop
2026-11-26 11:49:53 UTC:10.0.1.5(53422):app@shop:[4242]:LOG:  statement: SELECT 1
2026-11-26 11:49:54 UTC:10.0.1.5(53422):app@shop:[4242]:LOG:  statement: SELECT n
\tFROM t WHERE id = 7
2026-11-26 11:49:54 UTC:10.0.1.5(53422):app@shop:[4242]:LOG:  execute <unnamed>: SELECT * FROM t WHERE id = $1
2026-11-26 11:49:54 UTC:10.0.1.5(53422):app@shop:[4242]:DETAIL:  parameters: $1 = '5'
2026-11-26 11:49:55 UTC:10.0.1.5(53422):app@shop:[4242]:LOG:  disconnection: session time: 0:00:02.000 user=app
2026-11-26 11:49:56 UTC:2001:db8::1(5000):app@shop:[4242]:LOG:  connection authorized: user=app database=shop
2026-11-26 11:49:56 UTC:2001:db8::1(5000):app@shop:[4242]:LOG:  statement: SELECT 2
2026-11-26 11:49:56 UTC:2001:db8::1(5000):app@shop:[4242]:ERROR:  relation "x" does not exist
2026-11-26 11:49:56 UTC:2001:db8::1(5000):app@shop:[4242]:STATEMENT:  SELECT 2
"""

CLOUDSQL = """\
2026-11-26 11:49:53.100 UTC [4242]: [1-1] db=shop,user=app LOG:  connection authorized: user=app database=shop
2026-11-26 11:49:53.200 UTC [4242]: [2-1] db=shop,user=app LOG:  statement: SELECT 1
2026-11-26 11:49:53.300 UTC [77]: [1-1] db=,user= LOG:  checkpoint starting: time
2026-11-26 11:49:53.450 UTC [4243]: [1-1] db=other,user=app LOG:  statement: SELECT 3
2026-11-26 11:49:53.500 UTC [4242]: [3-1] db=shop,user=app LOG:  statement: SELECT 2
2026-11-26 11:49:53.600 UTC [4242]: [4-1] db=shop,user=app LOG:  disconnection: session time: 0:00:00.500
"""


def test_rds_log() -> None:
    p = parse_log(RDS)
    assert p.format == "rds"
    assert [(s.key, s.database, s.start_s, s.end_s) for s in p.sessions] == [
        ("4242.0", "shop", 0.0, 2.0),
        ("4242.1", "shop", 3.0, None),  # the pid again after its disconnection
    ]
    got = [(s.at_s, s.session, s.sql, s.params, s.failed_in_capture) for s in p.statements]
    assert got == [
        (0.0, 0, "SELECT 1", (), False),
        (1.0, 0, "SELECT n\nFROM t WHERE id = 7", (), False),
        (1.0, 0, "SELECT * FROM t WHERE id = $1", ("5",), False),
        (3.0, 1, "SELECT 2", (), True),  # IPv6 %r, and its ERROR/STATEMENT pair
    ]


def test_cloudsql_log() -> None:
    p = parse_log(CLOUDSQL, database="shop")
    assert p.format == "cloudsql"  # not taken for a csvlog row ("db=shop,user=app")
    assert [s.key for s in p.sessions] == ["4242.0"]
    assert [(s.at_s, s.sql) for s in p.statements] == [(0.1, "SELECT 1"), (0.4, "SELECT 2")]
    assert p.sessions[0].end_s == pytest.approx(0.5)


@pytest.mark.parametrize(
    "text",
    [
        "\ufffd\x00\x01 binary junk\n",
        "x" * 5_000_000 + "\n",
        "2026-11-26 11:49:53 UTC:" + ":" * 3_000_000 + "\n",  # a prefix that never closes
    ],
)
def test_hostile_first_lines_name_the_formats(text: str) -> None:
    t = time.monotonic()
    with pytest.raises(LogFormatError, match=r"line 1: .*RDS's '%t:%r:%u@%d:\[%p\]:'"):
        parse_log(text)
    assert time.monotonic() - t < 5  # the prefix is looked for in the first PREFIX_SCAN chars
    assert PREFIX_SCAN <= 4096


def test_a_huge_line_inside_a_log_is_ignored_or_unparsed_not_fatal() -> None:
    head = RDS.splitlines()[2] + "\n"
    junk = "2026-11-26 11:49:53 UTC:" + ":" * 3_000_000 + "\n"
    big = "2026-11-26 11:49:54 UTC:h:app@shop:[4242]:LOG:  statement: SELECT '" + "a" * 2_000_000
    p = parse_log(head + junk + big + "'\n")
    assert p.ignored_lines == 1
    assert len(p.statements) == 1
    assert p.unparsed_statements == 1  # too long to parse: labelled, not parsed
