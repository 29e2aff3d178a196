"""initial schema: jobs, attempts, events, metrics, report batches, checkpoints

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("owner", sa.String(128), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("priority", sa.String(16), nullable=False),
        sa.Column("spec", sa.JSON, nullable=False),
        sa.Column("archive_sha256", sa.String(64), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("started_at", sa.Float),
        sa.Column("ended_at", sa.Float),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("restarts", sa.Integer, nullable=False),
        sa.Column("exit_code", sa.Integer),
        sa.Column("reason", sa.Text),
        sa.Column("cancel_requested", sa.Boolean, nullable=False),
        sa.Column("token_hash", sa.String(64)),
        sa.Column("placement", sa.JSON),
        sa.Column("total_steps", sa.BigInteger),
        sa.Column("last_step", sa.BigInteger),
        sa.Column("latest_metrics", sa.JSON),
        sa.Column("updated_at", sa.Float, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_jobs"),
    )
    op.create_index("ix_jobs_state", "jobs", ["state"])
    op.create_table(
        "attempts",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("job_id", Id, nullable=False),
        sa.Column("number", sa.Integer, nullable=False),
        sa.Column("started_at", sa.Float, nullable=False),
        sa.Column("ended_at", sa.Float),
        sa.Column("result", sa.String(16)),
        sa.Column("exit_code", sa.Integer),
        sa.Column("rank_exit_codes", sa.JSON),
        sa.Column("placement", sa.JSON),
        sa.Column("pid", sa.Integer),
        sa.Column("pid_create_time", sa.Float),
        sa.Column("reason", sa.Text),
        sa.PrimaryKeyConstraint("id", name="pk_attempts"),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name="fk_attempts_job_id_jobs", ondelete="CASCADE"
        ),
        sa.UniqueConstraint("job_id", "number", name="uq_attempts_job_id_number"),
    )
    op.create_table(
        "events",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("job_id", Id, nullable=False),
        sa.Column("at", sa.Float, nullable=False),
        sa.Column("from_state", sa.String(16)),
        sa.Column("to_state", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text),
        sa.PrimaryKeyConstraint("id", name="pk_events"),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name="fk_events_job_id_jobs", ondelete="CASCADE"
        ),
    )
    op.create_index("ix_events_job_id", "events", ["job_id"])
    op.create_table(
        "metrics",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("job_id", Id, nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("rank", sa.Integer, nullable=False),
        sa.Column("step", sa.BigInteger, nullable=False),
        sa.Column("name", sa.String(256), nullable=False),
        sa.Column("value", sa.Float),
        sa.Column("wall_time", sa.Float, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_metrics"),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name="fk_metrics_job_id_jobs", ondelete="CASCADE"
        ),
        sa.UniqueConstraint(
            "job_id", "name", "rank", "step", name="uq_metrics_job_id_name_rank_step"
        ),
    )
    op.create_table(
        "report_batches",
        sa.Column("job_id", Id, nullable=False),
        sa.Column("batch_id", sa.String(64), nullable=False),
        sa.Column("at", sa.Float, nullable=False),
        sa.PrimaryKeyConstraint("job_id", "batch_id", name="pk_report_batches"),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name="fk_report_batches_job_id_jobs", ondelete="CASCADE"
        ),
    )
    op.create_table(
        "checkpoints",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("job_id", Id, nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("step", sa.BigInteger, nullable=False),
        sa.Column("path", sa.Text, nullable=False),
        sa.Column("size", sa.BigInteger, nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("metrics", sa.JSON),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("deleted", sa.Boolean, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_checkpoints"),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name="fk_checkpoints_job_id_jobs", ondelete="CASCADE"
        ),
    )
    op.create_index("ix_checkpoints_job_id_step", "checkpoints", ["job_id", "step"])


def downgrade() -> None:
    for table in ("checkpoints", "report_batches", "metrics", "events", "attempts", "jobs"):
        op.drop_table(table)
