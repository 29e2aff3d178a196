"""fault tolerance: failure kinds per attempt, infrastructure restarts, checkpoint kinds

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # plain ADD COLUMNs (see 0002: a batch rebuild of a parent table on SQLite cascades deletes)
    op.add_column("attempts", sa.Column("failure", sa.String(16)))
    op.add_column("attempts", sa.Column("failed_rank", sa.Integer))
    op.add_column("attempts", sa.Column("log_tail", sa.Text))
    op.add_column(
        "jobs",
        sa.Column("infra_restarts", sa.Integer, nullable=False, server_default=sa.text("0")),
    )
    op.add_column(
        "checkpoints",
        sa.Column("kind", sa.String(16), nullable=False, server_default=sa.text("'file'")),
    )
    op.add_column("checkpoints", sa.Column("corrupt", sa.Text))


def downgrade() -> None:
    for table, column in (
        ("checkpoints", "corrupt"),
        ("checkpoints", "kind"),
        ("jobs", "infra_restarts"),
        ("attempts", "log_tail"),
        ("attempts", "failed_rank"),
        ("attempts", "failure"),
    ):
        with op.batch_alter_table(table) as batch:
            batch.drop_column(column)
