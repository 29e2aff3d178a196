"""The use cases: what the server does for a caller, one module per noun, between the routes and
the store. Each takes the caller (a :class:`~trainhouse.usecases.access.Principal`), checks
that they may, does the work in one transaction, writes the audit entry and wakes the
scheduler. Routes parse, call one of these and render; they never reach the store themselves.
"""
