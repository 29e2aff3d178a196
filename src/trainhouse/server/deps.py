"""What route handlers depend on: the app's :class:`~trainhouse.usecases.runtime.Runtime`."""

from __future__ import annotations

from fastapi import Request

from trainhouse.usecases.runtime import Runtime


async def runtime(request: Request) -> Runtime:
    """The app's runtime (async: a plain def dependency costs every request a hop to a
    worker thread and back)."""
    rt: Runtime = request.app.state.runtime
    return rt
