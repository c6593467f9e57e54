"""Issue 25: restart methods instead of shell commands, sandbox benchmark role, one target
per server

- targets.restart_method: the name of an operator-configured restart method (or
  "sandbox"). A stored restart_command is never run again: a sandbox's (its own pg_ctl,
  made by knobtune) is converted to the "sandbox" method and cleared; any other is kept
  as text so the operator sees what to configure instead (the API says so).
- targets.bench_dsn: where a sandbox's workloads run (its non-superuser benchmark role);
  filled when the service hardens an old sandbox at its next start.
- targets.server_id: system identifier and port of the server; filled at registration
  (and for older rows when a session or sweep starts); at most one live target per server.

DSNs are encrypted by the service at its first start (app/vault.py), not here: the key
belongs to the running service, and a migration may run where it is not configured. A
downgrade decrypts them (with the service's key: KNOBTUNE_SECRET_KEY or the work
directory's secret.key), since older versions read them as plain text.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_LIVE = "retired_at IS NULL AND server_id IS NOT NULL"


def upgrade() -> None:
    with op.batch_alter_table("targets") as batch:
        batch.add_column(sa.Column("restart_method", sa.String(length=64), nullable=True))
        batch.add_column(sa.Column("bench_dsn", sa.Text(), nullable=True))
        batch.add_column(sa.Column("server_id", sa.String(length=100), nullable=True))
    op.execute(
        "UPDATE targets SET restart_method = 'sandbox', restart_command = NULL "
        "WHERE sandbox_dir IS NOT NULL"
    )
    op.create_index(
        "uq_targets_one_per_server",
        "targets",
        ["server_id"],
        unique=True,
        sqlite_where=sa.text(_LIVE),
        postgresql_where=sa.text(_LIVE),
    )


def downgrade() -> None:
    from app import vault

    conn = op.get_bind()
    rows = conn.execute(sa.text("SELECT id, dsn FROM targets WHERE dsn LIKE 'fernet:%'")).all()
    for target_id, dsn in rows:
        plain = vault.decrypt(dsn)
        if plain == vault.UNREADABLE:
            raise RuntimeError(
                f"target {target_id}'s DSN cannot be decrypted with the configured key; "
                "set KNOBTUNE_SECRET_KEY (or KNOBTUNE_WORK_DIR) as the service had it"
            )
        conn.execute(
            sa.text("UPDATE targets SET dsn = :dsn WHERE id = :id"), {"dsn": plain, "id": target_id}
        )
    op.drop_index("uq_targets_one_per_server", table_name="targets")
    with op.batch_alter_table("targets") as batch:
        batch.drop_column("server_id")
        batch.drop_column("bench_dsn")
        batch.drop_column("restart_method")
