"""scheduler: preemption requests, per-user limits and fair-share usage

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # a plain ADD COLUMN: a batch (copy-and-move) rebuild of `jobs` on SQLite would drop the
    # old table, and with foreign keys on, cascade-delete every job's attempts and metrics
    op.add_column(
        "jobs",
        sa.Column("preempt_requested", sa.Boolean, nullable=False, server_default=sa.false()),
    )
    op.create_table(
        "user_limits",
        sa.Column("owner", sa.String(128), nullable=False),
        sa.Column("share", sa.Float, nullable=False),
        sa.Column("max_gpus", sa.Integer),
        sa.Column("max_cpus", sa.Integer),
        sa.PrimaryKeyConstraint("owner", name="pk_user_limits"),
    )
    op.create_table(
        "user_usage",
        sa.Column("owner", sa.String(128), nullable=False),
        sa.Column("usage", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
        sa.PrimaryKeyConstraint("owner", name="pk_user_usage"),
    )


def downgrade() -> None:
    op.drop_table("user_usage")
    op.drop_table("user_limits")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("preempt_requested")
