"""Every connection to a client-supplied DSN goes through here (issue 40).

A DSN names a server the service connects to on a client's behalf. Three things make
that a way into the service's host, and each is closed here, in one place:

* **Where it goes.** The service's host can reach servers a client cannot: its own
  PostgreSQL (often trusting local connections), a cloud's metadata address, anything
  on loopback. So a DSN's destinations are checked against the operator's
  ``KNOBTUNE_TARGET_HOSTS`` (names, CIDRs, unix-socket directories; ``*``, the
  default, is any address that is not loopback, link-local or unspecified, and no unix
  socket). Every host of a multi-host DSN is checked; a name is resolved here, at
  registration and again before every connection, and the connection is pinned to the
  addresses that were checked (``hostaddr``), so DNS that changes between the check
  and libpq's own lookup changes nothing. The managed sandboxes, which the service
  makes itself, are always allowed (:func:`own_sandbox`), and so is everything when the
  operator acts in-process (the CLI without ``--server``: ``Policy.operator``).
* **What it may say.** Only the keywords of :data:`ALLOWED` are accepted: none of them
  names a file or a credential of the service's host (``passfile``, ``service``,
  ``sslcert``, ``sslkey``, ``sslkeylogfile`` -- which libpq 18 *creates* --, an
  ``sslrootcert`` file, Kerberos and OAuth settings). ``sslrootcert`` is accepted as
  ``system`` only (the TLS library's roots), so no path is ever opened for a client.
* **What it inherits.** libpq fills every keyword a DSN leaves out from the process's
  ``PG*`` variables and files under ``$HOME`` (``.pgpass``, ``.postgresql/``), and the
  Kerberos cache: the operator's identity, sent to a server of the client's choice.
  In-process connections get explicit neutral values for every file and credential
  keyword and for each ``PG*`` variable that is set; child processes (pgbench, the
  replay player) get an environment without any ``PG*`` or ``KRB5*`` variable of ours,
  the same neutral values, a Kerberos cache that does not exist and ``HOME`` set to an
  empty directory.

The operator may still give knobtune credentials: ``KNOBTUNE_TARGET_PASSFILE`` names a
pgpass file that is used for DSNs without a password and without ``hostaddr`` (libpq
matches the file on ``host`` and would send the password to any ``hostaddr``); every
API client that names a host listed in it logs in with its entry (docs/security.md).

A failed connection is described without what the far end sent (a banner, its first
byte): "could not connect to HOST:PORT (connection refused | timeout | not PostgreSQL,
or it closed the connection)", or PostgreSQL's own FATAL message, bounded.
"""

from __future__ import annotations

import atexit
import contextlib
import ipaddress
import os
import re
import shutil
import socket
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import pq
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import TupleRow

from app.postgres import live
from app.postgres.dsn import LIBPQ_ENV, mask_dsn, scrub
from app.postgres.errors import primary_message
from app.postgres.privilege import child_env

if TYPE_CHECKING:
    from app.settings import Settings

Conn = psycopg.Connection[TupleRow]

SETTING = "KNOBTUNE_TARGET_HOSTS"
# Where a file keyword points when nothing may be read: a path under /dev/null fails
# with ENOTDIR, which libpq treats as "no such file", and nobody can create it.
NOFILE = "/dev/null/knobtune-none"

# Keywords a client's DSN may hold. None names a file or credential of this host:
# channel_binding and the TLS versions only make a connection stricter; client_encoding,
# keepalives and tcp_user_timeout shape the session; options is sent to the server as
# its startup settings and evaluated there with the role's own privileges (a role may
# not give itself a superuser setting, and a ``-c role=`` only reaches roles it is a
# member of, which the workload check covers): nothing on this host reads it.
ALLOWED = frozenset(
    {
        "host",
        "hostaddr",
        "port",
        "dbname",
        "user",
        "password",
        "connect_timeout",
        "sslmode",
        "sslrootcert",  # "system" only
        "application_name",
        "fallback_application_name",
        "keepalives",
        "keepalives_idle",
        "keepalives_interval",
        "keepalives_count",
        "tcp_user_timeout",
        "target_session_attrs",
        "load_balance_hosts",
        "options",
        "channel_binding",
        "ssl_min_protocol_version",
        "ssl_max_protocol_version",
        "client_encoding",
    }
)

