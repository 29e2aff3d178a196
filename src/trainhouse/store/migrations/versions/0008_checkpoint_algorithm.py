"""checkpoint digest algorithm: which hash a checkpoint's digest (column sha256) was made with

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01

Every checkpoint registered before this has a sha256 digest: the column's default.
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # a plain ADD COLUMN (see 0002: a batch rebuild of a parent table on SQLite cascades deletes)
    op.add_column(
        "checkpoints",
        sa.Column("algorithm", sa.String(16), nullable=False, server_default=sa.text("'sha256'")),
    )


def downgrade() -> None:
    with op.batch_alter_table("checkpoints") as batch:
        batch.drop_column("algorithm")
