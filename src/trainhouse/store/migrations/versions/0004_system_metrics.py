"""system metrics: resource samples of nodes and of jobs' processes

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "system_metrics",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("node", sa.String(128), nullable=False),
        sa.Column("job_id", Id),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("gpu", sa.Integer),
        sa.Column("value", sa.Float, nullable=False),
        sa.Column("at", sa.Float, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_system_metrics"),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name="fk_system_metrics_job_id_jobs", ondelete="CASCADE"
        ),
    )
    op.create_index("ix_system_metrics_node_name_at", "system_metrics", ["node", "name", "at"])
    op.create_index("ix_system_metrics_job_id_name_at", "system_metrics", ["job_id", "name", "at"])
    op.create_index("ix_system_metrics_at", "system_metrics", ["at"])


def downgrade() -> None:
    op.drop_table("system_metrics")
