"""model registry: models, their versions (the files a job saved with run.save_model) and aliases

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

_Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "models",
        sa.Column("id", _Id, primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("owner", sa.String(128), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_models"),
        sa.UniqueConstraint("name", name="uq_models_name"),
    )
    op.create_table(
        "model_versions",
        sa.Column("id", _Id, primary_key=True, autoincrement=True),
        sa.Column("model_id", _Id, nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("job_id", _Id),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("files", sa.JSON(), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("metrics", sa.JSON()),
        sa.Column("signature", sa.JSON()),
        sa.Column("record", sa.JSON()),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_model_versions"),
        sa.ForeignKeyConstraint(
            ["model_id"],
            ["models.id"],
            name="fk_model_versions_model_id_models",
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name="fk_model_versions_job_id_jobs", ondelete="SET NULL"
        ),
        sa.UniqueConstraint("model_id", "version", name="uq_model_versions_model_id_version"),
    )
    op.create_table(
        "model_aliases",
        sa.Column("model_id", _Id, nullable=False),
        sa.Column("alias", sa.String(64), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("model_id", "alias", name="pk_model_aliases"),
        sa.ForeignKeyConstraint(
            ["model_id"],
            ["models.id"],
            name="fk_model_aliases_model_id_models",
            ondelete="CASCADE",
        ),
    )


def downgrade() -> None:
    op.drop_table("model_aliases")
    op.drop_table("model_versions")
    op.drop_table("models")
