"""services: a model version served by a long-running job of replicas

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-03
"""

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

_Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "services",
        sa.Column("id", _Id, primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("owner", sa.String(128), nullable=False),
        sa.Column("model", sa.String(64), nullable=False),
        sa.Column("ref", sa.String(64), nullable=False),
        sa.Column("replicas", sa.Integer(), nullable=False),
        sa.Column("gpus_per_replica", sa.Integer(), nullable=False),
        sa.Column("max_batch", sa.Integer(), nullable=False),
        sa.Column("max_wait_ms", sa.Float(), nullable=False),
        sa.Column("priority", sa.String(16), nullable=False),
        sa.Column("stopped", sa.Boolean(), nullable=False),
        sa.Column("job_id", _Id),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_services"),
        sa.UniqueConstraint("name", name="uq_services_name"),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name="fk_services_job_id_jobs", ondelete="SET NULL"
        ),
    )


def downgrade() -> None:
    op.drop_table("services")
