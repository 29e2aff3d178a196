"""The Python client for trainhouse's REST API (what the CLI uses too).

    from trainhouse.client import Client
    c = Client()                       # TRAINHOUSE_URL or http://127.0.0.1:8470
    job = c.submit("examples/digits/trainhouse.yaml", overrides=["hparams.epochs=2"])
    c.wait(job["id"])

Only httpx is imported up front: the spec (pydantic, YAML), the workdir packer and the
checkpoint storage helpers load with the calls that need them. What a call raises when the
server answers with an error (:class:`ClientError`, :class:`ServerUnreachable` when it does not
answer) is importable from here as from :mod:`trainhouse.errors`; what the calls return is typed
in :mod:`trainhouse.client.records`.
"""

from trainhouse.client.api import DEFAULT_URL, Client, default_url
from trainhouse.client.credentials import current_user
from trainhouse.core.errors import ClientError, ServerUnreachable

__all__ = [
    "DEFAULT_URL",
    "Client",
    "ClientError",
    "ServerUnreachable",
    "current_user",
    "default_url",
]
