"""The keys that have encrypted the metadata DB's secrets, by fingerprint (issue 43)

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "secret_keys",
        sa.Column("fingerprint", sa.String(length=64), primary_key=True),
        sa.Column("first_used_by", sa.String(length=200), nullable=False),
        sa.Column("first_used_at", sa.DateTime(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("secret_keys")
