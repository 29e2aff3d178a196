"""What the use cases let through from the layers below that the HTTP side must name without
importing those layers: the database refusing a value a request carried (too long for its
column, out of its range, a NUL character) that validation let by. The REST API and the MLflow
API answer it as a refused value (422, or MLflow's ``INVALID_PARAMETER_VALUE``), never a 5xx a
client would retry. trainhouse's own errors are :mod:`trainhouse.core.errors`."""

from __future__ import annotations

from sqlalchemy.exc import DataError

__all__ = ["Unstorable"]

#: what the database raises for a value it cannot store
Unstorable = DataError
