"""Reading jobs' files for requests without tying up the API: a model registration hashes every
file of the model, a registration with a loader and ``clone --from-checkpoint`` copy a
checkpoint, and a job makes those files as large as it likes (a sparse file of a terabyte costs
it nothing). That work runs in the runtime's bounded pool (``Runtime.file_work``, a
:class:`~trainhouse.core.background.WorkPool`: ``Settings.file_workers`` at once server-wide,
``file_queue`` more waiting, 503 with ``Retry-After`` past them), never on the threads that
answer requests: the route is a coroutine that checks what it can in a thread (the caller, the
sizes against the server's caps), hands the work to the pool and awaits it on the event loop,
holding neither a thread nor a database connection meanwhile. The answer is the one it always
was (the version, the clone), once the work is done.

The work finishes what it started (the version's row, the clone's release) even if the request
that asked for it is gone, and a request made again while the same work is queued or running
(an SDK's retry after a timeout) waits for that work instead of doing it twice.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable, Hashable
from typing import TypeVar

import anyio.to_thread

from trainhouse.usecases.runtime import Runtime

__all__ = ["in_thread", "run"]

T = TypeVar("T")


async def in_thread(func: Callable[..., T], *args: object, **kwargs: object) -> T:
    """``func(*args, **kwargs)`` in a worker thread, off the event loop (as the routes' sync
    handlers run)."""
    return await anyio.to_thread.run_sync(functools.partial(func, *args, **kwargs))


async def run(rt: Runtime, key: Hashable, what: str, work: Callable[[threading.Event], T]) -> T:
    """``work`` in the pool under ``key`` (joining the piece queued or running under it),
    awaited without a thread; ServerBusy when the pool is full. The work goes on if the
    awaiting request is cancelled."""
    future = rt.file_work.submit(key, what, work)
    return await asyncio.shield(asyncio.wrap_future(future))
