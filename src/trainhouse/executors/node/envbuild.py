"""Job environments: a virtual environment per distinct ``environment:`` spec, built once per
node with uv and cached by digest.

::

    CACHE/<digest>/                    a ready environment (``.trainhouse-ready`` inside)
    CACHE/<digest>/.trainhouse-used    touched whenever a job starts with it (last use)
    CACHE/.locks/<digest>.build        held (exclusive) by the one process building it
    CACHE/.locks/<digest>.use          held (shared) by every attempt using it; prune takes it
                                       exclusively, so an environment in use is never removed
    CACHE/.users/<digest>/<job>.<n>    the attempts using it (for ``trainhouse envs list``)
    CACHE/.tmp/<digest>.<pid>/         a build under way, renamed into place once complete
    CACHE/.uv-cache/                   uv's own cache of downloaded wheels

``CACHE`` is ``HOME/envs`` on the server's machine and ``envs/`` under a Ray node's directory.
The environment is built on top of the server's Python: ``uv venv`` of the server's
interpreter, with a ``.pth`` file that adds the server's site directories after the
environment's own (torch, trainhouse and the rest are visible, what the job installs comes
first), and torch and trainhouse excluded from the resolution (``uv pip install --excludes``):
they are never installed again nor shadowed; a requirement that pins torch to another version
fails the build.

The digest covers everything that changes the result: the interpreter, the base torch version,
the requirements with every ``-r``/``-c`` file expanded, ``uv.lock``, the index options (and
the files in a local ``find_links`` directory). A build runs under the digest's lock, into a
temporary directory that is renamed into place with its ready marker inside: a build killed
halfway leaves only a temporary directory, which the next build removes.

:func:`ensure` runs in the attempt's supervisor (:mod:`trainhouse.executors.node.supervise`), with
the job's privileges, its output going to the launcher's log; it imports the standard library
only (and ``uv`` to find uv's binary). The cache itself (what is ready, in use, removed past
its size) is :mod:`trainhouse.jobfs.envcache`; the request and the digest's inputs are
:mod:`trainhouse.core.envspec`.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata
import json
import os
import platform
import re
import shutil
import site
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO

from trainhouse.core.envspec import (
    BASE_PACKAGES,
    MAX_INCLUDES,
    MAX_REQUIREMENTS_BYTES,
    PYTHON_ENV,
    Inputs,
    Request,
    redact,
)
from trainhouse.core.errors import EnvBuildError
from trainhouse.jobfs.envcache import READY, USED, is_ready, lock_file, prune

__all__ = ["Ready", "digest", "ensure", "expand", "inputs"]

BASE_PTH = "_trainhouse_base.pth"
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


# -- what the digest covers ---------------------------------------------------------------------
def _read(path: Path, workdir: Path, what: str) -> str:
    """A file of the workdir (no escape through ``..`` or a link), bounded."""
    try:
        resolved = path.resolve(strict=True)
        resolved.relative_to(workdir.resolve())
    except FileNotFoundError:
        raise EnvBuildError(f"{what} {path.relative_to(workdir)} is not in the workdir") from None
    except (OSError, ValueError):
        raise EnvBuildError(f"{what} {path} is outside the workdir") from None
    if not resolved.is_file() or resolved.stat().st_size > MAX_REQUIREMENTS_BYTES:
        raise EnvBuildError(f"{what} {path.relative_to(workdir)} is not a file of at most 1 MiB")
    return resolved.read_text(errors="replace")


def _logical_lines(text: str) -> Iterator[str]:
    """Requirement lines without comments, blank lines and continuations."""
    pending = ""
    for raw in text.splitlines():
        line = raw.rstrip()
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        if line.lstrip().startswith("#"):
            continue
        line = re.sub(r"\s+#.*$", "", line).strip()
        if line:
            yield " ".join(line.split())
    if pending.strip():
        yield " ".join(pending.split())


_INCLUDE = re.compile(r"^(-r|--requirement|-c|--constraint)(?:\s+|=)(\S+)$")


def expand(path: Path, workdir: Path, *, constraint: bool = False) -> tuple[list[str], list[str]]:
    """The requirement and constraint lines of a requirements file, every ``-r`` and ``-c``
    file (relative to the including one, inside the workdir) expanded in place."""
    requirements: list[str] = []
    constraints: list[str] = []
    seen: set[Path] = set()

    def walk(file: Path, as_constraint: bool) -> None:
        if len(seen) >= MAX_INCLUDES:
            raise EnvBuildError(f"more than {MAX_INCLUDES} included requirements files")
        key = file.resolve()
        if key in seen:
            return
        seen.add(key)
        for line in _logical_lines(_read(file, workdir, "the requirements file")):
            found = _INCLUDE.match(line)
            if found is not None:
                walk(
                    file.parent / found.group(2),
                    as_constraint or found.group(1) in ("-c", "--constraint"),
                )
            else:
                (constraints if as_constraint else requirements).append(line)

    walk(path, constraint)
    return requirements, constraints


def _local_dir(entry: str, workdir: Path) -> Path | None:
    if entry.startswith("file://"):
        entry = entry.removeprefix("file://")
    elif "://" in entry:
        return None
    path = Path(entry) if os.path.isabs(entry) else workdir / entry
    return path if path.is_dir() else None


#: bytes of the local paths one environment's digest reads at most (a wheel, a package tree)
MAX_LOCAL_BYTES = 4 << 30
MAX_LOCAL_FILES = 20_000
_PATHISH = re.compile(r"^(?:\.{1,2}/|/|file:)")


def _local_paths(line: str, workdir: Path) -> list[Path]:
    """The local files and directories a requirement line names, relative to the workdir
    (where uv runs) or absolute; those that do not exist are uv's to refuse."""
    found: list[Path] = []
    for token in line.replace(" @ ", " ").split():
        if not _PATHISH.match(token):
            continue
        if token.startswith("file:"):
            token = token.removeprefix("file://").removeprefix("file:")
        path = Path(token) if os.path.isabs(token) else workdir / token
        if path.exists():
            found.append(path)
    return found


