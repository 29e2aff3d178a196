"""resume and clone: how often a job was resumed, the job (and checkpoint step) it was cloned
from, and the hold a clone waits in while its checkpoint is copied

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01

Every job before this was never resumed nor cloned, and is not held: 0, NULL, NULL, false.
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

_Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    # plain ADD COLUMNs (see 0002: a batch rebuild of a parent table on SQLite cascades deletes)
    op.add_column(
        "jobs", sa.Column("resumes", sa.Integer(), nullable=False, server_default=sa.text("0"))
    )
    op.add_column("jobs", sa.Column("cloned_from", _Id, nullable=True))
    op.add_column("jobs", sa.Column("cloned_step", sa.BigInteger(), nullable=True))
    op.create_index("ix_jobs_cloned_from", "jobs", ["cloned_from"])
    op.add_column(
        "jobs", sa.Column("held", sa.Boolean(), nullable=False, server_default=sa.false())
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_cloned_from", table_name="jobs")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("held")
        batch.drop_column("cloned_step")
        batch.drop_column("cloned_from")
        batch.drop_column("resumes")