# The keywords psycopg's libpq knows (a newer one is never passed to an older libpq),
# with the environment variable each one falls back to and its compiled default.
_OPTIONS: tuple[tuple[str, str | None, str | None], ...] = tuple(
    (
        o.keyword.decode(),
        o.envvar.decode() if o.envvar else None,
        o.compiled.decode() if o.compiled is not None else None,
    )
    for o in pq.Conninfo.get_defaults()
)
_KNOWN = frozenset(k for k, _, _ in _OPTIONS)
LIBPQ_VERSION = pq.version()
# Neutral values: no password file, no client certificate or key, no CA or CRL file
# (``sslrootcert=system`` aside), no GSSAPI encryption nor Kerberos authentication.
_NEUTRAL = {
    "passfile": NOFILE,
    "sslcert": NOFILE,
    "sslkey": NOFILE,
    "sslcertmode": "disable",  # libpq 16+
    "sslcrl": NOFILE,
    "sslcrldir": NOFILE,
    "gssencmode": "disable",
    "require_auth": "!gss,!sspi",  # libpq 16+: the Kerberos cache is the service's
}
# An inherited PG* variable is overridden with the keyword's compiled default, or
# these where "" is not a valid value.
_UNSET = {"connect_timeout": "0", "min_protocol_version": "3.0", "max_protocol_version": "3.0"}


class DsnRefused(psycopg.ProgrammingError):
    """A DSN an API client may not give; the message says which keyword and why."""


class DestinationRefused(psycopg.OperationalError):
    """A host that is not among the destinations the operator allows."""


class ConnectFailed(psycopg.OperationalError):
    """A connection failed; the message never repeats what the far end sent."""


# -- keywords --------------------------------------------------------------------------
def parse(dsn: str) -> dict[str, str]:
    """The DSN's keywords (both forms), values as text; DsnRefused when unparsable."""
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.Error as exc:
        raise DsnRefused(
            f"invalid connection string {mask_dsn(dsn)}: {scrub(str(exc), dsn)}"
        ) from None
    return {k: str(v) for k, v in params.items() if v is not None}


def check_keywords(params: Mapping[str, str]) -> None:
    """Raise DsnRefused unless every keyword is in :data:`ALLOWED`."""
    refused = sorted(k for k in params if k not in ALLOWED)
    if params.get("sslrootcert", "system") != "system":
        refused.append("sslrootcert (other than 'system')")
    if refused:
        raise DsnRefused(
            f"the connection string may not hold {', '.join(refused)}: knobtune accepts "
            f"only {', '.join(sorted(ALLOWED))} (sslrootcert only as 'system', the TLS "
            "library's trusted roots), so that a DSN never makes the service read, write "
            "or send a file or credential of its own host (a password file, a client "
            "certificate or key, a key log, a Kerberos ticket)"
        )


# -- destinations ----------------------------------------------------------------------
@dataclass(frozen=True)
class Policy:
    """Where connections may go: the operator's list, or anywhere (``operator``)."""

    hosts: tuple[str, ...] = ("*",)
    operator: bool = False  # the CLI's in-process mode: the operator on their own machine
    passfile: str | None = None  # KNOBTUNE_TARGET_PASSFILE
    networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = field(
        default=(), init=False, compare=False
    )

    def __post_init__(self) -> None:
        nets: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
        for entry in self.hosts:
            with contextlib.suppress(ValueError):
                nets.append(ipaddress.ip_network(entry, strict=False))
        object.__setattr__(self, "networks", tuple(nets))


