"""tensorboard_positions: how far the TensorBoard import has read each event file of a job

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-07
"""

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

_Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "tensorboard_positions",
        sa.Column("job_id", _Id, nullable=False),
        sa.Column("path_sha256", sa.String(64), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("position", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("job_id", "path_sha256", name="pk_tensorboard_positions"),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["jobs.id"],
            name="fk_tensorboard_positions_job_id_jobs",
            ondelete="CASCADE",
        ),
    )


def downgrade() -> None:
    op.drop_table("tensorboard_positions")
