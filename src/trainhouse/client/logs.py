"""The client's calls about a job's logs: the ranks it has logs of, a read (a byte range, the
last lines, with timestamps, grepped), and the live stream (Server-Sent Events) that survives
a server restart. A part of :class:`trainhouse.client.Client`."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx

from trainhouse.client.base import ClientBase
from trainhouse.client.records import LogRanks
from trainhouse.core.errors import ServerUnreachable
from trainhouse.core.wire import error_from

__all__ = ["LogCalls"]


def _sse(lines: Iterator[str]) -> Iterator[tuple[str, Any]]:
    """(event, parsed JSON data) from a Server-Sent Events stream; comments are skipped."""
    kind, data = "message", list[str]()
    for line in lines:
        if not line:
            if data:
                yield kind, json.loads("\n".join(data))
            kind, data = "message", []
        elif line.startswith(":"):
            continue
        elif line.startswith("event:"):
            kind = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))


class LogCalls(ClientBase):
    """The calls about logs; :class:`~trainhouse.client.Client` has them."""

    def log_ranks(self, job_id: int) -> LogRanks:
        result: LogRanks = self._json("GET", f"/jobs/{job_id}/logs/ranks")
        return result

    def logs(
        self,
        job_id: int,
        *,
        rank: int | str = 0,
        offset: int = 0,
        tail: int | None = None,
        timestamps: bool = False,
        grep: str | None = None,
    ) -> tuple[str, int, str]:
        """(text, offset to continue from, job state). ``rank="all"``: every rank's lines
        interleaved in the order they were written, each prefixed ``[rank N]``;
        ``timestamps``: each line starts with when it was written (UTC); ``grep``: only the
        lines this regular expression matches."""
        params: dict[str, Any] = {"rank": str(rank), "offset": offset}
        if tail is not None:
            params["tail"] = tail
        if timestamps:
            params["timestamps"] = "true"
        if grep:
            params["grep"] = grep
        resp = self._request("GET", f"/jobs/{job_id}/logs", params=params)
        return (
            resp.text,
            int(resp.headers.get("X-Log-Offset", offset)),
            resp.headers.get("X-Job-State", ""),
        )

    def stream_logs(
        self,
        job_id: int,
        *,
        ranks: list[str] | None = None,
        tail: int | None = None,
        reconnect: bool = True,
        on_reconnect: Callable[[Exception], None] | None = None,
    ) -> Iterator[dict[str, Any]]:
        """Follow a job's logs live (Server-Sent Events): yields ``{"rank", "text", "offset"}``
        until the job has ended and every log is read, then ``{"end": state}``.

        A lost connection (the server restarting) is resumed from the last offsets; nothing is
        repeated or skipped. ``on_reconnect(error)`` is called once per outage.
        """
        offsets: dict[str, int] = {}
        params: dict[str, Any] = {}
        if ranks:
            params["rank"] = ranks
        if tail is not None:
            params["tail"] = tail
        delay, failing = 0.5, False
        while True:
            if offsets:
                params["from"] = ",".join(f"{r}:{o}" for r, o in offsets.items())
                params.pop("tail", None)
            try:
                with self._http.stream(
                    "GET", f"/jobs/{job_id}/logs/stream", params=params, timeout=None
                ) as resp:
                    if resp.status_code != 200:
                        resp.read()
                        raise error_from(resp, self.url)
                    failing, delay = False, 0.5
                    for kind, data in _sse(resp.iter_lines()):
                        if kind == "log":
                            offsets[data["rank"]] = int(data["offset"])
                            yield data
                        elif kind == "end":
                            yield {"end": data["state"]}
                            return
            except httpx.HTTPError as exc:
                if not reconnect:
                    raise ServerUnreachable(self.url, str(exc)) from None
                if not failing and on_reconnect is not None:
                    on_reconnect(exc)
                failing = True
            time.sleep(delay)
            delay = min(delay * 2, 5.0)
