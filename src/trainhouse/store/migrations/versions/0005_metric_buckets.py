"""metric buckets: the rollup of every metric series, for fast downsampling and counts

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02

The upgrade backfills the rollup of the metrics already stored (every series, read once).
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "metric_buckets",
        sa.Column("job_id", Id, nullable=False),
        sa.Column("name", sa.String(256), nullable=False),
        sa.Column("rank", sa.Integer, nullable=False),
        sa.Column("level", sa.Integer, nullable=False),
        sa.Column("bucket", sa.BigInteger, nullable=False),
        sa.Column("count", sa.BigInteger, nullable=False),
        sa.Column("first_step", sa.BigInteger, nullable=False),
        sa.Column("last_step", sa.BigInteger, nullable=False),
        sa.Column("min_value", sa.Float),
        sa.Column("min_step", sa.BigInteger),
        sa.Column("max_value", sa.Float),
        sa.Column("max_step", sa.BigInteger),
        sa.PrimaryKeyConstraint(
            "job_id", "name", "rank", "level", "bucket", name="pk_metric_buckets"
        ),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name="fk_metric_buckets_job_id_jobs", ondelete="CASCADE"
        ),
    )
    # backfill: the same code as ingest, over each series' whole step range
    from trainhouse.store import rollup

    bind = op.get_bind()
    keys = bind.execute(sa.text("SELECT DISTINCT job_id, name, rank FROM metrics")).all()
    cursor = bind.connection.cursor()
    try:
        for job_id, name, rank in keys:
            rollup.refresh(
                cursor, bind.dialect.name, int(job_id), str(name), int(rank), 0, rollup.INT64
            )
    finally:
        cursor.close()


def downgrade() -> None:
    op.drop_table("metric_buckets")
