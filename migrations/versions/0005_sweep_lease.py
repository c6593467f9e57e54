"""Sweeps are claimed under a lease like sessions (issue 26): lease expiry and attempts

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-26
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # batch: SQLite cannot ALTER a table's columns in place
    with op.batch_alter_table("sweeps") as batch:
        batch.add_column(sa.Column("lease_expires_at", sa.DateTime(), nullable=True))
        batch.add_column(
            sa.Column("attempts", sa.Integer(), nullable=False, server_default=sa.text("0"))
        )
    op.create_index("ix_sweeps_status", "sweeps", ["status"])
    # A sweep that was running under the old threads has no process any more: the claim
    # loop takes it (an expired lease) and resumes it.
    op.execute(
        "UPDATE sweeps SET lease_expires_at = heartbeat_at WHERE status IN ('queued', 'running')"
    )


def downgrade() -> None:
    op.drop_index("ix_sweeps_status", table_name="sweeps")
    with op.batch_alter_table("sweeps") as batch:
        batch.drop_column("attempts")
        batch.drop_column("lease_expires_at")
