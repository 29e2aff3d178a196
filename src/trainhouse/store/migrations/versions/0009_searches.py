"""hyperparameter searches: searches, their trials, and a job's search and prune request

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01

Optuna's own tables are not here: its RDBStorage creates and migrates them itself, in a schema
of their own on PostgreSQL (``optuna``) and a file of their own beside SQLite's database
(trainhouse.tune.study), so neither side's migrations ever see the other's tables.
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

_Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    # plain ADD COLUMNs (see 0002: a batch rebuild of a parent table on SQLite cascades deletes)
    op.add_column("jobs", sa.Column("search_id", _Id))
    op.create_index("ix_jobs_search_id", "jobs", ["search_id"])
    op.add_column(
        "jobs",
        sa.Column("prune_requested", sa.Boolean(), nullable=False, server_default=sa.false()),
    )
    op.create_table(
        "searches",
        sa.Column("id", _Id, primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("owner", sa.String(128), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("archive_sha256", sa.String(64), nullable=False),
        sa.Column("study", sa.String(128), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.Column("ended_at", sa.Float()),
        sa.Column("reason", sa.Text()),
        sa.Column("warning", sa.Text()),
        sa.PrimaryKeyConstraint("id", name="pk_searches"),
        sa.UniqueConstraint("study", name="uq_searches_study"),
    )
    op.create_index("ix_searches_owner", "searches", ["owner"])
    op.create_index("ix_searches_state", "searches", ["state"])
    op.create_table(
        "search_trials",
        sa.Column("search_id", _Id, nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("trial_id", sa.BigInteger(), nullable=False),
        sa.Column("job_id", _Id, nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("value", sa.Float()),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("ended_at", sa.Float()),
        sa.ForeignKeyConstraint(
            ["search_id"],
            ["searches.id"],
            name="fk_search_trials_search_id_searches",
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name="fk_search_trials_job_id_jobs", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("search_id", "number", name="pk_search_trials"),
        sa.UniqueConstraint("job_id", name="uq_search_trials_job_id"),
    )


def downgrade() -> None:
    op.drop_table("search_trials")
    op.drop_table("searches")
    op.drop_index("ix_jobs_search_id", table_name="jobs")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("prune_requested")
        batch.drop_column("search_id")
