"""The runs table (``store.runs``): jobs listed with chosen columns, sorted and filtered on
their hparams and metric summaries; tags, notes, archiving, the hparams a run used, deletion.

A page never reads metric points: a series' last, smallest and largest values are kept in
``metric_summaries`` at ingest (:mod:`trainhouse.store.metrics`), and each job's hparams in
``job_hparams``, one row per flattened key with its value as a number and as text. A filter
(:mod:`trainhouse.core.runquery`) becomes a correlated ``EXISTS (SELECT ... WHERE job_id = jobs.id
AND key = ? AND value < ?)``, probed through the (job, key) primary keys (SQLite runs it about
twice as fast as ``jobs.id IN (SELECT job_id ...)`` on 10,000 jobs; PostgreSQL plans both as a
semi-join); a sort on one joins the one summary or hparam per job; the page's columns are then
read for its jobs only.
"""

from __future__ import annotations

import operator
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from sqlalchemy import (
    Select,
    String,
    and_,
    case,
    cast,
    delete,
    exists,
    false,
    func,
    insert,
    not_,
    or_,
    select,
    true,
    update,
)
from sqlalchemy.sql.elements import ColumnElement

from trainhouse.core.errors import InvalidQuery, NotFound, StoreError
from trainhouse.core.lifecycle import JobState
from trainhouse.core.records import Job
from trainhouse.core.runquery import (
    NUMERIC_JOB_FIELDS,
    TEXT_JOB_FIELDS,
    And,
    Compare,
    Field,
    In,
    Node,
    Not,
    Op,
)
from trainhouse.core.spec import PRIORITY_TIERS
from trainhouse.store import tables as t
from trainhouse.store.jobrows import hparam_rows, job_filters, job_from_row

if TYPE_CHECKING:
    from sqlalchemy import Connection

    from trainhouse.store.database import Database

__all__ = ["MAX_NOTE", "Page", "RunsRepo"]

MAX_NOTE = 64 * 1024  # characters of a job's note
Scalar = float | str | None


@dataclass(frozen=True)
class Page:
    """A page of the runs table: its jobs, how many match, and per job the chosen columns'
    values (by the field's name)."""

    jobs: list[Job]
    total: int
    values: dict[int, dict[str, Scalar]]
    tags: dict[int, list[str]]


_AGGREGATE_COLUMN = {"last": "last_value", "min": "min_value", "max": "max_value"}


def _job_column(field: Field) -> ColumnElement[Any]:
    if field.key == "priority":
        return case(
            {tier: rank for rank, tier in enumerate(PRIORITY_TIERS)},
            value=t.jobs.c.priority,
            else_=-1,
        )
    return t.jobs.c[field.key]


