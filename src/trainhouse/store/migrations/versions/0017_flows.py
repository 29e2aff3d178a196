"""flows: jobs that wait for jobs (job_after), the models a job read (job_inputs), promotions,
and flows of steps (flows, jobs.flow_id, jobs.flow_step)

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-06
"""

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

_Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("flow_id", _Id))
        batch.add_column(sa.Column("flow_step", sa.String(32)))
        batch.create_index("ix_jobs_flow_id", ["flow_id"])
    op.create_table(
        "flows",
        sa.Column("id", _Id, primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("owner", sa.String(128), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("steps", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_flows"),
    )
    op.create_index("ix_flows_owner", "flows", ["owner"])
    op.create_table(
        "job_after",
        sa.Column("job_id", _Id, nullable=False),
        sa.Column("upstream_id", _Id, nullable=False),
        sa.Column("until", sa.String(16), nullable=False),
        sa.PrimaryKeyConstraint("job_id", "upstream_id", name="pk_job_after"),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name="fk_job_after_job_id_jobs", ondelete="CASCADE"
        ),
    )
    op.create_index("ix_job_after_upstream_id", "job_after", ["upstream_id"])
    op.create_table(
        "job_inputs",
        sa.Column("job_id", _Id, nullable=False),
        sa.Column("key", sa.String(32), nullable=False),
        sa.Column("ref", sa.String(200), nullable=False),
        sa.Column("model", sa.String(64), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("resolved_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("job_id", "key", name="pk_job_inputs"),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name="fk_job_inputs_job_id_jobs", ondelete="CASCADE"
        ),
    )
    op.create_index("ix_job_inputs_model_version", "job_inputs", ["model", "version"])
    op.create_table(
        "promotions",
        sa.Column("job_id", _Id, nullable=False, autoincrement=False),
        sa.Column("alias", sa.String(64), nullable=False),
        sa.Column("metric", sa.String(256), nullable=False),
        sa.Column("mode", sa.String(8), nullable=False),
        sa.Column("model", sa.String(64)),
        sa.Column("version", sa.Integer()),
        sa.Column("value", sa.Float()),
        sa.Column("previous_version", sa.Integer()),
        sa.Column("previous_value", sa.Float()),
        sa.Column("promoted", sa.Boolean()),
        sa.Column("decision", sa.Text()),
        sa.Column("decided_at", sa.Float()),
        sa.PrimaryKeyConstraint("job_id", name="pk_promotions"),
    )
    op.create_index("ix_promotions_model", "promotions", ["model"])


def downgrade() -> None:
    op.drop_table("promotions")
    op.drop_table("job_inputs")
    op.drop_table("job_after")
    op.drop_table("flows")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index("ix_jobs_flow_id")
        batch.drop_column("flow_step")
        batch.drop_column("flow_id")
