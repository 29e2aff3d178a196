"""``trainhouse logs -f`` prints whole lines, each with its rank, however the ranks' texts
arrive: a rank's unfinished line waits for its end."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from trainhouse.cli.outputs import _follow_logs


class Streaming:
    """The part of the client ``_follow_logs`` uses, with the events a server sent."""

    def __init__(self, events: list[dict[str, Any]], procs: int | str = 2) -> None:
        self.events = events
        self.procs = procs

    def job(self, job_id: int) -> dict[str, Any]:
        return {"spec": {"resources": {"nodes": 1, "procs_per_node": self.procs}}}

    def stream_logs(
        self, job_id: int, *, ranks: Any, tail: Any, on_reconnect: Callable[..., None]
    ) -> Iterator[dict[str, Any]]:
        yield from self.events


def test_a_line_cut_in_two_is_printed_whole_and_no_other_rank_lands_inside_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Regression: rank 1's unfinished line was printed as it came, and rank 0's next text
    landed inside it ("[rank 1] rank 1 li[rank 0] rank 0 line 17"): CI lost a line that way."""
    events = [
        {"rank": "0", "text": "rank 0 line 16\n"},
        {"rank": "1", "text": "rank 1 line 16\nrank 1 li"},
        {"rank": "0", "text": "rank 0 line 17\n"},
        {"rank": "1", "text": "ne 17\n"},
        {"rank": "0", "text": "no newline at the end"},
        {"end": True},
    ]
    _follow_logs(Streaming(events), 7, None, None)  # type: ignore[arg-type]
    assert capsys.readouterr().out.splitlines() == [
        "[rank 0] rank 0 line 16",
        "[rank 1] rank 1 line 16",
        "[rank 0] rank 0 line 17",
        "[rank 1] rank 1 line 17",
        "[rank 0] no newline at the end",
    ]


def test_one_rank_passes_through_and_grep_keeps_whole_lines(
    capsys: pytest.CaptureFixture[str],
) -> None:
    one = [{"rank": "0", "text": "step 1 lo"}, {"rank": "0", "text": "ss 0.5\n"}, {"end": True}]
    _follow_logs(Streaming(one, procs=1), 7, None, None)  # type: ignore[arg-type]
    assert capsys.readouterr().out == "step 1 loss 0.5\n"
    _follow_logs(Streaming(one, procs="1:4"), 7, None, None, grep="loss")  # type: ignore[arg-type]
    assert capsys.readouterr().out == "[rank 0] step 1 loss 0.5\n"
