"""model numbers: the highest version number a model ever had, so that none is reused

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-05
"""

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "models", sa.Column("last_version", sa.Integer(), nullable=False, server_default="0")
    )
    # what the versions there are say (a deleted newest version's number is lost before this)
    op.execute(
        "UPDATE models SET last_version = COALESCE("
        "(SELECT MAX(version) FROM model_versions WHERE model_versions.model_id = models.id), 0)"
    )


def downgrade() -> None:
    with op.batch_alter_table("models") as batch:
        batch.drop_column("last_version")
