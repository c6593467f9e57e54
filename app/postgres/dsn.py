"""Connection strings: masking passwords, libpq environment for child processes, locality."""

from __future__ import annotations

import os
import re

from psycopg.conninfo import conninfo_to_dict

MASK = "***"

# key=value form: password='it''s' or password=plain (libpq allows spaces around '=').
_KV_PASSWORD = re.compile(r"(\bpassword\s*=\s*)((?:'(?:[^'\\]|\\.)*')+|[^\s']+)", re.IGNORECASE)
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


def mask_dsn(dsn: str) -> str:
    """The DSN with its password replaced by '***' (key=value and URI forms)."""
    if not _URI.match(dsn):
        return _KV_PASSWORD.sub(lambda m: m.group(1) + MASK, dsn)
    out = _URI_USERINFO.sub(lambda m: f"{m.group(1)}:{MASK}@", dsn.strip())
    return _URI_PARAM.sub(lambda m: m.group(1) + MASK, out)


def password_of(dsn: str) -> str | None:
    try:
        pw = conninfo_to_dict(dsn).get("password")
    except Exception:  # an unparsable DSN: nothing to look for beyond the regexes
        return None
    return str(pw) if pw else None


def scrub(text: str, dsn: str) -> str:
    """``text`` with the DSN and its password masked wherever they appear."""
    masked = mask_dsn(dsn)
    if dsn and masked != dsn:
        text = text.replace(dsn, masked)
    pw = password_of(dsn)
    if pw:
        text = text.replace(pw, MASK)
    return text


def libpq_env(dsn: str, base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for a libpq client (pgbench) that connects like ``dsn`` does.

    Inherited PG* variables that a DSN could set are dropped first, so the
    child connects exactly where the DSN says, and the password travels in
    PGPASSWORD instead of the command line.
    """
    env = dict(os.environ if base is None else base)
    for name in LIBPQ_ENV.values():
        env.pop(name, None)
    for key, value in conninfo_to_dict(dsn).items():
        var = LIBPQ_ENV.get(key)
        if var is not None and value is not None:
            env[var] = str(value)
    return env


def is_local(dsn: str) -> bool:
    """Whether ``dsn`` reaches a server on this host (unix socket or loopback address)."""
    params = conninfo_to_dict(dsn)
    host = str(params.get("host") or os.environ.get("PGHOST") or "")
    hostaddr = str(params.get("hostaddr") or os.environ.get("PGHOSTADDR") or "")
    if hostaddr:
        return all(_loopback(h) for h in hostaddr.split(","))
    if not host:
        return True  # libpq's default: the local unix socket
    return all(h.startswith(("/", "@")) or _loopback(h) for h in host.split(","))


def _loopback(host: str) -> bool:
    host = host.strip()
    return host in _LOOPBACK or host.startswith("127.")
