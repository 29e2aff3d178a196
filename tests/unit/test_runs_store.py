"""The runs table in the store (SQLite and PostgreSQL): series summaries kept at ingest, the
filter language compiled to SQL, sorts with missing values last, tags, notes, archiving, the
hparams a run reported, and deleting a job's rows."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from tests.support.records import new_job
from trainhouse.core.records import MetricPoint
from trainhouse.core.runquery import parse, parse_field, parse_fields
from trainhouse.errors import InvalidQuery, StoreError
from trainhouse.lifecycle import JobState
from trainhouse.store import Store
from trainhouse.store import tables as t


def ended(store: Store, job_id: int, state: JobState = JobState.COMPLETED) -> None:
    if state is JobState.CANCELED:
        store.jobs.transition(job_id, state, reason="test")
        return
    store.jobs.start_attempt(job_id, placement=(), token_hash="x")
    store.jobs.transition(job_id, state, reason="test")


def points(name: str, values: list[float], *, start: int = 0) -> list[MetricPoint]:
    return [MetricPoint(start + i, name, v) for i, v in enumerate(values)]


def summary(store: Store, job_id: int, name: str) -> tuple[object, ...] | None:
    s = t.metric_summaries
    with store.connect() as conn:
        row = conn.execute(
            select(s.c.last_step, s.c.last_value, s.c.min_value, s.c.max_value).where(
                s.c.job_id == job_id, s.c.name == name
            )
        ).first()
    return None if row is None else tuple(row)


def ids(store: Store, where: str, **kwargs: object) -> list[int]:
    page = store.runs.page(where=parse(where), archived=None, limit=100, **kwargs)  # type: ignore[arg-type]
    return [j.id for j in page.jobs]


def test_series_summaries_follow_ingest_replacements_and_resumes(store: Store) -> None:
    job = new_job(store)
    store.metrics.add(job, points("loss", [3.0, 1.0, 2.0]))
    assert summary(store, job, "loss") == (2, 2.0, 1.0, 3.0)
    store.metrics.add(job, points("loss", [0.5, float("nan")], start=3))
    assert summary(store, job, "loss") == (4, None, 0.5, 3.0)  # the last is NaN: no value
    store.metrics.add(job, [MetricPoint(1, "loss", 9.0)])  # a step logged again: replaced
    assert summary(store, job, "loss") == (4, None, 0.5, 9.0)
    # a rank's own values are not the job's series
    store.metrics.add(job, [MetricPoint(7, "loss", -5.0, rank=1)])
    assert summary(store, job, "loss") == (4, None, 0.5, 9.0)
    # a resume from step 1 drops what earlier attempts logged past it
    store.metrics.add(job, [MetricPoint(2, "acc", 0.7, attempt=1)])
    store.metrics.add(job, [MetricPoint(2, "loss", 4.0, attempt=2)], resume=(2, 1))
    assert summary(store, job, "loss") == (2, 4.0, 3.0, 9.0)
    assert summary(store, job, "acc") is None  # every point of it was dropped


def test_filters_sorts_and_columns(store: Store) -> None:
    jobs = []
    for i, (lr, loss, opt) in enumerate(
        [(1e-2, 0.5, "adam"), (1e-3, 0.05, "sgd"), (1e-4, 0.2, "adam")]
    ):
        spec = {
            "entrypoint": "python train.py",
            "project": "vision" if i < 2 else "nlp",
            "tags": ["sweep"] if i else [],
            "hparams": {"lr": lr, "optim": {"name": opt}, "warm": i == 1},
        }
        job = new_job(store, name=f"run{i}", spec=spec, owner="ann" if i else "bob")
        store.metrics.add(job, points("val/loss", [1.0, loss]))
        jobs.append(job)
    ended(store, jobs[1])
    plain = new_job(store, name="plain")  # no hparams, no metrics
    a, b, c = jobs

    assert ids(
        store, "metrics.val/loss.min < 0.1 and hparams.lr >= 1e-3 and state = COMPLETED"
    ) == [b]
    assert ids(store, "metrics.val/loss.last <= 0.2") == [c, b]
    assert ids(store, "hparams.optim.name = adam") == [c, a]
    assert ids(store, "not hparams.optim.name = adam") == [plain, b]
    assert ids(store, "hparams.warm = true") == [b]
    assert ids(store, "(tag = sweep or project = nlp) and name ~ RUN") == [c, b]
    assert ids(store, "tag != sweep") == [plain, a]
    assert ids(store, "project in (vision, nlp) and owner = ann") == [c, b]
    assert ids(store, "state = completed or state = queued") == [plain, c, b, a]
    assert ids(store, "id > 1 and priority >= normal") == [plain, c, b]

    # sorts: jobs without the value come last in either direction; ties by id
    def order(sort: str, direction: str) -> list[int]:
        page = store.runs.page(sort=parse_field(sort), order=direction, limit=10)  # type: ignore[arg-type]
        return [j.id for j in page.jobs]

    assert order("metrics.val/loss.min", "asc") == [b, c, a, plain]
    assert order("metrics.val/loss.min", "desc") == [a, c, b, plain]
    assert order("hparams.lr", "asc") == [c, b, a, plain]
    assert order("hparams.optim.name", "asc") == [a, c, b, plain]  # ties by id, this way
    assert order("name", "asc") == [plain, a, b, c]

    # the page's chosen columns, by field name; a job without one has no entry
    page = store.runs.page(
        columns=parse_fields(
            "hparams.lr,metrics.val/loss.min,metrics.val/loss.last,hparams.optim.name"
        ),
        limit=10,
    )
    assert page.values[b] == {
        "hparams.lr": 1e-3,
        "hparams.optim.name": "sgd",
        "metrics.val/loss.min": 0.05,
        "metrics.val/loss.last": 0.05,
    }
    assert page.values[plain] == {}
    assert page.tags[b] == ["sweep"] and page.tags[a] == []
    assert page.total == 4

    # the caller may read only their own jobs' values: others' match no such filter
    assert ids(store, "hparams.lr > 0", private="bob") == [a]
    assert ids(store, "project = vision", private="bob") == [b, a]  # the job's own columns

    with pytest.raises(InvalidQuery, match="state 'DONE' is not one of"):
        ids(store, "state = DONE")
    with pytest.raises(InvalidQuery, match="is a number"):
        ids(store, "restarts ~ 1")


def test_tags_notes_archive_hparams_and_delete(store: Store) -> None:
    job = new_job(
        store, spec={"entrypoint": "python train.py", "tags": ["a"], "hparams": {"lr": 1}}
    )
    other = new_job(store)
    assert store.runs.change_tags(job, add=["c", "b", "c"], remove=["a"]) == ["b", "c"]
    assert store.runs.change_tags(job, add=["b"]) == ["b", "c"]
    store.runs.set_note(job, "# best so far\n\n*lr* 1")
    assert store.jobs.get(job).note == "# best so far\n\n*lr* 1"
    store.runs.set_note(job, "")
    assert store.jobs.get(job).note is None
    with pytest.raises(StoreError, match="at most"):
        store.runs.set_note(job, "x" * 70_000)

    store.runs.set_hparams(job, {"lr": 0.5, "epochs": 3})
    assert store.jobs.get(job).hparams == {"lr": 0.5, "epochs": 3}
    assert ids(store, "hparams.epochs = 3") == [job]
    assert ids(store, "hparams.lr = 1") == []  # the spec's value was replaced

    ended(store, job, JobState.CANCELED)
    store.runs.set_archived(job, True)
    assert [j.id for j in store.runs.page(limit=10).jobs] == [other]
    assert [j.id for j in store.runs.page(limit=10, archived=True).jobs] == [job]

    with pytest.raises(StoreError, match="only an ended job can be deleted"):
        store.runs.delete(other)
    store.metrics.add(job, points("loss", [1.0, 2.0]))
    removed = store.runs.delete(job)
    assert removed["metrics"] == 2 and removed["job_tags"] == 2 and removed["job_hparams"] == 2
    assert removed["metric_summaries"] == 1 and removed["events"] >= 2
    with store.connect() as conn:
        for table in (t.jobs, t.metrics, t.metric_buckets, t.metric_summaries, t.job_hparams):
            n = conn.execute(
                select(func.count())
                .select_from(table)
                .where((table.c.id if table is t.jobs else table.c.job_id) == job)
            ).scalar_one()
            assert n == 0, table.name
    assert store.jobs.get(other).id == other


@pytest.mark.parametrize(
    ("text", "column", "message"),
    [
        (
            "metrics.loss.min <",
            19,
            "expected a value to compare metrics.loss.min with, found the end",
        ),
        ("state = COMPLETED and", 22, "expected a field"),
        ("hparams.lr >= 1e-3 or or", 23, "expected a field"),
        ("metrics.loss.mean < 1", 1, "metrics.<series>.<last|min|max>"),
        ("stat = RUNNING", 1, "did you mean 'state'?"),
        ("(state = QUEUED", 16, "expected ')'"),
        ("state = QUEUED)", 15, "expected 'and', 'or' or the end"),
        ("name = 'x", 8, "unexpected character"),
        ("metrics.loss.min < abc", 20, "is a number"),
        ("state QUEUED", 7, "expected an operator"),
        ("lr # 1", 4, "unexpected character"),
    ],
)
def test_query_errors_point_at_the_token(text: str, column: int, message: str) -> None:
    from trainhouse.core.runquery import QueryError

    with pytest.raises(QueryError) as info:
        parse(text)
    assert info.value.column == column, str(info.value)
    assert message in str(info.value)
    assert str(info.value).splitlines()[-1] == "  " + " " * (column - 1) + "^"


def test_parse_trees() -> None:
    from trainhouse.core.runquery import And, Compare, Field, In, Not, Or

    tree = (
        parse("a_b = 1") if False else parse("not (tag = x or project in (a, 'b c')) and id >= 2")
    )
    assert tree == And(
        (
            Not(
                Or(
                    (
                        Compare(Field("job", "tag"), "=", "x"),
                        In(Field("job", "project"), ("a", "b c")),
                    )
                )
            ),
            Compare(Field("job", "id"), ">=", 2.0),
        )
    )
    assert parse("  ") is None
    assert parse("metrics.a.b.max == -1.5e2") == Compare(
        Field("metrics", "a.b", "max"), "=", -150.0
    )
