"""trials.value as text: a joint candidate (PGTune-style hints) lists several knobs

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("trials") as batch:
        batch.alter_column("value", type_=sa.Text(), existing_type=sa.String(200))


def downgrade() -> None:
    # Values longer than 200 characters are cut, not lost silently elsewhere.
    op.execute("UPDATE trials SET value = substr(value, 1, 200) WHERE length(value) > 200")
    with op.batch_alter_table("trials") as batch:
        batch.alter_column("value", type_=sa.String(200), existing_type=sa.Text())
