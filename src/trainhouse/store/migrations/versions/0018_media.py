"""media: the images, histograms and tables a job logs (job_media)

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-06
"""

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

_Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "job_media",
        sa.Column("id", _Id, primary_key=True, autoincrement=True),
        sa.Column("job_id", _Id, nullable=False),
        sa.Column("key", sa.String(256), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("width", sa.Integer()),
        sa.Column("height", sa.Integer()),
        sa.Column("caption", sa.Text()),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_job_media"),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name="fk_job_media_job_id_jobs", ondelete="CASCADE"
        ),
        sa.UniqueConstraint("job_id", "key", "step", name="uq_job_media_job_id_key_step"),
    )


def downgrade() -> None:
    op.drop_table("job_media")
