"""Connection strings: masking passwords, libpq's environment variables, locality.

What a client's DSN may say and where it may go, and a libpq child's environment
(libpq_env): app/postgres/connect.py, which builds on this module (never the reverse)."""

from __future__ import annotations

import logging
import re
import threading
from typing import Any

from psycopg.conninfo import conninfo_to_dict, make_conninfo

MASK = "***"

# key=value form: password='it''s' or password=plain (libpq allows spaces around '=').
# (a value runs to the next unescaped blank: libpq reads "abc\\ def" as "abc def")
_KV_PASSWORD = re.compile(
    r"(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|(?:[^\s'\\]|\\.)+)", re.IGNORECASE
)
# what is left of a DSN libpq cannot parse: everything after a password keyword
_KV_REST = re.compile(r"(\bpassword\s*=\s*).*", re.IGNORECASE | re.DOTALL)
_URI_REST = re.compile(r"^(\s*postgres(?:ql)?://[^:/@?#]*):[^@]*@", re.IGNORECASE)
_URI = re.compile(r"^\s*postgres(?:ql)?://", re.IGNORECASE)
# URI form: scheme://user:secret@host and ?password=secret / &password=secret.
_URI_USERINFO = re.compile(r"^(postgres(?:ql)?://[^:/@?#]*):([^@/?#]*)@", re.IGNORECASE)
_URI_PARAM = re.compile(r"([?&]password=)([^&#]*)", re.IGNORECASE)

# libpq connection parameters that have an environment variable. Parameters
# missing here (keepalives, sslpassword, ...) cannot reach pgbench without its
# command line, which would expose them in `ps`; they are left out.
LIBPQ_ENV = {
    "host": "PGHOST",
    "hostaddr": "PGHOSTADDR",
    "port": "PGPORT",
    "dbname": "PGDATABASE",
    "user": "PGUSER",
    "password": "PGPASSWORD",
    "passfile": "PGPASSFILE",
    "service": "PGSERVICE",
    "channel_binding": "PGCHANNELBINDING",
    "options": "PGOPTIONS",
    "application_name": "PGAPPNAME",
    "sslmode": "PGSSLMODE",
    "requiressl": "PGREQUIRESSL",
    "sslnegotiation": "PGSSLNEGOTIATION",
    "sslcompression": "PGSSLCOMPRESSION",
    "sslcert": "PGSSLCERT",
    "sslkey": "PGSSLKEY",
    "sslcertmode": "PGSSLCERTMODE",
    "sslrootcert": "PGSSLROOTCERT",
    "sslcrl": "PGSSLCRL",
    "sslcrldir": "PGSSLCRLDIR",
    "sslsni": "PGSSLSNI",
    "requirepeer": "PGREQUIREPEER",
    "require_auth": "PGREQUIREAUTH",
    "ssl_min_protocol_version": "PGSSLMINPROTOCOLVERSION",
    "ssl_max_protocol_version": "PGSSLMAXPROTOCOLVERSION",
    "gssencmode": "PGGSSENCMODE",
    "krbsrvname": "PGKRBSRVNAME",
    "gsslib": "PGGSSLIB",
    "gssdelegation": "PGGSSDELEGATION",
    "connect_timeout": "PGCONNECT_TIMEOUT",
    "client_encoding": "PGCLIENTENCODING",
    "target_session_attrs": "PGTARGETSESSIONATTRS",
    "load_balance_hosts": "PGLOADBALANCEHOSTS",
}

_LOOPBACK = {"localhost", "::1", "127.0.0.1"}


def _mask_text(dsn: str) -> str:
    if not _URI.match(dsn):
        return _KV_PASSWORD.sub(lambda m: m.group(1) + MASK, dsn)
    out = _URI_USERINFO.sub(lambda m: f"{m.group(1)}:{MASK}@", dsn.strip())
    return _URI_PARAM.sub(lambda m: m.group(1) + MASK, out)