def policy_for(settings: Settings) -> Policy:
    passfile = settings.target_passfile
    return Policy(
        hosts=tuple(settings.target_hosts),
        operator=settings.local_operator,
        passfile=str(passfile) if passfile is not None else None,
    )


_policy = Policy()
_policy_lock = threading.Lock()


def configure(policy: Policy) -> Policy:
    """Make ``policy`` this process's (the service's settings); returns the one before."""
    global _policy
    with _policy_lock:
        previous, _policy = _policy, policy
    return previous


def current() -> Policy:
    return _policy


# Sandboxes the service manages (their DSNs come from the metadata DB): always allowed.
_own: set[tuple[str, str]] = set()
_own_lock = threading.Lock()


def _endpoints(dsn: str) -> set[tuple[str, str]]:
    try:
        params = parse(dsn)
    except DsnRefused:
        return set()
    port = params.get("port", "5432")
    host = params.get("host", "")
    out = {("127.0.0.1", port)}
    if host.startswith("/"):
        # any port: a sandbox moved to another one keeps its own socket directory
        out.add((os.path.normpath(host), "*"))
    return out


def own_sandbox(dsn: str) -> None:
    """Allow the endpoints of a managed sandbox's DSN (its socket, 127.0.0.1:port)."""
    with _own_lock:
        _own.update(_endpoints(dsn))


def forget_sandbox(dsn: str) -> None:
    with _own_lock:
        _own.difference_update(_endpoints(dsn))


def _is_own(host: str, port: str) -> bool:
    with _own_lock:
        if (host, port) in _own or (host, "*") in _own:
            return True
    # sandboxes this process made and still owns: made by the service for a target being
    # registered, by the CLI's demo, or by a test
    for sb in live.snapshot():
        if str(sb.port) == port and host in ("127.0.0.1", os.path.normpath(str(sb.socket_dir))):
            return True
    return False


def own_sandbox_of(dsn: str) -> Any | None:
    """The sandbox this process made (and still owns) that ``dsn`` names as its superuser:
    its benchmark role is the target's workload role. (Whether the DSN's password is
    right, the registration's own connection tells, before anything is stored.)"""
    try:
        params = parse(dsn)
    except DsnRefused:
        return None
    port, host = params.get("port", "5432"), params.get("host", "")
    for sb in live.snapshot():
        if str(sb.port) != port or not sb.bench_password:
            continue
        if host.startswith("/") and os.path.normpath(host) != os.path.normpath(str(sb.socket_dir)):
            continue
        if not host.startswith("/") and host not in ("127.0.0.1", "localhost"):
            continue
        if params.get("user") == "postgres":
            return sb
    return None


_REASONS = {
    "loopback": "a loopback address (the service's own host)",
    "link-local": "a link-local address (where a cloud's metadata service lives)",
    "unspecified": "an unspecified address (it reaches the service's own host)",
}


def _as_v4(
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address,
) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """An IPv6 address that carries an IPv4 one (::ffff:a.b.c.d, ::a.b.c.d) as that."""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return ip.ipv4_mapped
        if int(ip) >> 32 == 0 and int(ip) > 1:  # the old IPv4-compatible form
            return ipaddress.IPv4Address(int(ip))
    return ip


