"""The client's calls about hyperparameter searches: submit one (a spec with a ``search:``
block), list them, show one with its trials, its best trial, cancel it. A part of
:class:`trainhouse.client.Client`."""

from __future__ import annotations

from pathlib import Path

from trainhouse.client.base import ClientBase, load_and_pack
from trainhouse.client.records import Search, SearchBest, SearchDetail, SearchList

__all__ = ["SearchCalls"]


class SearchCalls(ClientBase):
    """The calls about searches; :class:`~trainhouse.client.Client` has them."""

    def submit_search(
        self,
        spec_file: str | Path,
        *,
        overrides: list[str] | None = None,
        owner: str | None = None,
    ) -> Search:
        """Submit a spec with a ``search:`` block; returns the new search."""
        spec, packed = load_and_pack(spec_file, overrides)
        result: Search = self._post_packed(spec, packed, owner, "/searches")
        return result

    def searches(self, *, all: bool = False) -> list[Search]:
        page: SearchList = self._json("GET", "/searches", params={"all": str(all).lower()})
        return page["searches"]

    def search(self, search_id: int) -> SearchDetail:
        result: SearchDetail = self._json("GET", f"/searches/{search_id}")
        return result

    def search_best(self, search_id: int) -> SearchBest:
        result: SearchBest = self._json("GET", f"/searches/{search_id}/best")
        return result

    def cancel_search(self, search_id: int) -> Search:
        result: Search = self._json("POST", f"/searches/{search_id}/cancel")
        return result