def _file_digest(path: Path) -> str:
    """A regular file's sha256 (a link, a FIFO: its kind says it, no content is read; opened
    without following a link and without waiting on a FIFO)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return "not-a-file"
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            return "not-a-file"
        if st.st_size > MAX_LOCAL_BYTES:
            raise EnvBuildError(f"{path.name} is over {MAX_LOCAL_BYTES} bytes")
        h = hashlib.sha256()
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _tree_digest(path: Path) -> str:
    """What a local path holds: a file's sha256, or every file of a directory (relative names
    and contents; links are not followed), bounded."""
    if not path.is_dir() or path.is_symlink():
        return _file_digest(path)
    h = hashlib.sha256()
    count = 0
    for root, dirs, names in os.walk(path):
        dirs.sort()
        dirs[:] = [d for d in dirs if d not in ("__pycache__", ".git")]
        for name in sorted(names):
            count += 1
            if count > MAX_LOCAL_FILES:
                raise EnvBuildError(f"{path.name} holds more than {MAX_LOCAL_FILES} files")
            full = Path(root) / name
            h.update(f"{full.relative_to(path)}\0{_file_digest(full)}\0".encode())
    return h.hexdigest()


def base_torch() -> str:
    """The server's torch version (its metadata: torch is not imported)."""
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return ""


