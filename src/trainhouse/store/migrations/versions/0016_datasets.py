"""datasets: named, numbered versions (manifests) and the versions each job pins

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-05
"""

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

_Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "datasets",
        sa.Column("id", _Id, primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("owner", sa.String(128), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("last_version", sa.Integer(), nullable=False, server_default="0"),
        sa.PrimaryKeyConstraint("id", name="pk_datasets"),
        sa.UniqueConstraint("name", name="uq_datasets_name"),
    )
    op.create_table(
        "dataset_versions",
        sa.Column("id", _Id, primary_key=True, autoincrement=True),
        sa.Column("dataset_id", _Id, nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("source", sa.Text()),
        sa.Column("storage_options", sa.JSON(), nullable=False),
        sa.Column("files", sa.Integer(), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("checksums", sa.String(16), nullable=False),
        sa.Column("description", sa.Text()),
        sa.Column("created_by", sa.String(128), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_dataset_versions"),
        sa.UniqueConstraint("dataset_id", "version", name="uq_dataset_versions_dataset_id_version"),
        sa.ForeignKeyConstraint(
            ["dataset_id"],
            ["datasets.id"],
            name="fk_dataset_versions_dataset_id_datasets",
            ondelete="CASCADE",
        ),
    )
    op.create_index("ix_dataset_versions_digest", "dataset_versions", ["digest"])
    op.create_table(
        "job_datasets",
        sa.Column("job_id", _Id, nullable=False),
        sa.Column("key", sa.String(32), nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.PrimaryKeyConstraint("job_id", "key", name="pk_job_datasets"),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name="fk_job_datasets_job_id_jobs", ondelete="CASCADE"
        ),
    )
    op.create_index("ix_job_datasets_name_version", "job_datasets", ["name", "version"])


def downgrade() -> None:
    op.drop_table("job_datasets")
    op.drop_table("dataset_versions")
    op.drop_table("datasets")
