"""The API server: a FastAPI app factory whose lifespan runs the scheduler loop."""

from trainhouse.server.app import create_app
from trainhouse.server.settings import Settings

__all__ = ["Settings", "create_app"]
