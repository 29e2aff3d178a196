"""elastic jobs: a job asked to stop for a resize (jobs.resize_requested)

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-07
"""

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # a plain ADD COLUMN (see 0002: a batch rebuild of a parent table on SQLite cascades deletes)
    op.add_column(
        "jobs",
        sa.Column("resize_requested", sa.Boolean(), nullable=False, server_default=sa.false()),
    )


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("resize_requested")
