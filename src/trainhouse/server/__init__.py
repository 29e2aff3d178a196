"""The API server: a FastAPI app factory whose lifespan runs the scheduler loop.

``create_app`` is imported on first use, so that the CLI's client commands do not pay for
FastAPI and SQLAlchemy at start-up.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainhouse.usecases.settings import Settings

if TYPE_CHECKING:
    from trainhouse.server.app import create_app

__all__ = ["Settings", "create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from trainhouse.server.app import create_app

        return create_app
    raise AttributeError(f"module 'trainhouse.server' has no attribute {name!r}")
