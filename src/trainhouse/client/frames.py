"""What the client hands back as tables: jobs and metrics that turn into pandas DataFrames.

    jobs = client.jobs(where="state = COMPLETED", columns="hparams.lr,metrics.val_loss.min")
    jobs.to_pandas()                  # a row per job: id, name, state, ..., hparams.lr, ...
    client.metrics(12).history()      # a row per step: step, wall_time, a column per series

Both are the plain JSON the server sent (a list of job dicts; the metrics dict), so code that
indexes them as before keeps working. pandas is an optional extra (``pip install
trainhouse[pandas]``), imported when a DataFrame is asked for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainhouse.client.records import Job

if TYPE_CHECKING:
    import pandas

__all__ = ["JobList", "Metrics"]

# the job fields a runs table's DataFrame has, in this order (then the chosen columns)
JOB_COLUMNS = (
    "id",
    "name",
    "owner",
    "project",
    "tags",
    "state",
    "priority",
    "created_at",
    "started_at",
    "ended_at",
    "attempts",
    "restarts",
    "last_step",
    "total_steps",
    "archived",
)


def _pandas() -> Any:
    try:
        import pandas
    except ImportError:
        raise ImportError(
            "a DataFrame needs pandas, an optional extra: pip install 'trainhouse[pandas]'"
        ) from None
    return pandas


class JobList(list[Job]):
    """Jobs as the server listed them (:class:`~trainhouse.client.records.Job` dicts), with
    the page's ``total`` and ``columns``."""

    def __init__(
        self,
        jobs: list[Job],
        *,
        total: int | None = None,
        columns: list[str] = (),  # type: ignore[assignment]
    ) -> None:
        super().__init__(jobs)
        self.total = len(jobs) if total is None else total
        self.columns = list(columns)

    def to_pandas(self, *, hparams: bool = True) -> pandas.DataFrame:
        """A row per job: its fields (times as UTC timestamps), then each chosen column
        (``hparams.lr``, ``metrics.val_loss.min``, ``note``: the job's own), then, with
        ``hparams``, every hparam the run used (``hparams.<key>``, nested keys joined with
        dots) not already a column."""
        pd = _pandas()
        rows = []
        for job in self:
            row = {k: job.get(k) for k in JOB_COLUMNS}
            values = job.get("values") or {}
            for column in self.columns:
                if "." in column:
                    row[column] = values.get(column)
                elif column not in row and column != "tag":  # a job's own field: note, reason
                    row[column] = job.get(column)
            if hparams:
                used = job.get("hparams")
                if used is None:
                    used = (job.get("spec") or {}).get("hparams") or {}
                for key, value in _flat(used).items():
                    row.setdefault(f"hparams.{key}", value)
            rows.append(row)
        frame = pd.DataFrame(rows, columns=None if rows else list(JOB_COLUMNS))
        for column in ("created_at", "started_at", "ended_at"):
            if column in frame:
                frame[column] = pd.to_datetime(frame[column], unit="s", utc=True)
        return frame


def _flat(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict) and value:
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


class Metrics(dict[str, Any]):
    """A job's metrics as ``GET /jobs/{id}/metrics`` answers them (``{"job_id", "series":
    [{"name", "rank", "points": [[step, value, wall_time]], ...}]}``)."""

    def to_pandas(self) -> pandas.DataFrame:
        """Long form: a row per point, with ``name``, ``rank`` (None: the job's own value),
        ``step``, ``value`` (NaN where it was not finite) and ``wall_time`` (a UTC
        timestamp)."""
        pd = _pandas()
        rows = [
            (s["name"], s.get("rank"), step, value, wall)
            for s in self.get("series", [])
            for step, value, wall in s["points"]
        ]
        frame = pd.DataFrame(rows, columns=["name", "rank", "step", "value", "wall_time"])
        frame["value"] = frame["value"].astype(float)
        frame["wall_time"] = pd.to_datetime(frame["wall_time"], unit="s", utc=True)
        return frame

    def history(self) -> pandas.DataFrame:
        """Wide form: a row per step, ``step`` and ``wall_time`` (the latest any series logged
        at that step), and a column per series (``loss``; another rank's own values as
        ``loss[rank 1]``), NaN where a series has no value at that step."""
        pd = _pandas()
        long = self.to_pandas()
        if long.empty:
            return pd.DataFrame(columns=["step", "wall_time"])
        long["series"] = [
            n if r is None or r != r else f"{n}[rank {int(r)}]"
            for n, r in zip(long["name"], long["rank"], strict=True)
        ]
        wide = long.pivot_table(
            index="step", columns="series", values="value", aggfunc="last", dropna=False
        )
        wide.columns.name = None
        walls = long.groupby("step")["wall_time"].max()
        wide.insert(0, "wall_time", walls)
        return wide.reset_index()
