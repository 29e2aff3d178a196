"""metric series: every (name, rank) a job has reported, for the cap on a job's series

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01

The upgrade records the series already stored, read from the rollup's coarsest level (every
series has a bucket there).
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
COARSEST = 65536  # trainhouse.store.rollup.COARSEST when this migration was written


def upgrade() -> None:
    op.create_table(
        "metric_series",
        sa.Column("job_id", Id, nullable=False),
        sa.Column("name", sa.String(256), nullable=False),
        sa.Column("rank", sa.Integer, nullable=False),
        sa.PrimaryKeyConstraint("job_id", "name", "rank", name="pk_metric_series"),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name="fk_metric_series_job_id_jobs", ondelete="CASCADE"
        ),
    )
    op.execute(
        sa.text(
            "INSERT INTO metric_series (job_id, name, rank) SELECT DISTINCT job_id, name, rank "
            "FROM metric_buckets WHERE level = :level"
        ).bindparams(level=COARSEST)
    )


def downgrade() -> None:
    op.drop_table("metric_series")
