"""The log scrub masks known passwords without breaking formatters that unpack a record's
arguments (found by hand: with a sandbox registered, every line of uvicorn's access log
under `knobtune serve` became a "Logging error" traceback)."""

from __future__ import annotations

import io
import logging

from uvicorn.logging import AccessFormatter

from app.postgres.dsn import install_log_scrub, remember


def _line(logger: logging.Logger, msg: str, *args: object) -> str:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(AccessFormatter('%(client_addr)s - "%(request_line)s" %(status_code)s'))
    logger.addHandler(handler)
    try:
        logger.info(msg, *args)
    finally:
        logger.removeHandler(handler)
    return out.getvalue()


def test_access_lines_format_and_passwords_in_them_are_masked() -> None:
    install_log_scrub()
    remember("host=db user=app password=s3cret-pw-4711 dbname=shop")
    log = logging.getLogger("knobtune.test.access")
    log.setLevel(logging.INFO)
    log.propagate = False
    fmt = '%s - "%s %s HTTP/%s" %d'
    plain = _line(log, fmt, "127.0.0.1:5000", "GET", "/api/v1/targets", "1.1", 200)
    assert plain == '127.0.0.1:5000 - "GET /api/v1/targets HTTP/1.1" 200 OK\n'
    leaked = _line(log, fmt, "127.0.0.1:5000", "GET", "/x?pw=s3cret-pw-4711", "1.1", 404)
    assert "s3cret-pw-4711" not in leaked
    assert leaked.startswith('127.0.0.1:5000 - "GET /x?pw=')
    assert leaked.endswith(" 404 Not Found\n")