def _kind(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    """Why ``*`` does not cover ``ip`` (None: it does)."""
    if ip.is_loopback:
        return "loopback"
    if ip.is_link_local:
        return "link-local"
    if ip.is_unspecified or (isinstance(ip, ipaddress.IPv4Address) and int(ip) >> 24 == 0):
        return "unspecified"
    return None


def _fix(example: str) -> str:
    return (
        f"the operator may allow it with {SETTING} (e.g. {SETTING}='*,{example}'; '*' keeps "
        "every other host allowed); the CLI without --server may reach local servers, and "
        "a managed sandbox (sandbox: true) needs none of this"
    )


def _check_ip(text: str, port: str, policy: Policy, *, shown: str, resolved: bool) -> str:
    """The address ``text`` normalized, when the policy allows it; else DestinationRefused."""
    try:
        given = ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        raise DestinationRefused(f"cannot connect to {shown}: not an IP address") from None
    norm, ip = str(given), _as_v4(given)  # judged as the IPv4 address it carries
    if policy.operator or (ip.is_loopback and _is_own(str(ip), port)):
        return norm
    if any(ip in net for net in policy.networks if net.version == ip.version):
        return norm
    kind = _kind(ip)
    if "*" in policy.hosts and kind is None:
        return norm
    what = "it resolves to " if resolved else "it is "
    if kind is not None:
        example = shown if resolved else f"{ip}/{ip.max_prefixlen}"
        raise DestinationRefused(
            f"cannot connect to {shown}: {what}{_REASONS[kind]}, which API clients may not "
            f"reach; {_fix(example)}"
        )
    raise DestinationRefused(
        f"cannot connect to {shown}: not among the destinations the operator allows "
        f"({SETTING}); ask the operator to add it"
    )


def _check_socket(host: str, port: str, policy: Policy) -> None:
    if policy.operator:
        return
    if not host:
        if "/" in policy.hosts:
            return
        raise DestinationRefused(
            "cannot connect without a host: libpq's default is a unix socket on the "
            f"service's own host, which API clients may not reach; give host=; {_fix('/path')}"
        )
    if host.startswith("@"):
        if host in policy.hosts or "@" in policy.hosts:
            return
    else:
        path = os.path.normpath(host)
        if _is_own(path, port):
            return
        for entry in policy.hosts:
            if entry.startswith("/"):
                base = os.path.normpath(entry)
                if path == base or path.startswith(base.rstrip("/") + "/"):
                    return
    raise DestinationRefused(
        f"cannot connect to {host}: a unix-socket directory, on the service's own host, "
        f"which API clients may not reach; {_fix(host)}"
    )


def _name_listed(host: str, policy: Policy) -> bool:
    name = host.lower().rstrip(".")
    for entry in policy.hosts:
        e = entry.lower().rstrip(".")
        if e == name or (e.startswith("*.") and name.endswith(e[1:])):
            return True
    return False


def _resolve(host: str, port: str) -> list[str]:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        raise ConnectFailed(f"could not connect to {host}:{port} (host name not found)") from None
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def _split(value: str | None) -> list[str]:
    return [v.strip() for v in value.split(",")] if value else []


def pin(params: Mapping[str, str], policy: Policy) -> dict[str, str]:
    """``params`` with every destination checked and each host name pinned to the
    addresses checked (``hostaddr``); DestinationRefused / ConnectFailed otherwise."""
    hosts, addrs, ports = (_split(params.get(k)) for k in ("host", "hostaddr", "port"))
    n = max(len(hosts), len(addrs), 1)
    if (hosts and addrs and len(hosts) != len(addrs)) or (len(ports) > 1 and len(ports) != n):
        raise DestinationRefused(
            "the DSN's host, hostaddr and port lists differ in length: give one port, or one "
            "per host"
        )
    out_h: list[str] = []
    out_a: list[str] = []
    out_p: list[str] = []
    for i in range(n):
        host = hosts[i] if hosts else ""
        addr = addrs[i] if addrs else ""
        port = (ports[i] if len(ports) > 1 else (ports[0] if ports else "")) or "5432"
        if addr:
            try:  # as libpq reads it (numeric, inet_aton's forms too: 127.1, 0x7f000001)
                text = socket.getaddrinfo(addr, None, flags=socket.AI_NUMERICHOST)[0][4][0]
            except (OSError, UnicodeError):
                raise DestinationRefused(f"hostaddr {addr!r} is not an IP address") from None
            found = [_check_ip(str(text), port, policy, shown=addr, resolved=False)]
        elif not host or host.startswith(("/", "@")):
            _check_socket(host, port, policy)
            found = [""]
        else:
            listed = _name_listed(host, policy)
            found = [
                _check_ip(ip, port, policy, shown=host, resolved=not _literal(host))
                if not listed
                else str(ipaddress.ip_address(ip.split("%", 1)[0]))
                for ip in _resolve(host, port)
            ]
        for a in found:
            out_h.append(host)
            out_a.append(a)
            out_p.append(port)
    pinned = dict(params)
    if hosts:
        pinned["host"] = ",".join(out_h)
    if any(out_a):
        pinned["hostaddr"] = ",".join(out_a)
    else:
        pinned.pop("hostaddr", None)
    pinned["port"] = out_p[0] if len(set(out_p)) == 1 else ",".join(out_p)
    return pinned


def _literal(host: str) -> bool:
    with contextlib.suppress(ValueError):
        ipaddress.ip_address(host)
        return True
    return False


def check_destinations(dsn: str, policy: Policy | None = None) -> None:
    """Raise DsnRefused, DestinationRefused or ConnectFailed when ``dsn`` may not be used."""
    params = parse(dsn)
    check_keywords(params)
    pin(params, policy or current())


# -- connecting --------------------------------------------------------------------------
def prepare(
    dsn: str, overrides: Mapping[str, Any] | None = None, *, policy: Policy | None = None
) -> dict[str, str]:
    """The keywords a connection to ``dsn`` is made with: checked, pinned, neutral."""
    policy = policy or current()
    params = parse(dsn)
    params.update({k: str(v) for k, v in (overrides or {}).items() if v is not None})
    check_keywords(params)
    client_hostaddr = bool(params.get("hostaddr"))
    params = pin(params, policy)
    params.update(_NEUTRAL)
    if params.get("sslrootcert") != "system":
        params["sslrootcert"] = NOFILE
    if policy.passfile and not params.get("password") and not client_hostaddr:
        # libpq matches the file on host and connects to hostaddr: only where the name
        # itself (resolved and checked above) leads
        params["passfile"] = policy.passfile
    return params


def _in_process(params: dict[str, str]) -> dict[str, str]:
    """``params`` for psycopg's libpq: keywords it knows, every inherited PG* overridden."""
    if os.environ.get("PGSERVICE"):
        raise DsnRefused(
            "PGSERVICE is set in the service's environment: libpq would take a connection's "
            "settings from the service's files; unset it"
        )
    out = {k: v for k, v in params.items() if k in _KNOWN}
    for key, env, compiled in _OPTIONS:
        if env and key not in out and key != "service" and os.environ.get(env) is not None:
            out[key] = compiled if compiled is not None else _UNSET.get(key, "")
    return out


def connect_target(
    dsn: str,
    *,
    autocommit: bool = False,
    connect_timeout: int | None = None,
    policy: Policy | None = None,
    **overrides: Any,
) -> Conn:
    """psycopg.connect for a client-supplied DSN: checked, pinned, nothing inherited.

    ``overrides`` (e.g. dbname) and ``connect_timeout`` replace the DSN's own, as
    psycopg.connect's keyword arguments do. Raises psycopg.Error subclasses: DsnRefused,
    DestinationRefused, ConnectFailed (its message never quotes the far end's bytes).
    """
    if connect_timeout is not None:
        overrides["connect_timeout"] = connect_timeout
    params = _in_process(prepare(dsn, overrides, policy=policy))
    params.setdefault("connect_timeout", "30")  # a host that never answers: not forever
    try:
        return psycopg.connect(make_conninfo("", **params), autocommit=autocommit)
    except psycopg.OperationalError as exc:
        raise ConnectFailed(describe_failure(str(exc), params)) from None


_home: str | None = None
_home_lock = threading.Lock()
HOME_PREFIX = "knobtune-home-"  # then the pid: removed at exit, or by the next start


def empty_home() -> str:
    """An empty directory (0555) for children's HOME: no .pgpass, no .postgresql/."""
    global _home
    with _home_lock:
        if _home is None or not os.path.isdir(_home):
            _home = tempfile.mkdtemp(prefix=f"{HOME_PREFIX}{os.getpid()}-")
            os.chmod(_home, 0o555)  # noqa: S103 - nothing in it; nobody may add to it
            atexit.register(shutil.rmtree, _home, True)
        return _home


def remove_orphan_homes(where: Path | None = None) -> int:
    """Empty HOME directories of processes that are gone (a killed one leaves its own)."""
    from app.postgres.privilege import remove_orphans

    place = where if where is not None else Path(tempfile.gettempdir())
    return remove_orphans(HOME_PREFIX, place, {os.geteuid()})


def libpq_env(
    dsn: str, base: dict[str, str] | None = None, *, policy: Policy | None = None
) -> dict[str, str]:
    """Environment for a libpq child (pgbench, the replay player) connecting like ``dsn``.

    No PG* or KRB5* variable of ``base`` (by default a minimal environment, never the
    service's) survives; the DSN's keywords, pinned and neutral, travel as PG* variables
    (the password too: never on a command line, where ``ps`` shows it). HOME is an empty
    directory and the Kerberos cache one that does not exist.
    """
    params = prepare(dsn, policy=policy)
    env = {
        k: v
        for k, v in (child_env() if base is None else base).items()
        if not k.startswith(("PG", "KRB5"))
    }
    for key, value in params.items():
        var = LIBPQ_ENV.get(key)
        if var is not None:
            env[var] = value
    env["HOME"] = empty_home()
    env["KRB5CCNAME"] = f"FILE:{NOFILE}"
    return env


# -- what a failure says -----------------------------------------------------------------
_SAFE = (
    ("no password supplied", "the server asks for a password and the DSN gives none"),
    ("root certificate file", "sslmode verify-ca/verify-full needs sslrootcert=system"),
    ("does not support ssl", "the server does not support SSL, which sslmode requires"),
    ("certificate", "TLS failed: the server's certificate was not accepted"),
    ("channel binding", "the server did not do the channel binding the DSN requires"),
    ("authentication method requirement", "the server asks for Kerberos (GSSAPI), never used"),
    ("connection refused", "connection refused"),
    ("no such file or directory", "connection refused"),
    ("permission denied", "connection refused"),
    ("timeout expired", "timeout"),
    ("timed out", "timeout"),
    ("could not translate host name", "host name not found"),
    ("failed to resolve host", "host name not found"),
    ("network is unreachable", "unreachable"),
    ("no route to host", "unreachable"),
)
_FATAL = re.compile(r"FATAL:\s+(.*)")


def describe_failure(message: str, params: Mapping[str, str]) -> str:
    """A failed connection in words that never repeat what the far end sent: PostgreSQL's
    FATAL message (bounded), or the kind of failure."""
    hosts, ports = _split(params.get("host")), _split(params.get("port"))
    where = ",".join(dict.fromkeys(hosts)) or params.get("hostaddr", "") or "the default socket"
    port = ports[0] if ports else "5432"
    fatal = _FATAL.search(message)
    if fatal:
        said = primary_message(fatal.group(1), [params.get("password", "")])
        return f"could not connect to {where}:{port}: the server said: {said}"
    low = message.lower()
    reason = next((why for key, why in _SAFE if key in low), None)
    reason = reason or "not PostgreSQL, or it closed the connection"
    return f"could not connect to {where}:{port} ({reason})"


def describe_line(line: str, dsn: str) -> str:
    """A libpq client's (pgbench's) connection failure line, described the same way."""
    try:
        params = parse(dsn)
    except DsnRefused:
        params = {}
    return describe_failure(line, params)
