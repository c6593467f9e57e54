"""Per-transaction evidence, drift flags and host load per trial; the claimed gain's
confidence per session; retired targets (history kept)

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("trials") as batch:
        batch.add_column(sa.Column("evidence", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("host", sa.JSON(), nullable=True))
        batch.add_column(
            sa.Column("drift", sa.Boolean(), nullable=False, server_default=sa.false())
        )
        batch.add_column(sa.Column("ci_low", sa.Float(), nullable=True))
        batch.add_column(sa.Column("ci_high", sa.Float(), nullable=True))
    with op.batch_alter_table("sessions") as batch:
        batch.add_column(sa.Column("gain_status", sa.String(length=16), nullable=True))
        batch.add_column(sa.Column("gain_p_value", sa.Float(), nullable=True))
        batch.add_column(sa.Column("gain_ci_low", sa.Float(), nullable=True))
        batch.add_column(sa.Column("gain_ci_high", sa.Float(), nullable=True))
        batch.add_column(sa.Column("summary", sa.JSON(), nullable=True))
    with op.batch_alter_table("targets") as batch:
        batch.add_column(sa.Column("retired_at", sa.DateTime(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("targets") as batch:
        batch.drop_column("retired_at")
    with op.batch_alter_table("sessions") as batch:
        for name in ("summary", "gain_ci_high", "gain_ci_low", "gain_p_value", "gain_status"):
            batch.drop_column(name)
    with op.batch_alter_table("trials") as batch:
        for name in ("ci_high", "ci_low", "drift", "host", "evidence"):
            batch.drop_column(name)
