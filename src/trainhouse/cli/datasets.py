"""``trainhouse datasets add/list/show/cache/rm``: versioned data a job pins (``datasets:`` in its
spec), staged once per node. Every read has ``--json``."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from trainhouse.cli import options
from trainhouse.cli.options import Json, Url
from trainhouse.cli.render import ago, console, errors, fail, print_json

app = typer.Typer(help="Datasets: versions in any storage, pinned by jobs, staged per node.")


def _size(n: int | None) -> str:
    from trainhouse.jobfs.workdir import human_size

    return "-" if n is None else human_size(n)


def _ref(text: str) -> tuple[str, int | None]:
    name, at, version = text.partition("@")
    if not at:
        return name, None
    if not version.isdigit():
        fail(f"{text!r}: the version after '@' is a number (NAME@VERSION)")
    return name, int(version)


def _options(pairs: list[str]) -> dict[str, str]:
    found = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not key:
            fail(f"--storage-option takes KEY=VALUE, got {pair!r}")
        found[key] = value
    return found


@app.command("add")
def add(
    name: Annotated[str, typer.Argument(metavar="NAME")],
    source: Annotated[
        str, typer.Argument(metavar="SOURCE", help="A local directory or file, or a URL")
    ],
    storage_option: Annotated[
        list[str] | None,
        typer.Option(
            "--storage-option",
            help="KEY=VALUE for fsspec (endpoint_url=...); credentials come from the server's "
            "environment, never from here",
        ),
    ] = None,
    description: Annotated[str | None, typer.Option(help="What this version holds")] = None,
    copy: Annotated[
        bool, typer.Option("--copy", help="Keep a copy of a URL's files in the server's storage")
    ] = False,
    as_json: Json = False,
    url: Url = None,
) -> None:
    """Register a version of NAME: a local directory (packed and uploaded) or a URL fsspec
    reads (s3://, gs://, az://, http(s)://, file:// on a shared file system, hdfs://). The same
    content again gives the version it has."""
    from trainhouse.jobfs.workdir import human_size

    def packed(files: int, size: int) -> None:
        if not as_json:
            console.print(f"packed {files} files ({human_size(size)}); uploading and hashing...")

    with errors(), options.client(url) as c:
        added = c.add_dataset(
            name,
            source,
            storage_options=_options(storage_option or []),
            description=description,
            copy=copy,
            on_packed=packed,
        )
    if as_json:
        print_json(added)
        return
    v = added["version"]
    what = "added" if added["new"] else "unchanged: the same content is"
    console.print(
        f"{what} {v['ref']}: {v['files']} files, {_size(v['size'])}, digest {v['digest'][:12]} "
        f"({v['checksums']}); use it as datasets: {{KEY: {v['ref']}}}",
        highlight=False,
    )


@app.command("list")
def list_datasets(as_json: Json = False, url: Url = None) -> None:
    """Every dataset: versions, the newest, its size."""
    with errors(), options.client(url) as c:
        found = c.datasets()
    if as_json:
        print_json(found)
        return
    if not found:
        console.print("no datasets yet: trainhouse datasets add NAME DIRECTORY|URL")
        return
    table = Table(box=None, header_style="bold")
    for col in ("NAME", "VERSIONS", "LATEST", "SIZE", "OWNER", "CREATED"):
        table.add_column(col, overflow="fold")
    for d in found:
        latest = "-" if d["latest"] is None else str(d["latest"])
        table.add_row(
            d["name"], str(d["versions"]), latest, _size(d["size"]), d["owner"],
            ago(d["created_at"]),
        )  # fmt: skip
    console.print(table, highlight=False)


@app.command("show")
def show(
    ref: Annotated[str, typer.Argument(metavar="NAME[@VERSION]")],
    files: Annotated[int, typer.Option(help="Files of the version to list (0: none)")] = 20,
    as_json: Json = False,
    url: Url = None,
) -> None:
    """A dataset's versions, or one version: its files, size, digest, source, and the jobs
    that used it."""
    name, version = _ref(ref)
    with errors(), options.client(url) as c:
        if version is None:
            detail = c.dataset(name)
            if as_json:
                print_json(detail)
                return
            table = Table(box=None, header_style="bold")
            for col in ("VERSION", "FILES", "SIZE", "DIGEST", "SOURCE", "BY", "CREATED"):
                table.add_column(col, overflow="fold")
            for v in detail["versions"]:
                table.add_row(
                    str(v["version"]), str(v["files"]), _size(v["size"]), v["digest"][:12],
                    v["source"] or "(server)", v["created_by"], ago(v["created_at"]),
                )  # fmt: skip
            console.print(table, highlight=False)
            jobs = ", ".join(str(j) for j in detail["jobs"][:20]) or "none"
            console.print(f"used by jobs: {jobs}", highlight=False)
            return
        found = c.dataset_version(name, version)
        manifest = c.dataset_manifest(name, version) if (files or as_json) else None
    if as_json:
        print_json({**found, "manifest": manifest["files"] if manifest else []})
        return
    console.print(
        f"[bold]{found['ref']}[/]  {found['files']} files, {_size(found['size'])}\n"
        f"digest   {found['digest']} ({found['checksums']})\n"
        f"source   {found['source'] or '(the server dataset storage)'}\n"
        f"added    {ago(found['created_at'])} by {found['created_by']}\n"
        f"jobs     {', '.join(str(j) for j in found['jobs'][:20]) or 'none'}",
        highlight=False,
    )
    if manifest:
        for f in manifest["files"][:files]:
            console.print(f"  {f['path']}  {_size(f['size'])}  {f['algorithm']}:{f['digest'][:12]}")
        if len(manifest["files"]) > files:
            console.print(f"  ... {len(manifest['files']) - files} more (--files N)")


@app.command("cache")
def cache(as_json: Json = False, url: Url = None) -> None:
    """What the server machine's cache of staged versions holds: each version's bytes, last
    use, and whether a running job uses it."""
    with errors(), options.client(url) as c:
        found = c.dataset_cache()
    if as_json:
        print_json(found)
        return
    limit = "no limit" if not found["limit"] else f"limit {_size(found['limit'])}"
    console.print(f"{found['node']}: {_size(found['bytes'])} ({limit})", highlight=False)
    if not found["versions"]:
        console.print("nothing staged yet")
        return
    table = Table(box=None, header_style="bold")
    for col in ("VERSIONS", "DIGEST", "SIZE", "LAST USED", "IN USE"):
        table.add_column(col, overflow="fold")
    for v in found["versions"]:
        table.add_row(
            " ".join(v["refs"]) or "(removed)", v["digest"][:12], _size(v["size"]),
            ago(v["last_used"]), "yes" if v["in_use"] else "no",
        )  # fmt: skip
    console.print(table, highlight=False)


@app.command("rm")
def remove(
    ref: Annotated[str, typer.Argument(metavar="NAME@VERSION")],
    as_json: Json = False,
    url: Url = None,
) -> None:
    """Forget a version (refused while a queued or running job pins it)."""
    name, version = _ref(ref)
    if version is None:
        fail("name the version to remove: NAME@VERSION")
    with errors(), options.client(url) as c:
        gone = c.remove_dataset(name, version)
    if as_json:
        print_json(gone)
        return
    console.print(f"removed {gone['ref']}", highlight=False)