_OPERATORS: dict[str, Callable[[Any, Any], Any]] = {
    "=": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


def _compare(column: ColumnElement[Any], op: Op, value: Any) -> ColumnElement[bool]:
    compare = _OPERATORS.get(op)
    if compare is not None:
        condition: ColumnElement[bool] = compare(column, value)
        return condition
    escaped = str(value).replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return func.lower(column).like(f"%{escaped.lower()}%", escape="\\")


def _has_tag(condition: ColumnElement[bool]) -> ColumnElement[bool]:
    return exists().where(t.job_tags.c.job_id == t.jobs.c.id, condition)


class _Compiler:
    """A query's tree as SQL conditions on ``jobs``. ``private``: the owner whose jobs' hparams
    and metrics the caller may read (None: every job's), so that a filter on them matches no
    job the caller may not read."""

    def __init__(self, private: str | None) -> None:
        self.private = private

    def node(self, node: Node) -> ColumnElement[bool]:
        if isinstance(node, Not):
            return not_(self.node(node.part))
        if isinstance(node, Compare):
            return self.compare(node.field, node.op, node.value)
        if isinstance(node, In):
            return or_(*(self.compare(node.field, "=", v) for v in node.values))
        parts = [self.node(p) for p in node.parts]
        return and_(*parts) if isinstance(node, And) else or_(*parts)

    def readable(self, condition: ColumnElement[bool]) -> ColumnElement[bool]:
        if self.private is None:
            return condition
        return and_(t.jobs.c.owner == self.private, condition)

    def compare(self, field: Field, op: Op, value: Any) -> ColumnElement[bool]:
        if field.kind == "job":
            return self.job(field, op, value)
        if field.kind == "datasets":
            return self.dataset(field, op, value)
        if field.kind == "hparams":
            h = t.job_hparams
            if isinstance(value, float):
                cond = _compare(h.c.num, op, value)
            else:
                cond = _compare(h.c.text, op, value)
            sub = exists().where(h.c.job_id == t.jobs.c.id, h.c.key == field.key, cond)
            return self.readable(sub)
        s = t.metric_summaries
        column = s.c[_AGGREGATE_COLUMN[field.aggregate or "last"]]
        sub = exists().where(
            s.c.job_id == t.jobs.c.id, s.c.name == field.key, _compare(column, op, value)
        )
        return self.readable(sub)

    def dataset(self, field: Field, op: Op, value: Any) -> ColumnElement[bool]:
        """``datasets.KEY = "NAME@VERSION"`` (or ``= NAME``: any version of it), ``!=``, ``~``:
        the version the job pinned under KEY (who may read a job sees what it read)."""
        d = t.job_datasets
        text = str(value)
        if op == "~":
            ref = d.c.name + "@" + cast(d.c.version, String)
            cond = _compare(ref, "~", text)
        elif op in ("=", "!="):
            name, at, version = text.partition("@")
            cond = d.c.name == name
            if at:
                if not version.isdigit():
                    raise InvalidQuery(f"{field} compares with NAME or NAME@VERSION, not {text!r}")
                cond = and_(cond, d.c.version == int(version))
        else:
            raise InvalidQuery(f"{field} compares with =, !=, ~ or in, not {op!r}")
        found = exists().where(d.c.job_id == t.jobs.c.id, d.c.key == field.key, cond)
        return not_(found) if op == "!=" else found

    def job(self, field: Field, op: Op, value: Any) -> ColumnElement[bool]:
        key = field.key
        if key == "tag":
            if op == "=":
                return _has_tag(t.job_tags.c.tag == str(value))
            if op == "!=":
                return not_(_has_tag(t.job_tags.c.tag == str(value)))
            if op == "~":
                return _has_tag(_compare(t.job_tags.c.tag, "~", value))
            raise InvalidQuery(f"tag compares with = , != , ~ or in, not {op!r}")
        if key in TEXT_JOB_FIELDS:
            # the user's note: text only who may read the job sees
            if op not in ("=", "!=", "~"):
                raise InvalidQuery(f"{key} compares with =, !=, ~ or in, not {op!r}")
            text = str(int(value)) if isinstance(value, float) and value.is_integer() else value
            cond = _compare(func.coalesce(t.jobs.c[key], ""), op, str(text))
            return self.readable(cond)
        if key in NUMERIC_JOB_FIELDS:
            if op == "~":
                raise InvalidQuery(f"{key} is a number: compare it with =, !=, <, <=, >, >=")
            if not isinstance(value, float):
                raise InvalidQuery(f"{key} is a number; compare it with a number, not {value!r}")
            return _compare(t.jobs.c[key], op, value)
        if isinstance(value, float):
            value = str(int(value)) if value.is_integer() else repr(value)
        if key == "state":
            if op == "~":
                return _compare(t.jobs.c.state, op, value)
            state = value.upper()
            if state not in {str(s) for s in JobState}:
                raise InvalidQuery(
                    f"state {value!r} is not one of {', '.join(str(s) for s in JobState)}"
                )
            if op not in ("=", "!="):
                raise InvalidQuery(f"state compares with = or !=, not {op!r}")
            return _compare(t.jobs.c.state, op, state)
        if key == "priority" and op in ("<", "<=", ">", ">="):
            if value not in PRIORITY_TIERS:
                raise InvalidQuery(f"priority {value!r} is not one of {', '.join(PRIORITY_TIERS)}")
            return _compare(_job_column(field), op, PRIORITY_TIERS.index(value))
        return _compare(t.jobs.c[key], op, value)


def _sort_key(
    field: Field, private: str | None
) -> tuple[ColumnElement[Any], tuple[Any, ColumnElement[bool]] | None, ColumnElement[Any] | None]:
    """The sort's column, the outer join it needs (None: none) and a second key (hparams: a
    key's text after its number, as a key may hold either)."""
    if field.kind == "job":
        if field.key == "tag":
            raise InvalidQuery("a job's tags are not a sort key")
        if field.key in TEXT_JOB_FIELDS:
            raise InvalidQuery(f"a job's {field.key} is not a sort key")
        return _job_column(field), None, None
    if field.kind == "datasets":
        raise InvalidQuery(f"{field} is not a sort key (filter on it: --where '{field} = NAME@N')")
    value: ColumnElement[Any]
    second: ColumnElement[Any] | None = None
    if field.kind == "hparams":
        h = t.job_hparams.alias("sort_hparam")
        join = (h, and_(h.c.job_id == t.jobs.c.id, h.c.key == field.key))
        value, second = h.c.num, h.c.text
    else:
        s = t.metric_summaries.alias("sort_summary")
        join = (s, and_(s.c.job_id == t.jobs.c.id, s.c.name == field.key))
        value = s.c[_AGGREGATE_COLUMN[field.aggregate or "last"]]
    if private is not None:
        value = case((t.jobs.c.owner == private, value), else_=None)
        second = None if second is None else case((t.jobs.c.owner == private, second), else_=None)
    return value, join, second


class RunsRepo:
    """The runs table's reads, and the writes of what it shows (tags, notes, the archived
    flag, the hparams a run used), and deleting a job's rows."""

    def __init__(self, db: Database) -> None:
        self.db = db

    # -- the list --------------------------------------------------------------------------
    def page(
        self,
        *,
        where: Node | None = None,
        columns: Sequence[Field] = (),
        sort: Field | None = None,
        order: Literal["asc", "desc"] = "desc",
        limit: int = 50,
        offset: int = 0,
        states: Iterable[JobState] | None = None,
        owner: str | None = None,
        name: str | None = None,
        project: str | None = None,
        tags: Sequence[str] = (),
        archived: bool | None = False,
        private: str | None = None,
        count: bool = True,
    ) -> Page:
        """A page of jobs matching every filter given, ordered by ``sort`` (jobs without a
        value last; ties by id in the same direction), with ``columns``' values.

        ``archived``: False (the default list) leaves archived jobs out, True lists only them,
        None both. ``tags``: jobs with every one of them. ``private``: see :class:`_Compiler`.
        Raises :class:`StoreError` for a comparison the field cannot make.
        """
        compiler = _Compiler(private)
        conds = job_filters(states, owner, name, tracked=None)  # tracked runs are listed too
        if project:
            conds.append(t.jobs.c.project == project)
        if archived is not None:
            conds.append(t.jobs.c.archived == (true() if archived else false()))
        for tag in tags:
            conds.append(_has_tag(t.job_tags.c.tag == tag))
        if where is not None:
            conds.append(compiler.node(where))
        # the count of every match comes with the page (a window over the rows the sort visits
        # anyway): one pass, not a second query
        matches = func.count().over().label("matches_")
        query: Select[Any] = select(t.jobs, matches)

        def direction(column: ColumnElement[Any]) -> Any:
            return column.desc() if order == "desc" else column.asc()

        order_by: list[Any] = []
        if sort is not None and not (sort.kind == "job" and sort.key == "id"):
            key, join, second = _sort_key(sort, private)
            source: Any = t.jobs
            if join is not None:
                alias, on = join
                source = t.jobs.outerjoin(alias, on)
                # jobs without a value last, on both backends (they put NULLs apart)
                order_by += [key.is_(None), direction(key)]
                if second is not None:  # numbers first, then text, then none
                    order_by += [second.is_(None), direction(second)]
            else:
                if sort.key in ("started_at", "ended_at"):
                    order_by.append(key.is_(None))
                order_by.append(direction(key))
            query = select(t.jobs, matches).select_from(source)
        order_by.append(direction(t.jobs.c.id))
        query = query.where(*conds).order_by(*order_by).limit(limit)
        if offset:
            query = query.offset(offset)
        with self.db.connect() as conn:
            rows = conn.execute(query).mappings().all()
            jobs = [job_from_row(r) for r in rows]
            if rows:
                total = int(rows[0]["matches_"])
            elif not count or offset == 0:
                total = offset
            else:  # past the last page: count them apart
                total = int(
                    conn.execute(
                        select(func.count()).select_from(t.jobs).where(*conds)
                    ).scalar_one()
                )
            ids = [j.id for j in jobs]
            values = self._values(conn, ids, columns)
            tags_of = self._tags(conn, ids)
        return Page(jobs, total, values, tags_of)

    def _values(
        self, conn: Connection, ids: list[int], columns: Sequence[Field]
    ) -> dict[int, dict[str, Scalar]]:
        out: dict[int, dict[str, Scalar]] = {i: {} for i in ids}
        if not ids or not columns:
            return out
        keys = [c.key for c in columns if c.kind == "hparams"]
        if keys:
            h = t.job_hparams
            rows = conn.execute(
                select(h.c.job_id, h.c.key, h.c.num, h.c.text).where(
                    h.c.job_id.in_(ids), h.c.key.in_(keys)
                )
            )
            for job_id, key, num, text in rows:
                out[job_id][f"hparams.{key}"] = num if num is not None else text
        pinned = {c.key for c in columns if c.kind == "datasets"}
        if pinned:
            d = t.job_datasets
            rows = conn.execute(
                select(d.c.job_id, d.c.key, d.c.name, d.c.version).where(
                    d.c.job_id.in_(ids), d.c.key.in_(pinned)
                )
            )
            for job_id, key, dataset, version in rows:
                out[job_id][f"datasets.{key}"] = f"{dataset}@{version}"
        series = {c.key for c in columns if c.kind == "metrics"}
        if series:
            s = t.metric_summaries
            summaries = conn.execute(
                select(s.c.job_id, s.c.name, s.c.last_value, s.c.min_value, s.c.max_value).where(
                    s.c.job_id.in_(ids), s.c.name.in_(series)
                )
            )
            wanted = {(c.key, c.aggregate) for c in columns if c.kind == "metrics"}
            for job_id, series_name, last, low, high in summaries:
                for aggregate, value in (("last", last), ("min", low), ("max", high)):
                    if (series_name, aggregate) in wanted:
                        out[job_id][f"metrics.{series_name}.{aggregate}"] = value
        return out

    def _tags(self, conn: Connection, ids: list[int]) -> dict[int, list[str]]:
        out: dict[int, list[str]] = {i: [] for i in ids}
        if ids:
            g = t.job_tags
            rows = conn.execute(
                select(g.c.job_id, g.c.tag).where(g.c.job_id.in_(ids)).order_by(g.c.tag)
            )
            for job_id, tag in rows:
                out[job_id].append(tag)
        return out

    def tags(self, job_id: int) -> list[str]:
        with self.db.connect() as conn:
            return self._tags(conn, [job_id])[job_id]

    def hparams_of(self, job_id: int) -> dict[str, Any] | None:
        """The hparams the run reported (None: none yet)."""
        with self.db.connect() as conn:
            row = conn.execute(select(t.jobs.c.hparams).where(t.jobs.c.id == job_id)).first()
        if row is None:
            raise NotFound(f"job {job_id} does not exist")
        value: dict[str, Any] | None = row[0]
        return value

    def names(self, *, private: str | None = None, limit: int = 500) -> dict[str, list[str]]:
        """What the columns picker offers: the hparam keys and series names jobs have (the
        most common first), the projects and the tags."""
        h, s, g = t.job_hparams, t.metric_summaries, t.job_tags

        def common(column: Any, table: Any) -> Select[Any]:
            q = select(column).select_from(table)
            if private is not None:
                q = q.join(t.jobs, t.jobs.c.id == table.c.job_id).where(t.jobs.c.owner == private)
            return q.group_by(column).order_by(func.count().desc(), column).limit(limit)

        with self.db.connect() as conn:
            return {
                "hparams": list(conn.execute(common(h.c.key, h)).scalars()),
                "metrics": list(conn.execute(common(s.c.name, s)).scalars()),
                "projects": list(
                    conn.execute(
                        select(t.jobs.c.project)
                        .group_by(t.jobs.c.project)
                        .order_by(t.jobs.c.project)
                        .limit(limit)
                    ).scalars()
                ),
                "tags": list(
                    conn.execute(
                        select(g.c.tag).group_by(g.c.tag).order_by(g.c.tag).limit(limit)
                    ).scalars()
                ),
            }

    # -- writes ----------------------------------------------------------------------------
    def set_hparams(self, job_id: int, hparams: Mapping[str, Any]) -> None:
        """The hparams the run used, as its SDK reported them: they replace the spec's in the
        table (filters, sorts, columns) and are kept as reported."""
        with self.db.transaction() as conn:
            result = conn.execute(
                update(t.jobs)
                .where(t.jobs.c.id == job_id)
                .values(hparams=dict(hparams), updated_at=time.time())
            )
            if result.rowcount == 0:
                raise NotFound(f"job {job_id} does not exist")
            conn.execute(delete(t.job_hparams).where(t.job_hparams.c.job_id == job_id))
            rows = hparam_rows(job_id, hparams)
            if rows:
                conn.execute(insert(t.job_hparams), rows)

    def change_tags(
        self, job_id: int, *, add: Sequence[str] = (), remove: Sequence[str] = ()
    ) -> list[str]:
        """Add and remove tags (already checked); the job's tags after."""
        from trainhouse.core.spec import MAX_TAGS

        g = t.job_tags
        with self.db.transaction() as conn:
            if conn.execute(select(t.jobs.c.id).where(t.jobs.c.id == job_id)).first() is None:
                raise NotFound(f"job {job_id} does not exist")
            if remove:
                conn.execute(delete(g).where(g.c.job_id == job_id, g.c.tag.in_(list(remove))))
            have = set(conn.execute(select(g.c.tag).where(g.c.job_id == job_id)).scalars())
            new = [tag for tag in dict.fromkeys(add) if tag not in have]
            if len(have) + len(new) > MAX_TAGS:
                raise StoreError(
                    f"a job has at most {MAX_TAGS} tags; job {job_id} has {len(have)} and "
                    f"{len(new)} would be added"
                )
            if new:
                conn.execute(insert(g), [{"job_id": job_id, "tag": tag} for tag in new])
            return self._tags(conn, [job_id])[job_id]

    def set_project(self, job_id: int, project: str) -> None:
        """Move the job to ``project`` (already checked)."""
        self._set(job_id, project=project)

    def set_note(self, job_id: int, note: str | None) -> None:
        if note is not None and len(note) > MAX_NOTE:
            raise StoreError(f"a note has at most {MAX_NOTE} characters, got {len(note)}")
        self._set(job_id, note=note or None)

    def set_archived(self, job_id: int, archived: bool) -> None:
        self._set(job_id, archived=archived)

    def _set(self, job_id: int, **values: Any) -> None:
        with self.db.transaction() as conn:
            result = conn.execute(
                update(t.jobs).where(t.jobs.c.id == job_id).values(**values, updated_at=time.time())
            )
        if result.rowcount == 0:
            raise NotFound(f"job {job_id} does not exist")

    def delete(self, job_id: int) -> dict[str, int]:
        """Delete an ended job and every row of it (attempts, events, metric points and their
        rollup, checkpoints' records, samples); how many rows of each table went. The rows go
        in one transaction; a job not ended is refused."""
        counted = (
            t.metrics,
            t.metric_buckets,
            t.metric_series,
            t.metric_summaries,
            t.checkpoints,
            t.system_metrics,
            t.events,
            t.attempts,
            t.job_tags,
            t.job_hparams,
            t.job_datasets,
            t.job_after,
            t.job_inputs,
            t.report_batches,
            t.job_media,
            t.tensorboard_positions,
        )
        removed: dict[str, int] = {}
        with self.db.transaction() as conn:
            row = conn.execute(select(t.jobs.c.state).where(t.jobs.c.id == job_id)).first()
            if row is None:
                raise NotFound(f"job {job_id} does not exist")
            if not JobState(row[0]).terminal:
                raise StoreError(
                    f"job {job_id} is {row[0]}: only an ended job can be deleted (cancel it first)"
                )
            for table in counted:  # explicitly, not by cascade: PostgreSQL and SQLite alike
                removed[table.name] = conn.execute(
                    delete(table).where(table.c.job_id == job_id)
                ).rowcount
            conn.execute(delete(t.jobs).where(t.jobs.c.id == job_id, t.jobs.c.state == row[0]))
        return removed
