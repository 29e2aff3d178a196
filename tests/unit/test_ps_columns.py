"""``ps`` at any width: ids and progress never cut, numbers with their significant digits,
columns that do not fit left out whole and named; REASON (the scheduler's) and NOTE (the
user's) are two different columns."""

from __future__ import annotations

import re

import httpx
import pytest
from fastapi.testclient import TestClient
from rich.console import Console
from typer.testing import CliRunner

from tests.support.api import BASE_URL, InProcessTransport, services
from tests.support.records import WAIT, new_job
from trainhouse.cli import fit, render
from trainhouse.cli import options as cli_options
from trainhouse.cli.app import app as cli_app
from trainhouse.client import Client
from trainhouse.core.records import MetricPoint
from trainhouse.core.runquery import parse
from trainhouse.core.wire import CLIENT_HEADERS
from trainhouse.lifecycle import JobState
from trainhouse.store import Store


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0.0005369, "5.37e-04"),
        (0.3142159, "0.3142"),
        (270.0, "270"),
        (12345678.0, "12345678"),
        (0.0, "0"),
        (-2.5e-7, "-2.50e-07"),
        (1.5e9 + 0.5, "1.50e+09"),
        (float("nan"), "nan"),
    ],
)
def test_numbers_keep_their_significant_digits(value: float, text: str) -> None:
    assert fit.number(value) == text


def test_fit_drops_whole_columns_lowest_rank_first_and_never_the_kept_ones() -> None:
    def col(head: str, value: str, **kw: object) -> fit.Column:
        c = fit.Column(head, **kw)  # type: ignore[arg-type]
        c.add(value)
        return c

    cols = [
        col("ID", "12345", keep=True),
        col("NAME", "a-long-name", rank=8),
        col("OWNER", "somebody", rank=3),
        col("STEPS", "270/270", keep=True),
        col("REASON", "waits for 2 GPUs that no node has free", wrap=True, rank=4),
    ]
    shown, dropped = fit.fit(cols, 200)
    assert [c.head for c, _ in shown] == ["ID", "NAME", "OWNER", "STEPS", "REASON"] and not dropped
    assert [w for _, w in shown] == [5, 11, 8, 7, 38]
    # the prose wraps before anything goes: 5+11+8+7 and its floor, and four gaps of 2
    narrowest = 5 + 11 + 8 + 7 + fit.WRAP_FLOOR + 4 * 2
    shown, dropped = fit.fit(cols, narrowest)
    assert not dropped and dict((c.head, w) for c, w in shown)["REASON"] == fit.WRAP_FLOOR
    shown, dropped = fit.fit(cols, narrowest - 1)  # then the lowest rank: OWNER (3), REASON (4)
    assert [c.head for c in dropped] == ["OWNER"]
    shown, dropped = fit.fit(cols, 30)
    assert [c.head for c in dropped] == ["OWNER", "REASON"]
    assert [c.head for c, _ in shown] == ["ID", "NAME", "STEPS"]
    shown, dropped = fit.fit(cols, 5)  # too narrow for anything: the kept ones stay, uncut
    assert [(c.head, w) for c, w in shown] == [("ID", 5), ("STEPS", 7)]

    console = Console(width=30, record=True, color_system=None)
    fit.render(console, cols)
    lines = console.export_text().splitlines()
    assert lines[0].split() == ["ID", "NAME", "STEPS"]
    assert lines[1].split() == ["12345", "a-long-name", "270/270"]
    assert "left out" in lines[2] and "OWNER, REASON" in " ".join(lines[2:])


def in_process(api: TestClient) -> Client:
    client = Client(BASE_URL)
    client._http.close()
    client._http = httpx.Client(
        base_url=f"{BASE_URL}/api/v1", headers=CLIENT_HEADERS, transport=InProcessTransport(api)
    )
    return client


def _ps(
    monkeypatch: pytest.MonkeyPatch, width: int, *args: str
) -> tuple[list[str], list[list[str]]]:
    monkeypatch.setattr(render.console, "width", width)
    out = CliRunner().invoke(cli_app, ["ps", *args], env={"COLUMNS": str(width)})
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    assert all(len(line) <= width for line in lines), out.output
    return lines, [line.split() for line in lines]


