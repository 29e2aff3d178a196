"""runs table: projects, tags, notes, archived jobs, the hparams a run used, series summaries

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01

The upgrade fills ``job_hparams`` from each job's spec and ``metric_summaries`` from the
rollup's coarsest buckets and the points at each series' last step.
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
COARSEST = 65536  # trainhouse.store.rollup.COARSEST when this migration was written


def upgrade() -> None:
    # plain ADD COLUMNs (see 0002: a batch rebuild of a parent table on SQLite cascades deletes)
    op.add_column(
        "jobs",
        sa.Column("project", sa.String(128), nullable=False, server_default=sa.text("'default'")),
    )
    op.add_column("jobs", sa.Column("hparams", sa.JSON))
    op.add_column("jobs", sa.Column("note", sa.Text))
    op.add_column(
        "jobs", sa.Column("archived", sa.Boolean, nullable=False, server_default=sa.false())
    )
    op.create_index("ix_jobs_project", "jobs", ["project"])
    op.create_table(
        "job_tags",
        sa.Column("job_id", Id, nullable=False),
        sa.Column("tag", sa.String(64), nullable=False),
        sa.PrimaryKeyConstraint("job_id", "tag", name="pk_job_tags"),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name="fk_job_tags_job_id_jobs", ondelete="CASCADE"
        ),
    )
    op.create_index("ix_job_tags_tag_job_id", "job_tags", ["tag", "job_id"])
    op.create_table(
        "job_hparams",
        sa.Column("job_id", Id, nullable=False),
        sa.Column("key", sa.String(256), nullable=False),
        sa.Column("num", sa.Float),
        sa.Column("text", sa.String(256)),
        sa.PrimaryKeyConstraint("job_id", "key", name="pk_job_hparams"),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name="fk_job_hparams_job_id_jobs", ondelete="CASCADE"
        ),
    )
    op.create_index("ix_job_hparams_key_num", "job_hparams", ["key", "num"])
    op.create_index("ix_job_hparams_key_text", "job_hparams", ["key", "text"])
    op.create_table(
        "metric_summaries",
        sa.Column("job_id", Id, nullable=False),
        sa.Column("name", sa.String(256), nullable=False),
        sa.Column("last_step", sa.BigInteger, nullable=False),
        sa.Column("last_value", sa.Float),
        sa.Column("min_value", sa.Float),
        sa.Column("max_value", sa.Float),
        sa.PrimaryKeyConstraint("job_id", "name", name="pk_metric_summaries"),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name="fk_metric_summaries_job_id_jobs", ondelete="CASCADE"
        ),
    )
    for column in ("last_value", "min_value", "max_value"):
        op.create_index(f"ix_metric_summaries_name_{column}", "metric_summaries", ["name", column])
    bind = op.get_bind()
    # backfill: each job's spec hparams, flattened as the store does it
    from trainhouse.store.jobrows import hparam_rows

    jobs = sa.table("jobs", sa.column("id"), sa.column("spec", sa.JSON))
    rows = []
    for job_id, spec in bind.execute(sa.select(jobs.c.id, jobs.c.spec)):
        hparams = (spec or {}).get("hparams") or {}
        rows += hparam_rows(int(job_id), hparams)
    if rows:
        bind.execute(
            sa.text(
                "INSERT INTO job_hparams (job_id, key, num, text) "
                "VALUES (:job_id, :key, :num, :text)"
            ),
            rows,
        )
    bind.execute(
        sa.text(
            "INSERT INTO metric_summaries (job_id, name, last_step, min_value, max_value) "
            "SELECT job_id, name, max(last_step), min(min_value), max(max_value) "
            "FROM metric_buckets WHERE level = :level AND rank = -1 GROUP BY job_id, name"
        ).bindparams(level=COARSEST)
    )
    bind.execute(
        sa.text(
            "UPDATE metric_summaries SET last_value = (SELECT m.value FROM metrics m "
            "WHERE m.job_id = metric_summaries.job_id AND m.name = metric_summaries.name "
            "AND m.rank = -1 AND m.step = metric_summaries.last_step)"
        )
    )


def downgrade() -> None:
    op.drop_table("metric_summaries")
    op.drop_table("job_hparams")
    op.drop_table("job_tags")
    op.drop_index("ix_jobs_project", "jobs")
    with op.batch_alter_table("jobs") as batch:
        for column in ("archived", "note", "hparams", "project"):
            batch.drop_column(column)