def inputs(request: Request, workdir: Path) -> Inputs:
    """Read and normalise what ``request`` asks for from ``workdir``."""
    requirements: list[str] = []
    constraints: list[str] = []
    lock = ""
    if request.requirements is not None:
        requirements, constraints = expand(workdir / request.requirements, workdir)
    elif request.pyproject is not None:
        project = workdir / request.pyproject
        requirements = [f"pyproject: {_read(project, workdir, 'the pyproject')}"]
        if (project.parent / "uv.lock").is_file():
            lock = _read(project.parent / "uv.lock", workdir, "the lock file")
    requirements = sorted(requirements + [" ".join(p.split()) for p in request.packages])
    files: list[str] = []
    for entry in request.find_links:
        local = _local_dir(entry, workdir)
        if local is not None:
            with contextlib.suppress(OSError):
                files.extend(
                    f"{entry}/{e.name}:{_file_digest(Path(e.path))}"
                    for e in os.scandir(local)
                    if e.is_file(follow_symlinks=False)
                )
    # what a local path a requirement names holds (./pkg.whl, -e ./lib, pkg @ file:///...):
    # two jobs naming the same path with other contents are two environments
    for line in requirements + constraints:
        for path in _local_paths(line, workdir):
            files.append(f"{line} -> {path.name}:{_tree_digest(path)}")
    return Inputs(
        python=f"{platform.python_implementation()} {platform.python_version()} "
        f"{platform.machine()} {sys.base_prefix}",
        torch=base_torch(),
        requirements=requirements,
        constraints=sorted(constraints),
        lock=lock,
        index_url=request.index_url,
        extra_index_urls=list(request.extra_index_urls),
        find_links=list(request.find_links),
        find_links_files=sorted(files),
    )


def digest(request: Request, workdir: Path) -> str:
    return inputs(request, workdir).digest


# -- building -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Ready:
    """An environment ready for an attempt; ``release()`` once the attempt has ended."""

    digest: str
    path: Path
    built: bool  # False: reused
    seconds: float
    _use: IO[bytes] | None = None
    _user: Path | None = None

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    def environ(self, base: dict[str, str]) -> dict[str, str]:
        """``base`` with this environment first on PATH and named as the job's Python."""
        env = dict(base)
        env["VIRTUAL_ENV"] = str(self.path)
        env["PATH"] = os.pathsep.join([str(self.path / "bin"), base.get("PATH", os.defpath)])
        env[PYTHON_ENV] = str(self.python)
        return env

    def release(self) -> None:
        if self._user is not None:
            with contextlib.suppress(OSError):
                self._user.unlink()
        if self._use is not None:
            self._use.close()


def _uv() -> str:
    import uv

    return str(uv.find_uv_bin())


def _pyproject_lines(request: Request, workdir: Path) -> list[str]:
    """The dependencies of the environment's pyproject (none without one)."""
    if request.pyproject is None:
        return []
    import tomllib

    try:
        data = tomllib.loads(_read(workdir / request.pyproject, workdir, "the pyproject"))
    except tomllib.TOMLDecodeError as exc:
        raise EnvBuildError(f"{request.pyproject} is not TOML: {exc}") from None
    found = data.get("project", {}).get("dependencies", [])
    return [str(d) for d in found] if isinstance(found, list) else []


def _check_torch(lines: list[str], torch: str) -> None:
    """Fail on a requirement of torch the server's torch does not satisfy."""
    for line in lines:
        found = _NAME.match(line)
        if found is None or found.group(1).lower().replace("_", "-") not in BASE_PACKAGES:
            continue
        spec = line[found.end() :].split(";", 1)[0].strip()
        if not spec or found.group(1).lower() != "torch":
            continue
        try:
            from packaging.specifiers import InvalidSpecifier, SpecifierSet
        except ImportError:  # pragma: no cover - packaging is everywhere torch is
            continue
        try:
            ok = SpecifierSet(spec).contains(torch, prereleases=True) or SpecifierSet(
                spec
            ).contains(torch.split("+", 1)[0], prereleases=True)
        except InvalidSpecifier:
            continue
        if not ok:
            raise EnvBuildError(
                f"the requirement {line!r} asks for another torch than the server's ({torch}); "
                "an environment always uses the server's torch"
            )


