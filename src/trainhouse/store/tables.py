"""SQLAlchemy table definitions: the one schema, shared by SQLite and PostgreSQL.

Changes here need an Alembic migration in ``store/migrations/versions``; a unit test compares
the migrated database with this metadata and fails on any drift.

Text a job controls (its log lines, in a failed attempt's ``log_tail`` and in reasons; a
corruption report) is stored through :class:`JobText`, which makes any string storable
(:func:`storable`): the one place where such text meets the database.
"""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    TypeDecorator,
    UniqueConstraint,
    false,
    text,
)
from sqlalchemy.engine import Dialect

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

# BigInteger ids on PostgreSQL, INTEGER (the rowid alias) on SQLite.
_Id = BigInteger().with_variant(Integer(), "sqlite")

# NUL, which PostgreSQL's text cannot hold, and lone surrogates, which UTF-8 cannot encode
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def storable(value: str) -> str:
    """``value`` as every backend can store it: each NUL character and each lone surrogate
    becomes U+FFFD, the character a failed decode gives; nothing else changes (control
    characters, colour codes and the rest of Unicode stay)."""
    return _UNSTORABLE.sub("\ufffd", value)


class JobText(TypeDecorator[str]):
    """A TEXT column for text a job controls: written through :func:`storable`, so no byte a
    job printed can make the write fail (a failing rank's NUL once made its attempt
    unrecordable on PostgreSQL: the job was taken for lost and restarted forever)."""

    impl = Text
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> str | None:
        return None if value is None else storable(str(value))


jobs = Table(
    "jobs",
    metadata,
    Column("id", _Id, primary_key=True, autoincrement=True),
    Column("name", String(128), nullable=False),
    Column("owner", String(128), nullable=False),
    Column("state", String(16), nullable=False, index=True),
    Column("priority", String(16), nullable=False),
    Column("spec", JSON, nullable=False),
    Column("archive_sha256", String(64), nullable=False),
    Column("created_at", Float, nullable=False),
    Column("started_at", Float),
    Column("ended_at", Float),
    Column("attempts", Integer, nullable=False, default=0),
    Column("restarts", Integer, nullable=False, default=0),  # after failures of the job's code
    # after infrastructure failures (a rank killed by a signal, a lost node): not in max_restarts
    Column("infra_restarts", Integer, nullable=False, default=0, server_default=text("0")),
    Column("exit_code", Integer),
    Column("reason", JobText),  # may quote the failing rank's last lines
    Column("cancel_requested", Boolean, nullable=False, default=False),
    Column("preempt_requested", Boolean, nullable=False, default=False, server_default=false()),
    Column("token_hash", String(64)),
    Column("placement", JSON),
    Column("total_steps", BigInteger),
    Column("last_step", BigInteger),
    Column("latest_metrics", JSON),
    Column("updated_at", Float, nullable=False),
    # "launched" (scheduled, run by an executor) | "tracked" (an MLflow run made outside a job:
    # listed with the jobs, never scheduled)
    Column(
        # the database's default only: an insert that names no kind works on a schema from
        # before 0010 too (the migration tests write jobs into one)
        "kind",
        String(16),
        nullable=False,
        server_default=text("'launched'"),
    ),
    # a search's trial: the search (trainhouse.tune); NULL for a plain job
    Column("search_id", _Id, index=True),
    # a search's pruner stopped it: should_stop() says "pruned", it ends COMPLETED
    # (no Python-side default: an insert that does not name it works on older schemas too)
    Column("prune_requested", Boolean, nullable=False, server_default=false()),
    # an elastic job asked to stop at a checkpoint and start again at another size (0019)
    Column("resize_requested", Boolean, nullable=False, server_default=false()),
    # times a user sent it back to the queue after it ended (``trainhouse resume``)
    Column("resumes", Integer, nullable=False, default=0, server_default=text("0")),
    # the job it was cloned from (``trainhouse clone``; no foreign key: the original may be
    # deleted, the record of where this one came from stays) and the step of the checkpoint
    # of that job it started from (NULL: it started fresh)
    Column("cloned_from", _Id, index=True),
    Column("cloned_step", BigInteger),
    # a QUEUED job the scheduler leaves alone: a clone while its checkpoint is copied in
    Column("held", Boolean, nullable=False, default=False, server_default=false()),
    # the runs table (trainhouse.store.runs): the spec's project, the hparams the run used as
    # its SDK reported them (NULL: none reported yet; the spec's are in "spec"), a markdown
    # note, and archived jobs (kept, out of the default list)
    Column("project", String(128), nullable=False, server_default=text("'default'"), index=True),
    Column("hparams", JSON),
    Column("note", JobText),
    Column("archived", Boolean, nullable=False, server_default=false()),
    # the flow it is a step of (0017; no foreign key: a flow's record outlives a deleted step)
    Column("flow_id", _Id, index=True),
    Column("flow_step", String(32)),
)