def test_ps_at_80_120_and_200_columns(api: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    rt = services(api)
    ids = []
    for i in range(15):
        spec = {**WAIT, "hparams": {"lr": 0.0005369 * (i + 1), "optimizer": "adamw"}}
        job = new_job(rt.store, name=f"sweep-lr-{i:02d}", owner="somebody-long", spec=spec)
        ids.append(job)
    done = ids[11]  # ended, 270 of 270 steps
    rt.store.metrics.add(
        done, [MetricPoint(s, "val_loss", 1.0 / (s + 1)) for s in range(270)], total_steps=270
    )
    rt.store.jobs.transition(done, JobState.CANCELED, reason="canceled by somebody-long")
    rt.store.runs.set_note(done, "the best lr so far\nsecond line")
    monkeypatch.setattr(cli_options, "client", lambda url=None: in_process(api))
    chosen = "hparams.lr,hparams.optimizer,metrics.val_loss.min,note"

    for width in (80, 120, 200):
        lines, rows = _ps(monkeypatch, width, "--all", "--columns", chosen)
        head = rows[0]
        assert head[0] == "ID"
        assert "STEPS" in head and head.count("NOTE") <= 1
        by_id = {r[0]: r for r in rows[1:] if r and r[0].isdigit()}
        assert set(by_id) == {str(j) for j in ids}, "\n".join(lines)  # no id cut
        assert "270/270" in by_id[str(done)]
        if "hparams.lr" in head:
            assert "5.37e-04" in by_id[str(ids[0])], "\n".join(lines)
        at = [i for i, line in enumerate(lines) if "left out" in line]
        left_out = [" ".join(lines[at[0] :])] if at else []
        if width == 200:
            assert not left_out, "\n".join(lines)
            assert head == [
                "ID",
                "NAME",
                "OWNER",
                "STATE",
                "PRIORITY",
                "RANKS",
                "STEPS",
                "SUBMITTED",
                "hparams.lr",
                "hparams.optimizer",
                "metrics.val_loss.min",
                "NOTE",
                "REASON",
            ]
            row = " ".join(by_id[str(done)])
            assert "the best lr so far" in row and "second line" not in row
            assert "canceled by somebody-long" in " ".join(lines)
        else:
            # what is missing is named, under the table; nothing is cut mid-value
            assert left_out, "\n".join(lines)
            shown = set(head)
            for name in ("RANKS", "PRIORITY", "hparams.lr", "NOTE", "REASON", "OWNER"):
                assert (name in shown) != (name in left_out[0]), (name, "\n".join(lines))
            values = re.findall(r"\S+", " ".join(" ".join(r) for r in rows[1:]))
            assert "0.000" not in values and "0.0005" not in values
        if width == 120:
            assert {"hparams.lr", "metrics.val_loss.min", "NOTE"} <= set(head), "\n".join(lines)


def test_ps_reason_and_note_are_two_columns(
    api: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = services(api)
    job = new_job(rt.store, name="waits", spec=WAIT)
    rt.store.runs.set_note(job, "try a smaller batch")
    monkeypatch.setattr(cli_options, "client", lambda url=None: in_process(api))
    lines, rows = _ps(monkeypatch, 200, "--columns", "note")
    assert rows[0][-2:] == ["NOTE", "REASON"] and rows[0].count("NOTE") == 1
    assert "try a smaller batch" in lines[1]
    # reason chosen: where it was put, not twice
    lines, rows = _ps(monkeypatch, 200, "--columns", "reason,note")
    assert rows[0][-2:] == ["REASON", "NOTE"] and rows[0].count("REASON") == 1
    bad = CliRunner().invoke(cli_app, ["ps", "--columns", "hparams.lr,notes"])
    assert bad.exit_code == 2 and "unknown field 'notes'" in bad.output
    assert "did you mean 'note'" in bad.output


def test_note_and_reason_in_the_query_language(api: TestClient) -> None:
    rt = services(api)
    noted = new_job(rt.store, name="noted", spec=WAIT)
    other = new_job(rt.store, name="other", spec=WAIT)
    rt.store.runs.set_note(noted, "Baseline run, lr too high")
    get = lambda **params: api.get("/api/v1/jobs", params={"all": "true", **params})  # noqa: E731

    found = get(where="note ~ baseline", columns="note,reason")
    assert found.status_code == 200, found.text
    assert [j["id"] for j in found.json()["jobs"]] == [noted]
    assert found.json()["columns"] == ["note", "reason"]
    assert found.json()["jobs"][0]["note"] == "Baseline run, lr too high"
    assert [j["id"] for j in get(where="not note ~ baseline").json()["jobs"]] == [other]
    refused = get(where="reason ~ GPU")
    assert refused.status_code == 422 and "'reason' is a column, not a filter" in refused.text
    assert "not a sort key" in get(sort="note").text
    assert "note compares with" in get(where="note < 3").text
    unknown = get(columns="notes")
    assert unknown.status_code == 422 and "did you mean 'note'" in unknown.text
    assert unknown.json()["error"]["message"].startswith("columns: unknown field 'notes'")


def test_project_moves_jobs(api: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    rt = services(api)
    a, b = new_job(rt.store, spec=WAIT), new_job(rt.store, spec=WAIT)
    monkeypatch.setattr(cli_options, "client", lambda url=None: in_process(api))
    out = CliRunner().invoke(cli_app, ["project", str(a), str(b), "--to", "vision"])
    assert out.exit_code == 0 and f"job {b} is now in project vision" in out.output, out.output
    assert {rt.store.jobs.get(j).project for j in (a, b)} == {"vision"}
    bad = CliRunner().invoke(cli_app, ["project", str(a), "--to", "no spaces"])
    assert bad.exit_code == 2 and "a project is 1 to 128 letters" in bad.output, bad.output


def test_a_frame_keeps_job_fields_chosen_as_columns(api: TestClient) -> None:
    rt = services(api)
    job = new_job(rt.store, spec={**WAIT, "project": "vision", "hparams": {"lr": 0.1}})
    rt.store.runs.set_note(job, "kept")
    with in_process(api) as client:
        frame = client.jobs(columns="project,note,hparams.lr,tag").to_pandas()
    assert frame["project"].tolist() == ["vision"]  # not the (absent) values' None
    assert frame["note"].tolist() == ["kept"]
    assert frame["hparams.lr"].tolist() == [0.1]
    assert "tag" not in frame and frame["tags"].tolist() == [[]]


def test_a_filter_on_the_note_in_sql(store: Store) -> None:
    """On SQLite and PostgreSQL: ``~`` any case, ``=`` and ``!=`` (a job without a note is
    not equal to one), and only the private owner's notes when the caller may not read all."""
    noted = new_job(store, owner="ann", spec=WAIT)
    other = new_job(store, owner="bob", spec=WAIT)
    plain = new_job(store, owner="ann", spec=WAIT)
    store.runs.set_note(noted, "Baseline: 100% of the _data_")
    store.runs.set_note(other, "baseline too")

    def ids(where: str, private: str | None = None) -> list[int]:
        page = store.runs.page(where=parse(where), archived=None, limit=10, private=private)
        return sorted(j.id for j in page.jobs)

    assert ids("note ~ BASELINE") == sorted([noted, other])
    assert ids("note ~ '100%'") == [noted] and ids("note ~ '_data_'") == [noted]
    assert ids("note = 'baseline too'") == [other]
    assert ids("note != 'baseline too'") == sorted([noted, plain])
    assert ids("note ~ baseline", private="ann") == [noted]


def test_ps_shows_a_jobs_control_characters_escaped(
    api: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a job wrote (its hparams' values, a reason taken from its last log line) reaches
    ``ps`` as text with its control characters escaped: an ESC sequence (``ESC[2J`` clears the
    screen, ``ESC]0;...`` sets the terminal's title) never reaches the terminal."""
    rt = services(api)
    job = new_job(rt.store, name="escapes", spec={**WAIT, "hparams": {"opt": "a\x1b[2Jb"}})
    rt.store.jobs.transition(job, JobState.CANCELED, reason="boom \x1b]0;owned\x07 [/]")
    monkeypatch.setattr(cli_options, "client", lambda url=None: in_process(api))
    lines, _ = _ps(monkeypatch, 200, "--all", "--columns", "hparams.opt")
    out = "\n".join(lines)
    assert "\x1b" not in out and "\x07" not in out, out
    assert "a\\x1b[2Jb" in out and "boom \\x1b]0;owned\\x07 [/]" in out, out
