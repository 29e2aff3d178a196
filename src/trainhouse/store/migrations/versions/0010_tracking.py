"""tracking: external runs (jobs of kind "tracked"), MLflow experiments, runs' params and tags

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01

Every job before this was launched by the scheduler: the new column's default. An MLflow run
made outside a job (``POST /mlflow/api/2.0/mlflow/runs/create``) is a job of kind "tracked":
listed with the others, never scheduled. ``mlflow_runs`` holds the MLflow view of a job (its
experiment, run name, MLflow status), ``run_values`` its params and tags.
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

_Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    # a plain ADD COLUMN (see 0002: a batch rebuild of a parent table on SQLite cascades deletes)
    op.add_column(
        "jobs",
        sa.Column("kind", sa.String(16), nullable=False, server_default=sa.text("'launched'")),
    )
    op.create_table(
        "mlflow_experiments",
        sa.Column("id", _Id, primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(500), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_mlflow_experiments"),
        sa.UniqueConstraint("name", name="uq_mlflow_experiments_name"),
    )
    op.create_table(
        "mlflow_runs",
        sa.Column("job_id", _Id, nullable=False),
        sa.Column("experiment_id", _Id, nullable=False),
        sa.Column("run_name", sa.String(250), nullable=False),
        sa.Column("user_id", sa.String(256), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("start_time", sa.BigInteger(), nullable=False),
        sa.Column("end_time", sa.BigInteger(), nullable=True),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name="fk_mlflow_runs_job_id_jobs", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("job_id", name="pk_mlflow_runs"),
    )
    op.create_table(
        "run_values",
        sa.Column("job_id", _Id, nullable=False),
        sa.Column("kind", sa.String(8), nullable=False),
        sa.Column("key", sa.String(250), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name="fk_run_values_job_id_jobs", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("job_id", "kind", "key", name="pk_run_values"),
    )


def downgrade() -> None:
    op.drop_table("run_values")
    op.drop_table("mlflow_runs")
    op.drop_table("mlflow_experiments")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("kind")