# a job's tags, one row each (the runs table filters by them)
job_tags = Table(
    "job_tags",
    metadata,
    Column("job_id", _Id, ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
    Column("tag", String(64), nullable=False),
    PrimaryKeyConstraint("job_id", "tag"),
    Index("ix_job_tags_tag_job_id", "tag", "job_id"),
)

# the hparams a job runs with, one row per (flattened) key: its value as a number (numbers and
# booleans) and as text, so that a filter or sort on one key uses an index
job_hparams = Table(
    "job_hparams",
    metadata,
    Column("job_id", _Id, ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
    Column("key", String(256), nullable=False),
    Column("num", Float),
    Column("text", String(256)),
    PrimaryKeyConstraint("job_id", "key"),
    Index("ix_job_hparams_key_num", "key", "num"),
    Index("ix_job_hparams_key_text", "key", "text"),
)

attempts = Table(
    "attempts",
    metadata,
    Column("id", _Id, primary_key=True, autoincrement=True),
    Column("job_id", _Id, ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
    Column("number", Integer, nullable=False),
    Column("started_at", Float, nullable=False),
    Column("ended_at", Float),
    Column("result", String(16)),
    Column("exit_code", Integer),
    Column("rank_exit_codes", JSON),
    Column("placement", JSON),
    Column("pid", Integer),
    Column("pid_create_time", Float),
    Column("reason", JobText),
    Column("failure", String(16)),  # "user" (the job's code) | "infra" (signal, lost node)
    Column("failed_rank", Integer),  # the rank that failed first
    Column("log_tail", JobText),  # its last log lines
    UniqueConstraint("job_id", "number"),
)

events = Table(
    "events",
    metadata,
    Column("id", _Id, primary_key=True, autoincrement=True),
    Column("job_id", _Id, ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False, index=True),
    Column("at", Float, nullable=False),
    Column("from_state", String(16)),
    Column("to_state", String(16), nullable=False),
    Column("reason", JobText),
)

metrics = Table(
    "metrics",
    metadata,
    Column("id", _Id, primary_key=True, autoincrement=True),
    Column("job_id", _Id, ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
    Column("attempt", Integer, nullable=False),
    # -1 = the job itself (reported by the main rank); >= 0 = a rank's own value (all_ranks=True)
    Column("rank", Integer, nullable=False),
    Column("step", BigInteger, nullable=False),
    Column("name", String(256), nullable=False),
    Column("value", Float),  # NULL = not finite (NaN or inf)
    Column("wall_time", Float, nullable=False),
    UniqueConstraint("job_id", "name", "rank", "step"),
)

# the rollup of ``metrics`` (trainhouse.store.rollup): per series, level (a bucket width of 16,
# 256, 4096 or 65536 steps) and bucket (step // width), the bucket's point count, its first and
# last steps and its smallest and largest finite values with their (earliest) steps (NULL: no
# finite value); kept in the ingest transaction, read by downsampled queries and series counts
metric_buckets = Table(
    "metric_buckets",
    metadata,
    Column("job_id", _Id, ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
    Column("name", String(256), nullable=False),
    Column("rank", Integer, nullable=False),
    Column("level", Integer, nullable=False),
    Column("bucket", BigInteger, nullable=False),
    Column("count", BigInteger, nullable=False),
    Column("first_step", BigInteger, nullable=False),
    Column("last_step", BigInteger, nullable=False),
    Column("min_value", Float),
    Column("min_step", BigInteger),
    Column("max_value", Float),
    Column("max_step", BigInteger),
    PrimaryKeyConstraint("job_id", "name", "rank", "level", "bucket"),
)

# every series (name, rank) a job has reported, once: what the cap on a job's series counts
# (trainhouse.core.reports.MAX_SERIES); written in the ingest transaction, never deleted but
# with the job (a series whose points a resume dropped still counts)
metric_series = Table(
    "metric_series",
    metadata,
    Column("job_id", _Id, ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
    Column("name", String(256), nullable=False),
    Column("rank", Integer, nullable=False),
    PrimaryKeyConstraint("job_id", "name", "rank"),
)

# per series of the job's own values (rank -1): its last value (at its highest step) and its
# smallest and largest finite values; kept in the ingest transaction from the rollup's coarsest
# buckets (trainhouse.store.metrics), read by the runs table without touching the points
metric_summaries = Table(
    "metric_summaries",
    metadata,
    Column("job_id", _Id, ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
    Column("name", String(256), nullable=False),
    Column("last_step", BigInteger, nullable=False),
    Column("last_value", Float),
    Column("min_value", Float),
    Column("max_value", Float),
    PrimaryKeyConstraint("job_id", "name"),
    Index("ix_metric_summaries_name_last_value", "name", "last_value"),
    Index("ix_metric_summaries_name_min_value", "name", "min_value"),
    Index("ix_metric_summaries_name_max_value", "name", "max_value"),
)

report_batches = Table(
    "report_batches",
    metadata,
    Column("job_id", _Id, ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
    Column("batch_id", String(64), primary_key=True),
    Column("at", Float, nullable=False),
)

checkpoints = Table(
    "checkpoints",
    metadata,
    Column("id", _Id, primary_key=True, autoincrement=True),
    Column("job_id", _Id, ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("step", BigInteger, nullable=False),
    Column("path", Text, nullable=False),
    Column("size", BigInteger, nullable=False),
    Column("sha256", String(64), nullable=False),  # the digest, of the algorithm below
    Column("metrics", JSON),
    Column("created_at", Float, nullable=False),
    Column("deleted", Boolean, nullable=False, default=False),
    # "file" (one torch.save file) | "sharded" (a directory of torch.distributed.checkpoint shards)
    Column("kind", String(16), nullable=False, default="file", server_default=text("'file'")),
    Column("corrupt", JobText),  # why a load refused it (checksum mismatch, missing); NULL = fine
    # what the digest in "sha256" was made with: "sha256" (all before 0008) | "blake3"
    Column(
        "algorithm", String(16), nullable=False, default="sha256", server_default=text("'sha256'")
    ),
    Index("ix_checkpoints_job_id_step", "job_id", "step"),
)

# MLflow experiments (trainhouse.store.tracking); "0", the default one, is not stored
mlflow_experiments = Table(
    "mlflow_experiments",
    metadata,
    Column("id", _Id, primary_key=True, autoincrement=True),
    Column("name", String(500), nullable=False, unique=True),
    Column("created_at", Float, nullable=False),
)

# the MLflow view of a job: its experiment, run name and MLflow status (a launched job's own
# state is the job's; a tracked run's state follows this status)
mlflow_runs = Table(
    "mlflow_runs",
    metadata,
    Column("job_id", _Id, ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
    Column("experiment_id", _Id, nullable=False),
    Column("run_name", String(250), nullable=False),
    Column("user_id", String(256), nullable=False),
    Column("status", String(16), nullable=False),
    Column("start_time", BigInteger, nullable=False),  # ms, as MLflow has it
    Column("end_time", BigInteger),
)

# a run's params ("param": the job's reported hparams) and tags ("tag")
run_values = Table(
    "run_values",
    metadata,
    Column("job_id", _Id, ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
    Column("kind", String(8), nullable=False),
    Column("key", String(250), nullable=False),
    Column("value", JobText, nullable=False),
    PrimaryKeyConstraint("job_id", "kind", "key"),
)

# per-user scheduling limits: fair share weight and concurrent GPU/CPU caps (None = no cap)
user_limits = Table(
    "user_limits",
    metadata,
    Column("owner", String(128), primary_key=True),
    Column("share", Float, nullable=False, default=1.0),
    Column("max_gpus", Integer),
    Column("max_cpus", Integer),
)

# decayed fair-share usage (cluster-seconds) per user, as of updated_at
user_usage = Table(
    "user_usage",
    metadata,
    Column("owner", String(128), primary_key=True),
    Column("usage", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
)

# resource samples (trainhouse.monitoring.sampler): a node's (job_id NULL) or a job's processes' on
# that node; gpu = the GPU index for per-GPU values. Names: trainhouse.store.system
system_metrics = Table(
    "system_metrics",
    metadata,
    Column("id", _Id, primary_key=True, autoincrement=True),
    Column("node", String(128), nullable=False),
    Column("job_id", _Id, ForeignKey("jobs.id", ondelete="CASCADE")),
    Column("name", String(64), nullable=False),
    Column("gpu", Integer),
    Column("value", Float, nullable=False),
    Column("at", Float, nullable=False),  # unix time
    Index("ix_system_metrics_node_name_at", "node", "name", "at"),
    Index("ix_system_metrics_job_id_name_at", "job_id", "name", "at"),
    Index("ix_system_metrics_at", "at"),  # retention deletes by age
)

# -- accounts (trainhouse.store.accounts) ---------------------------------------------------
# people who use a server with auth on; a job's owner is the name of the user who submitted it
users = Table(
    "users",
    metadata,
    Column("id", _Id, primary_key=True, autoincrement=True),
    Column("name", String(64), nullable=False, unique=True),
    Column("role", String(16), nullable=False),  # admin | member | viewer
    Column("created_at", Float, nullable=False),
    Column("disabled_at", Float),  # a disabled user's tokens stop working
)

# API tokens: only the sha256 of the secret is kept; "prefix" is the secret's first characters,
# shown in listings so a person can tell their tokens apart
api_tokens = Table(
    "api_tokens",
    metadata,
    Column("id", _Id, primary_key=True, autoincrement=True),
    Column("user_id", _Id, ForeignKey("users.id", ondelete="CASCADE"), nullable=False, index=True),
    Column("name", String(64), nullable=False),
    Column("hash", String(64), nullable=False, unique=True),
    Column("prefix", String(16), nullable=False),
    Column("created_at", Float, nullable=False),
    Column("expires_at", Float),  # NULL: never
    Column("revoked_at", Float),
    Column("last_used_at", Float),
)

# who did what: admin actions, cancellations, token use failures (trainhouse admin audit)
audit_log = Table(
    "audit_log",
    metadata,
    Column("id", _Id, primary_key=True, autoincrement=True),
    Column("at", Float, nullable=False, index=True),
    Column("actor", String(128), nullable=False),  # a user's name, job:<id>, or "-" (unknown)
    Column("action", String(64), nullable=False, index=True),
    Column("target", String(256)),
    Column("ok", Boolean, nullable=False),
    Column("detail", JSON),
    Column("client", String(64)),  # the caller's address
)

# -- hyperparameter searches (trainhouse.tune; store.searches) -----------------------------
# a search: the spec as submitted (with its distributions and search: block); Optuna's study of
# the same name lives in Optuna's own tables (a schema of its own on PostgreSQL, a file of its
# own beside SQLite's)
searches = Table(
    "searches",
    metadata,
    Column("id", _Id, primary_key=True, autoincrement=True),
    Column("name", String(128), nullable=False),
    Column("owner", String(128), nullable=False, index=True),
    Column("state", String(16), nullable=False, index=True),  # RUNNING | COMPLETED | CANCELED
    Column("spec", JSON, nullable=False),
    Column("archive_sha256", String(64), nullable=False),
    Column("study", String(128), nullable=False, unique=True),  # Optuna's study name
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
    Column("ended_at", Float),
    Column("reason", JobText),
    Column("warning", JobText),  # said once: the metric a finished trial never logged
)

# a trial: Optuna's trial (number, id) and the job that runs it, written in the job's own
# transaction, so a trial has a job exactly when it has a row; "state" is final once Optuna
# was told (QUEUED/RUNNING are read from the job)
search_trials = Table(
    "search_trials",
    metadata,
    Column("search_id", _Id, ForeignKey("searches.id", ondelete="CASCADE"), nullable=False),
    Column("number", Integer, nullable=False),  # Optuna's trial number in the study
    Column("trial_id", BigInteger, nullable=False),  # Optuna's trial id
    Column("job_id", _Id, ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False, unique=True),
    Column("params", JSON, nullable=False),
    Column("state", String(16), nullable=False),  # ACTIVE | COMPLETED | PRUNED | FAILED
    Column("value", Float),  # the objective Optuna was told (COMPLETED)
    Column("created_at", Float, nullable=False),
    Column("ended_at", Float),
    PrimaryKeyConstraint("search_id", "number"),
)

# the model registry (0012): a model is a name; each version points at the files a job saved
# (run.save_model) in its checkpoint storage, with the job, attempt and step that made it
models = Table(
    "models",
    metadata,
    Column("id", _Id, primary_key=True, autoincrement=True),
    Column("name", String(64), nullable=False, unique=True),
    Column("owner", String(128), nullable=False),
    Column("created_at", Float, nullable=False),
    # the highest version number it ever had (0015): a deleted version's number is never reused
    Column("last_version", Integer, nullable=False, server_default="0"),
)

model_versions = Table(
    "model_versions",
    metadata,
    Column("id", _Id, primary_key=True, autoincrement=True),
    Column("model_id", _Id, ForeignKey("models.id", ondelete="CASCADE"), nullable=False),
    Column("version", Integer, nullable=False),  # 1, 2, ... per model
    # the job that made it; NULL once that job is deleted (the version keeps its files' record)
    Column("job_id", _Id, ForeignKey("jobs.id", ondelete="SET NULL")),
    Column("attempt", Integer, nullable=False),
    Column("step", BigInteger, nullable=False),
    Column("path", Text, nullable=False),  # the version's directory in the job's storage
    # "export" (a torch.export program + safetensors weights) | "loader" (weights + a function
    # of the job's own code that rebuilds the model)
    Column("kind", String(16), nullable=False),
    Column("files", JSON, nullable=False),  # [{"name", "size", "sha256"}]
    Column("size", BigInteger, nullable=False),
    Column("metrics", JSON),
    Column("signature", JSON),  # {"inputs": [{"name", "shape", "dtype"}], "outputs": [...]}
    Column("record", JSON),  # the rest of model.json: torch version, code digest, loader
    Column("created_at", Float, nullable=False),
    UniqueConstraint("model_id", "version"),
)

model_aliases = Table(
    "model_aliases",
    metadata,
    Column("model_id", _Id, ForeignKey("models.id", ondelete="CASCADE"), nullable=False),
    Column("alias", String(64), nullable=False),
    Column("version", Integer, nullable=False),
    Column("updated_at", Float, nullable=False),
    PrimaryKeyConstraint("model_id", "alias"),
)

# services (0014): a model version served by a long-running job of replicas; ``ref`` is what
# the service follows (an alias, "latest", or a version number), resolved while it runs
services = Table(
    "services",
    metadata,
    Column("id", _Id, primary_key=True, autoincrement=True),
    Column("name", String(64), nullable=False, unique=True),
    Column("owner", String(128), nullable=False),
    Column("model", String(64), nullable=False),
    Column("ref", String(64), nullable=False),
    Column("replicas", Integer, nullable=False),
    Column("gpus_per_replica", Integer, nullable=False),
    Column("max_batch", Integer, nullable=False),
    Column("max_wait_ms", Float, nullable=False),
    Column("priority", String(16), nullable=False),
    Column("stopped", Boolean, nullable=False),
    # the job that runs its replicas now; a stopped or ended service keeps its last one
    Column("job_id", _Id, ForeignKey("jobs.id", ondelete="SET NULL")),
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
)

# datasets (0016): a name and its numbered versions; a version is a manifest (each file's path,
# size and digest, kept as a file named by its digest under the server's dataset storage) read
# from ``source`` (a URL fsspec reads, with ``storage_options``) or, source NULL, from the
# server's own dataset storage (an uploaded directory)
datasets = Table(
    "datasets",
    metadata,
    Column("id", _Id, primary_key=True, autoincrement=True),
    Column("name", String(64), nullable=False, unique=True),
    Column("owner", String(128), nullable=False),
    Column("created_at", Float, nullable=False),
    # the highest version number it ever had: a removed version's number is never reused
    Column("last_version", Integer, nullable=False, server_default="0"),
)

dataset_versions = Table(
    "dataset_versions",
    metadata,
    Column("id", _Id, primary_key=True, autoincrement=True),
    Column("dataset_id", _Id, ForeignKey("datasets.id", ondelete="CASCADE"), nullable=False),
    Column("version", Integer, nullable=False),
    Column("digest", String(64), nullable=False),  # the manifest's sha256
    Column("source", Text),  # NULL: the server's dataset storage
    Column("storage_options", JSON, nullable=False),
    Column("files", Integer, nullable=False),
    Column("size", BigInteger, nullable=False),
    # "sha256" (hashed at registration), "md5" (the store's checksums) or "sha256+md5"
    Column("checksums", String(16), nullable=False),
    Column("description", JobText),
    Column("created_by", String(128), nullable=False),
    Column("created_at", Float, nullable=False),
    UniqueConstraint("dataset_id", "version"),
    Index("ix_dataset_versions_digest", "digest"),
)

# the dataset versions a job reads, resolved at submit: kept after the version is removed (a
# model stays traced to the bytes it was trained on)
job_datasets = Table(
    "job_datasets",
    metadata,
    Column("job_id", _Id, ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
    Column("key", String(32), nullable=False),
    Column("name", String(64), nullable=False),
    Column("version", Integer, nullable=False),
    Column("digest", String(64), nullable=False),
    PrimaryKeyConstraint("job_id", "key"),
    Index("ix_job_datasets_name_version", "name", "version"),
)


# flows (0017): jobs submitted together as the steps of one flow (``jobs.flow_id``); ``steps``
# keeps each step's upstream steps and inputs as submitted, upstreams first
flows = Table(
    "flows",
    metadata,
    Column("id", _Id, primary_key=True, autoincrement=True),
    Column("name", String(128), nullable=False),
    Column("owner", String(128), nullable=False, index=True),
    Column("created_at", Float, nullable=False),
    Column("steps", JSON, nullable=False),
)

# the jobs a queued job waits for (``after:``): until each COMPLETED ("completed") or ended in
# any way ("ended"). No foreign key on the upstream: one deleted is seen as deleted
job_after = Table(
    "job_after",
    metadata,
    Column("job_id", _Id, ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
    Column("upstream_id", _Id, nullable=False),
    Column("until", String(16), nullable=False),
    PrimaryKeyConstraint("job_id", "upstream_id"),
    Index("ix_job_after_upstream_id", "upstream_id"),
)

# the model version a job read under each of its inputs, resolved when its attempt started
# (kept by later attempts; a resume resolves again): the lineage of what a step read
job_inputs = Table(
    "job_inputs",
    metadata,
    Column("job_id", _Id, ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
    Column("key", String(32), nullable=False),
    Column("ref", String(200), nullable=False),  # what the spec said: job:31, digits@champion
    Column("model", String(64), nullable=False),
    Column("version", Integer, nullable=False),
    Column("digest", String(64), nullable=False),  # the manifest of its files' sha256
    Column("attempt", Integer, nullable=False),
    Column("resolved_at", Float, nullable=False),
    PrimaryKeyConstraint("job_id", "key"),
    Index("ix_job_inputs_model_version", "model", "version"),
)

# a job's ``promote:``: made pending at submit, decided once when the job completes (the
# scheduler; a server that died in between decides it at start-up). No foreign key: the
# record of why an alias moved outlives the job
promotions = Table(
    "promotions",
    metadata,
    Column("job_id", _Id, primary_key=True, autoincrement=False),
    Column("alias", String(64), nullable=False),
    Column("metric", String(256), nullable=False),
    Column("mode", String(8), nullable=False),
    Column("model", String(64)),
    Column("version", Integer),
    Column("value", Float),
    Column("previous_version", Integer),
    Column("previous_value", Float),
    Column("promoted", Boolean),
    Column("decision", JobText),
    Column("decided_at", Float),
    Index("ix_promotions_model", "model"),
)

# images (PNG bytes), histograms and tables (JSON) a job logged, one per (key, step): a key
# holds one kind; bounded per job in count and bytes (trainhouse.core.media, counted by
# trainhouse.store.media in the transaction that stores one)
job_media = Table(
    "job_media",
    metadata,
    Column("id", _Id, primary_key=True, autoincrement=True),
    Column("job_id", _Id, ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
    Column("key", String(256), nullable=False),
    Column("step", BigInteger, nullable=False),
    Column("kind", String(16), nullable=False),
    Column("width", Integer),
    Column("height", Integer),
    Column("caption", JobText),
    Column("size", Integer, nullable=False),
    Column("data", LargeBinary, nullable=False),
    Column("created_at", Float, nullable=False),
    UniqueConstraint("job_id", "key", "step"),
)

# how far the TensorBoard import has read each event file of a job (trainhouse.ingest
# .tensorboard): the byte offset after the last record whose points are stored, so a restarted
# server reads on from there; keyed by the SHA-256 of the file's path below the job's
# directory (a job names its paths: a long one is no key)
tensorboard_positions = Table(
    "tensorboard_positions",
    metadata,
    Column("job_id", _Id, ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
    Column("path_sha256", String(64), primary_key=True),
    Column("path", JobText, nullable=False),
    Column("position", BigInteger, nullable=False),
    Column("updated_at", Float, nullable=False),
)
