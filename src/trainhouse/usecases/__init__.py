"""The use cases: what the server does for a caller, one module per noun, between the routes and
the store (Prefect's ``api/`` over ``models/`` is the model).

Each use case is a function ``verb(rt, p, ...)`` of its noun's module (``jobs.cancel(rt, p,
job)``): ``rt`` the :class:`~trainhouse.usecases.runtime.Runtime`, ``p`` the caller (a
:class:`~trainhouse.usecases.access.Principal`, with the address the request came from). It
checks that ``p`` may, does the work in one transaction (``with rt.store.transaction():``, which
the repositories' own transactions join) with its audit entry (:func:`.audit.record`), and wakes
the scheduler (or the search runner) after the commit when the queue changed. It returns domain
records (:mod:`trainhouse.core.records`) or plain data; the routes parse a request, call one use
case and render its answer as a response model; they never reach the store, the scheduler or
the files themselves (``tests/unit/test_layers.py`` and the import contracts check it).

The rules every submit path shares are :mod:`.submission`; who a token names is
:mod:`.callers`; what a caller may do is :mod:`.access`.
"""