def _uv_env(request: Request, cache: Path) -> dict[str, str]:
    """uv's environment: the index options (never on a command line others can read)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("UV_")}
    env.update({"UV_CACHE_DIR": str(cache / ".uv-cache"), "UV_NO_PROGRESS": "1"})
    if request.index_url:
        env["UV_INDEX_URL"] = request.index_url
    if request.extra_index_urls:
        env["UV_EXTRA_INDEX_URL"] = " ".join(request.extra_index_urls)
    if request.find_links:
        env["UV_FIND_LINKS"] = ",".join(request.find_links)
    return env


def _run(argv: list[str], env: dict[str, str], cwd: Path, out: Callable[[str], None]) -> None:
    """Run uv, its output (credentials redacted) line by line to ``out``; EnvBuildError with its
    last lines if it fails."""
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
    )
    lines: list[str] = []
    assert proc.stdout is not None
    for raw in proc.stdout:
        line = redact(raw.rstrip("\n"))
        lines.append(line)
        del lines[:-40]
        out(line)
    if proc.wait() != 0:
        message = "\n".join(line for line in lines if line.strip())
        raise EnvBuildError(message or f"uv exited with code {proc.returncode}")


def _base_sites() -> list[str]:
    return [p for p in site.getsitepackages() if os.path.isdir(p)]


def _build(
    request: Request, spec: Inputs, workdir: Path, tmp: Path, out: Callable[[str], None]
) -> None:
    cache = Path(request.cache)
    env = _uv_env(request, cache)
    uv = _uv()
    _run(
        [uv, "venv", "--no-config", "--relocatable", "--python", sys.executable, str(tmp)],
        env,
        workdir,
        out,
    )
    python = tmp / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    sites = ", ".join(repr(p) for p in _base_sites())
    # the server's site directories after the environment's own, their .pth files processed
    # (editable installs of trainhouse included)
    Path(purelib, BASE_PTH).write_text(f"import site; list(map(site.addsitedir, ({sites},)))\n")
    spec_dir = tmp / ".trainhouse"
    spec_dir.mkdir()
    (spec_dir / "excludes.txt").write_text("\n".join(BASE_PACKAGES) + "\n")
    args = [uv, "pip", "install", "--no-config", "--python", str(python), "--color", "never"]
    args += ["--excludes", str(spec_dir / "excludes.txt")]
    if request.pyproject is not None:
        project = (workdir / request.pyproject).parent
        if (project / "uv.lock").is_file():
            exported = spec_dir / "requirements.txt"
            _run(
                [uv, "export", "--no-config", "--frozen", "--no-hashes", "--no-emit-project",
                 "--no-header", "--project", str(project), "-o", str(exported)],
                env, workdir, out,
            )  # fmt: skip
            args += ["-r", str(exported)]
        else:
            args += ["-r", str(workdir / request.pyproject)]
        if request.packages:
            args += list(request.packages)
    else:
        (spec_dir / "requirements.txt").write_text("\n".join(spec.requirements) + "\n")
        args += ["-r", str(spec_dir / "requirements.txt")]
        if spec.constraints:
            (spec_dir / "constraints.txt").write_text("\n".join(spec.constraints) + "\n")
            args += ["-c", str(spec_dir / "constraints.txt")]
    _run(args, env, workdir, out)
    _check_resolved(Path(purelib), spec.torch)
    (spec_dir / "inputs.json").write_text(json.dumps(asdict(spec), indent=1))


def _check_resolved(purelib: Path, torch: str) -> None:
    """Every package the environment resolved to, direct or not, takes the server's torch:
    ``--excludes`` keeps torch out, and with it the constraint a torchvision built for another
    torch puts on it; such a package is refused by name, before any job imports it."""
    if not torch:
        return
    from packaging.requirements import InvalidRequirement, Requirement

    release = torch.split("+", 1)[0]
    for dist in importlib.metadata.distributions(path=[str(purelib)]):
        for text in dist.requires or []:
            try:
                req = Requirement(text)
            except InvalidRequirement:
                continue
            if req.name.lower() != "torch" or not req.specifier:
                continue
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            if req.specifier.contains(torch, prereleases=True) or req.specifier.contains(
                release, prereleases=True
            ):
                continue
            name = dist.metadata["Name"]
            raise EnvBuildError(
                f"{name} {dist.version} requires {text!r}, another torch than the server's "
                f"({torch}); an environment always uses the server's torch: pin a {name} "
                "built for it"
            )


def ensure(request: Request, workdir: Path, out: Callable[[str], None]) -> Ready:
    """The environment ``request`` asks for, built if this node has none ready (once: the
    digest's lock), marked in use until :meth:`Ready.release`. Raises EnvBuildError."""
    started = time.monotonic()
    spec = inputs(request, workdir)
    _check_torch(
        spec.requirements + spec.constraints + _pyproject_lines(request, workdir), spec.torch
    )
    key = spec.digest
    cache = Path(request.cache)
    path = cache / key
    use = lock_file(cache, f"{key}.use")
    try:
        fcntl.flock(use, fcntl.LOCK_SH)  # until release(): prune never removes it meanwhile
        user = None
        if request.job:
            users = cache / ".users" / key
            users.mkdir(parents=True, exist_ok=True)
            user = users / request.job
            user.write_text(str(os.getpid()))
        built = False
        if not is_ready(path):
            built = _build_once(request, spec, workdir, out)
        with contextlib.suppress(OSError):
            (path / USED).touch()
        seconds = time.monotonic() - started
        ready = Ready(key, path, built, seconds, use, user)
    except BaseException:
        use.close()
        raise
    if built:
        with contextlib.suppress(OSError):
            prune(cache, request.cache_size, out=out)
    return ready


def _build_once(request: Request, spec: Inputs, workdir: Path, out: Callable[[str], None]) -> bool:
    """Build under the digest's lock unless another process did meanwhile; True: built here."""
    cache = Path(request.cache)
    key = spec.digest
    path = cache / key
    with lock_file(cache, f"{key}.build") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            out(f"trainhouse: waiting for another job's build of environment {key[:12]}")
            fcntl.flock(lock, fcntl.LOCK_EX)
        if is_ready(path):
            return False
        tmp_root = cache / ".tmp"
        tmp_root.mkdir(parents=True, exist_ok=True)
        # what a killed build left: nobody else builds this digest while we hold its lock
        for entry in tmp_root.glob(f"{key}.*"):
            shutil.rmtree(entry, ignore_errors=True)
        if path.exists():
            shutil.rmtree(path, ignore_errors=True)
        tmp = tmp_root / f"{key}.{os.getpid()}"
        try:
            _build_retrying(request, spec, workdir, tmp, out)
            (tmp / READY).write_text(json.dumps({"digest": key, "built": time.time()}))
            _fsync_dir(tmp)
            os.rename(tmp, path)
            _fsync_dir(cache)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return True


#: seconds between the tries of a build that failed on the network (an index briefly down)
RETRY_DELAYS = (2.0, 8.0, 30.0)
#: what uv says when the index, not the request, failed
_TRANSIENT = re.compile(
    r"HTTP status server error|error sending request|connection (?:refused|reset|closed)|"
    r"timed out|dns error|failed to lookup address|temporary failure in name resolution|"
    r"tcp connect error|network is unreachable|request failed after \d+ retries",
    re.IGNORECASE,
)


def _build_retrying(
    request: Request, spec: Inputs, workdir: Path, tmp: Path, out: Callable[[str], None]
) -> None:
    """:func:`_build`, tried again after :data:`RETRY_DELAYS` when it failed on the network
    (a package index briefly down is no reason to fail the job for good); a failure that
    trying again cannot mend (a package that does not exist, a conflict) fails at once."""
    for delay in (*RETRY_DELAYS, None):
        try:
            _build(request, spec, workdir, tmp, out)
            return
        except EnvBuildError as exc:
            if delay is None or not _TRANSIENT.search(str(exc)):
                raise
            shutil.rmtree(tmp, ignore_errors=True)
            out(
                f"trainhouse: the environment's build failed on the network; trying again in "
                f"{delay:g} s"
            )
            time.sleep(delay)


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