def mask_dsn(dsn: str) -> str:
    """The DSN with its password replaced by '***' (key=value and URI forms).

    The masked text is kept as written only when libpq reads it as the DSN itself with
    the password '***'; otherwise (an escaped or quoted password the text pattern cut
    short: ``password=abc\\ def`` showed `` def``) the DSN is written again from what
    libpq parsed. An unparsable DSN loses everything after its password keyword.
    """
    masked = _mask_text(dsn)
    try:
        params = conninfo_to_dict(dsn)
    except Exception:  # psycopg.ProgrammingError: libpq cannot read it
        if _URI.match(dsn):  # its parts end where a URI's do: "@", "&"
            out = _URI_REST.sub(lambda m: f"{m.group(1)}:{MASK}@", dsn)
            return _URI_PARAM.sub(lambda m: m.group(1) + MASK, out)
        return _KV_REST.sub(r"\1" + MASK, dsn)
    rest = {k: v for k, v in params.items() if k != "password"}
    try:
        again = conninfo_to_dict(masked)
    except Exception:
        again = None
    if (
        again is not None
        and {k: v for k, v in again.items() if k != "password"} == rest
        and again.get("password") == (MASK if params.get("password") is not None else None)
    ):
        return masked
    if params.get("password") is not None:
        rest["password"] = MASK
    return make_conninfo("", **rest)


def password_of(dsn: str) -> str | None:
    try:
        pw = conninfo_to_dict(dsn).get("password")
    except Exception:  # an unparsable DSN: nothing to look for beyond the regexes
        return None
    return str(pw) if pw else None


# Every password this process has seen in a stored DSN (app.models decrypts them through
# remember()): scrub() masks all of them, not only the one of the DSN at hand, so one
# target's error can never carry another's password.
_known: set[str] = set()
_known_lock = threading.Lock()
_known_sorted: tuple[str, ...] = ()
# Shorter passwords would garble ordinary words in every message; they are masked only
# where their own DSN is known (scrub's ``dsn``).
_MIN_KNOWN = 4


def remember(dsn: str) -> None:
    """Note ``dsn``'s password so that every later scrub() masks it."""
    pw = password_of(dsn)
    if not pw or len(pw) < _MIN_KNOWN or pw in _known:
        return
    global _known_sorted
    with _known_lock:
        _known.add(pw)
        _known_sorted = tuple(sorted(_known, key=len, reverse=True))


def scrub_known(text: str) -> str:
    """``text`` with every known password masked (longest first)."""
    for pw in _known_sorted:
        if pw in text:
            text = text.replace(pw, MASK)
    return text


def scrub(text: str, dsn: str) -> str:
    """``text`` with the DSN, its password and every other known password masked."""
    masked = mask_dsn(dsn)
    if dsn and masked != dsn:
        text = text.replace(dsn, masked)
    pw = password_of(dsn)
    if pw:
        text = text.replace(pw, MASK)
    return scrub_known(text)


def is_local(dsn: str) -> bool:
    """Whether ``dsn`` reaches a server on this host (unix socket or loopback address)."""
    # never the service's PGHOST: connections do not inherit it (app/postgres/connect.py)
    params = conninfo_to_dict(dsn)
    host = str(params.get("host") or "")
    hostaddr = str(params.get("hostaddr") or "")
    if hostaddr:
        return all(_loopback(h) for h in hostaddr.split(","))
    if not host:
        return True  # libpq's default: the local unix socket
    return all(h.startswith(("/", "@")) or _loopback(h) for h in host.split(","))


def _loopback(host: str) -> bool:
    host = host.strip()
    return host in _LOOPBACK or host.startswith("127.")


_log_scrub_installed = False


def _mask_args(record: logging.LogRecord, scrubbed: str) -> bool:
    """Mask each of a record's arguments in place, keeping their shape (formatters such
    as uvicorn's access log unpack them); False when that does not give ``scrubbed``."""
    if not isinstance(record.args, tuple):
        return False
    args = tuple(a if isinstance(a, int | float) else scrub_known(str(a)) for a in record.args)
    msg = scrub_known(str(record.msg))
    try:
        same = (msg % args if args else msg) == scrubbed
    except (TypeError, ValueError):
        return False
    if same:
        record.msg, record.args = msg, args
    return same


def install_log_scrub() -> None:
    """Mask every known password in every log record of this process (idempotent).

    The record factory formats the message at once, scrubbed, and does the same for an
    exception's text, so no handler or formatter can print a password that a message,
    its arguments or a traceback carried.
    """
    global _log_scrub_installed
    if _log_scrub_installed:
        return
    previous = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        if not _known_sorted:
            return record
        try:
            message = record.getMessage()
        except Exception:  # a broken format string: leave it to the handler to report
            return record
        scrubbed = scrub_known(message)
        if scrubbed != message and not _mask_args(record, scrubbed):
            record.msg, record.args = scrubbed, None
        if record.exc_info and not record.exc_text:
            record.exc_text = scrub_known(logging.Formatter().formatException(record.exc_info))
        return record

    logging.setLogRecordFactory(factory)
    _log_scrub_installed = True
