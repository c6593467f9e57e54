"""``knobtune serve`` (the REST service and dashboard) and ``knobtune db`` (the metadata
DB's migrations and key)."""

from __future__ import annotations

import argparse
import gc

from app.cli.shared import CliError, Subparsers, add_command


def register(sub: Subparsers) -> None:
    s = add_command(
        sub,
        "serve",
        "run the REST service and dashboard (upgrades the metadata DB first)",
        cmd_serve,
    )
    s.add_argument("--host", default="127.0.0.1", help="address to listen on")
    s.add_argument("--port", type=int, default=8000, help="TCP port")
    s.add_argument("--workers", type=int, default=1, help="uvicorn worker processes")
    s.add_argument(
        "--log-level",
        default="info",
        choices=["critical", "error", "warning", "info", "debug"],
        help="uvicorn's log level",
    )

    s = add_command(sub, "db", "migrate the metadata DB ($KNOBTUNE_DATABASE_URL)", cmd_db)
    s.add_argument(
        "action",
        choices=["upgrade", "downgrade", "adopt-key"],
        help="direction; adopt-key: this process's secret key becomes the DB's, giving up "
        "a lost one (the DSNs it encrypted must be registered again)",
    )
    s.add_argument(
        "revision", nargs="?", help="Alembic revision (default: head to upgrade, base to downgrade)"
    )


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    import app.main  # noqa: F401  (the service's modules, loaded before the freeze below)
    from app.db import Database, upgrade
    from app.main import check_key, secure_startup, uvicorn_options
    from app.settings import get_settings
    from app.vault import SecretKeyError

    settings = get_settings()
    try:
        secure_startup(settings)  # private files and the key, before the DB is created
        upgrade(settings.database_url)
        db = Database(settings.database_url)
        try:  # here too, so that a refusal is one line, not uvicorn's startup traceback
            check_key(settings, db)
        finally:
            db.dispose()
    except SecretKeyError as exc:
        raise CliError(str(exc)) from None
    # What is loaded now (modules, classes, mappers) lives as long as the process. Out of
    # the collector's sight, a full collection no longer stops every thread for ~125 ms
    # (most of the pollers' p99 in bench/api_load.py).
    gc.collect()
    gc.freeze()
    uvicorn.run(
        "app.main:create_app",
        factory=True,
        host=args.host,
        port=args.port,
        workers=args.workers,
        log_level=args.log_level,
        # proxy headers from KNOBTUNE_TRUSTED_PROXIES only; a deadline for request headers
        **uvicorn_options(settings),
    )
    return 0


def cmd_db(args: argparse.Namespace) -> int:
    from app.db import downgrade, upgrade
    from app.settings import get_settings

    url = get_settings().database_url
    if args.action == "adopt-key":
        return _adopt_key()
    if args.action == "upgrade":
        upgrade(url, args.revision or "head")
    else:
        downgrade(url, args.revision or "base")
    default = "head" if args.action == "upgrade" else "base"
    print(f"metadata DB {args.action}d to {args.revision or default}")
    return 0


def _adopt_key() -> int:
    """``knobtune db adopt-key``: this process's key becomes the metadata DB's; the keys
    it lacks are given up (lost for good: app/vault.py)."""
    from app import vault
    from app.db import Database, upgrade
    from app.main import service_key
    from app.settings import get_settings

    settings = get_settings()
    try:
        key, source = service_key(settings)
    except vault.SecretKeyError as exc:
        raise CliError(str(exc)) from None
    upgrade(settings.database_url)
    db = Database(settings.database_url)
    try:
        dropped = vault.adopt_key(db.engine, key, source=source, instance=settings.instance_id)
    finally:
        db.dispose()
    print(f"the metadata DB's secrets now need only this key ({source})")
    for fp in dropped:
        print(f"  gave up key {fp[:12]}: DSNs it encrypted must be registered again")
    return 0
