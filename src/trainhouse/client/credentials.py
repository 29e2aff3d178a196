"""Where the client keeps its API tokens: one file per user, readable by that user only.

``$TRAINHOUSE_CONFIG_DIR`` or ``$XDG_CONFIG_HOME/trainhouse`` or ``~/.config/trainhouse``
holds ``credentials.json``: ``{"<server URL>": "<token>"}``, mode 0600 in a 0700 directory.
``TRAINHOUSE_TOKEN`` beats the file; an explicit ``Client(token=...)`` beats both.
"""

from __future__ import annotations

import getpass
import json
import os
import tempfile
from pathlib import Path

FILE = "credentials.json"


def current_user() -> str:
    """The name of the user running this process (what a job's owner is with auth off)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "anonymous"


def config_dir() -> Path:
    explicit = os.environ.get("TRAINHOUSE_CONFIG_DIR")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base).expanduser() / "trainhouse"


def _key(url: str) -> str:
    return url.rstrip("/")


def _read() -> dict[str, str]:
    path = config_dir() / FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def _write(data: dict[str, str]) -> Path:
    folder = config_dir()
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(folder, 0o700)
    path = folder / FILE
    # written to a 0600 temp file and renamed: the token is never readable by others, even
    # for a moment, and a crash never leaves half a file
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".credentials-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as out:
            os.fchmod(out.fileno(), 0o600)
            json.dump(data, out, indent=2, sort_keys=True)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def save_token(url: str, token: str) -> Path:
    """Remember ``token`` for the server at ``url``; returns the file it went to."""
    data = _read()
    data[_key(url)] = token
    return _write(data)


def forget_token(url: str) -> bool:
    data = _read()
    if data.pop(_key(url), None) is None:
        return False
    _write(data)
    return True


def stored_token(url: str) -> str | None:
    return _read().get(_key(url))


def find_token(url: str) -> str | None:
    """The token a client talking to ``url`` uses: TRAINHOUSE_TOKEN, else the stored one."""
    return os.environ.get("TRAINHOUSE_TOKEN") or stored_token(url)
