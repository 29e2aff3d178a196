"""What every part of the REST API's bodies shares: the bounds of a row id and of an integer
column, the rule for text that reaches the database, and the error body."""

from __future__ import annotations

from typing import Annotated

from fastapi import Path
from pydantic import BaseModel, Field

from trainhouse.core.modelrecord import NO_NUL as NO_NUL
from trainhouse.core.reports import INT32 as INT32
from trainhouse.core.reports import INT64 as INT64

#: A row id in a URL path (``/jobs/{job_id}``, ``/tokens/{token_id}``): the database's 64-bit
#: integer range. No row has an id outside it, and PostgreSQL refuses to even compare one with
#: a BIGINT column (an error, not "no such row"), so the request is refused before it gets there.
RowId = Annotated[int, Path(ge=-INT64 - 1, le=INT64)]

#: An item of a repeatable query parameter under that rule (``?action=a&action=b``).
NulFree = Annotated[str, Field(pattern=NO_NUL)]


class ErrorBody(BaseModel):
    code: str
    message: str


class ErrorOut(BaseModel):
    error: ErrorBody
