"""``trainhouse models list/show/register/alias/download/export/delete``: the model registry.

Every read has ``--json``. ``download`` checks each file's sha256 against the registry;
``export`` downloads a version and exports it to ONNX in a child process (torch is never
imported here).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from trainhouse.cli import options
from trainhouse.cli.options import Json, Url
from trainhouse.cli.render import ago, console, download_progress, errors, fmt_value, print_json

if TYPE_CHECKING:
    from trainhouse.client.records import ModelVersion

app = typer.Typer(help="The model registry: versions a job saved, aliases, downloads.")

Ref = Annotated[str, typer.Argument(metavar="NAME@VERSION|NAME@ALIAS")]


def _metrics(values: dict[str, Any]) -> str:
    return " ".join(f"{k}={fmt_value(v)}" for k, v in sorted(values.items()))


def _signature(sig: dict[str, Any]) -> str:
    def one(spec: dict[str, Any]) -> str:
        dims = ",".join("B" if d is None else str(d) for d in spec["shape"])
        return f"{spec['name']}:{spec['dtype']}[{dims}]"

    ins = " ".join(one(s) for s in sig.get("inputs", []))
    outs = " ".join(one(s) for s in sig.get("outputs", []))
    return f"{ins} -> {outs}" if ins or outs else "-"


def _kind(version: ModelVersion) -> str:
    loader = (version.get("record") or {}).get("loader")
    return f"{version['kind']} ({loader})" if loader else str(version["kind"])


@app.command("list")
def list_models(as_json: Json = False, url: Url = None) -> None:
    """List models: versions, the newest, aliases."""
    with errors(), options.client(url) as c:
        found = c.models()
    if as_json:
        print_json(found)
        return
    if not found:
        console.print("no models yet: run.save_model(...) in a job, or trainhouse models register")
        return
    table = Table(box=None, header_style="bold")
    for col in ("NAME", "VERSIONS", "LATEST", "ALIASES", "OWNER", "CREATED"):
        table.add_column(col, overflow="fold")
    for m in found:
        aliases = " ".join(f"{a}->{v}" for a, v in sorted(m["aliases"].items())) or "-"
        latest = "-" if m["latest"] is None else str(m["latest"])
        table.add_row(
            m["name"], str(m["versions"]), latest, aliases, m["owner"], ago(m["created_at"])
        )
    console.print(table, highlight=False)


@app.command("show")
def show(
    name: Annotated[str, typer.Argument(metavar="NAME")], as_json: Json = False, url: Url = None
) -> None:
    """A model's versions with job, step, metrics, aliases, size and signature; the jobs that
    read each as an input, and what jobs' promote: decided."""
    from trainhouse.jobfs.workdir import human_size

    with errors(), options.client(url) as c:
        data = c.model(name)
    if as_json:
        print_json(data)
        return
    console.print(f"[bold]{data['model']['name']}[/]  owner {data['model']['owner']}")
    table = Table(box=None, header_style="bold")
    for col in ("VERSION", "ALIASES", "JOB", "STEP", "KIND", "SIZE", "METRICS", "SIGNATURE"):
        table.add_column(col, overflow="fold")
    for v in data["versions"]:
        table.add_row(
            str(v["version"]),
            " ".join(v["aliases"]) or "-",
            "-" if v["job_id"] is None else str(v["job_id"]),
            str(v["step"]),
            _kind(v),
            human_size(v["size"]),
            _metrics(v["metrics"]),
            _signature(v["signature"]),
        )
    console.print(table, highlight=False)
    readers = data.get("readers") or {}
    if readers:
        console.print(
            "[bold]read as an input by:[/] "
            + "  ".join(f"v{v}: jobs {', '.join(map(str, jobs))}" for v, jobs in readers.items()),
            highlight=False,
        )
    promotions = data.get("promotions") or []
    if promotions:
        console.print("[bold]promotions[/] (newest first)")
        for p in promotions[:20]:
            console.print(
                f"  {ago(p['decided_at'])}  job {p['job_id']}: {p['decision']}", highlight=False
            )


@app.command("register")
def register(
    name: Annotated[str, typer.Argument(metavar="NAME")],
    job: Annotated[int, typer.Option("--job", help="The job that saved the model")],
    step: Annotated[
        int | None,
        typer.Option("--step", help="The step it was saved (or checkpointed) at (default: newest)"),
    ] = None,
    loader: Annotated[
        str | None,
        typer.Option(
            "--loader",
            metavar="FILE.py:FUNCTION",
            help="Register the job's checkpoint instead, rebuilt by FUNCTION(state) of FILE.py "
            "in the job's workdir",
        ),
    ] = None,
    inputs: Annotated[
        list[str] | None,
        typer.Option(
            "--input",
            metavar="NAME:DTYPE[B,...]",
            help="With --loader: an input of the model, e.g. x:float32[B,1,8,8] (B the batch); "
            "serving and exports need them",
        ),
    ] = None,
    as_json: Json = False,
    url: Url = None,
) -> None:
    """Register a model a job saved (run.save_model) as a new version of NAME; with --loader,
    one of the job's checkpoints and the function of its code that rebuilds the model."""
    with errors():
        if inputs and loader is None:
            raise typer.BadParameter("--input goes with --loader (a saved model has its own)")
        with options.client(url) as c:
            version = c.register_model(name, job, step, loader=loader, inputs=inputs or None)
    if as_json:
        print_json(version)
        return
    what = f", checkpoint, loader {loader}" if loader else ""
    console.print(
        f"registered {name}@{version['version']} (job {version['job_id']}, step "
        f"{version['step']}{what})"
    )


@app.command("alias")
def alias(
    name: Annotated[str, typer.Argument(metavar="NAME")],
    version: Annotated[int, typer.Argument(metavar="VERSION")],
    alias_name: Annotated[str, typer.Argument(metavar="ALIAS")],
    as_json: Json = False,
    url: Url = None,
) -> None:
    """Point ALIAS (prod, staging, ...) at VERSION of NAME; moves it if it named another."""
    with errors(), options.client(url) as c:
        found = c.set_alias(name, alias_name, version)
    if as_json:
        print_json(found)
        return
    console.print(f"{name}@{alias_name} -> version {found['version']}")


@app.command("transfer")
def transfer(
    name: Annotated[str, typer.Argument(metavar="NAME")],
    owner: Annotated[str, typer.Argument(metavar="USER")],
    as_json: Json = False,
    url: Url = None,
) -> None:
    """Give the model NAME to USER (admins only): from then on USER (and the admins) add its
    versions, move its aliases and delete its versions."""
    with errors(), options.client(url) as c:
        model = c.transfer_model(name, owner)
    if as_json:
        print_json(model)
        return
    console.print(f"{name} now belongs to {model['owner']}")


@app.command("download")
def download(
    ref: Ref,
    dest: Annotated[Path, typer.Argument(metavar="DIR")],
    as_json: Json = False,
    url: Url = None,
) -> None:
    """Fetch a version's files into DIR/NAME-vVERSION, checking each one's sha256."""
    with (
        errors(),
        options.client(url) as c,
        download_progress(f"{ref}", quiet=as_json) as progress,
    ):
        path = c.download_model(ref, dest, progress=progress)
    if as_json:
        print_json({"path": str(path)})
        return
    console.print(f"downloaded {ref} to {path} (sha256 checked)")


@app.command("export")
def export(
    ref: Ref,
    dest: Annotated[Path, typer.Argument(metavar="DIR")],
    fmt: Annotated[
        str, typer.Option("--format", metavar="FORMAT", help="The format: onnx")
    ] = "onnx",
    workdir: Annotated[
        Path | None,
        typer.Option("--workdir", help="The job's code, for a model a loader of its code rebuilds"),
    ] = None,
    trust_code: Annotated[
        bool,
        typer.Option(
            "--trust-code",
            help="Run the loader of a model a loader rebuilds (the job's code) in this process",
        ),
    ] = False,
    force: Annotated[bool, typer.Option("--force", help="Replace existing outputs")] = False,
    as_json: Json = False,
    url: Url = None,
) -> None:
    """Export a version to ONNX: DIR/NAME-vVERSION.onnx (dynamic batch) and a JSON next to it
    (inputs, outputs, signature, source, sha256). Needs: pip install 'trainhouse\\[onnx]'."""
    with errors(), options.client(url) as c:
        if as_json:
            result = c.export_model(
                ref, dest, format=fmt, workdir=workdir, trust_code=trust_code, force=force
            )
        else:
            with console.status(f"exporting {ref} to {fmt}"):
                result = c.export_model(
                    ref, dest, format=fmt, workdir=workdir, trust_code=trust_code, force=force
                )
    if as_json:
        print_json(result)
        return
    names = f"inputs {', '.join(result['inputs'])} -> outputs {', '.join(result['outputs'])}"
    console.print(
        f"exported {result['model']}@{result['version']} to {result['path']} ({names}; "
        f"sha256 {result['sha256'][:16]}...)",
        highlight=False,
    )


@app.command("delete")
def delete(ref: Ref, url: Url = None) -> None:
    """Delete NAME@VERSION and its files; refused while an alias names it."""
    from trainhouse.core.modelfiles import parse_ref

    with errors():
        name, which = parse_ref(ref)
        if not which.isdigit():
            raise typer.BadParameter(f"delete takes NAME@VERSION (a number), got {ref!r}")
        with options.client(url) as c:
            c.delete_model_version(name, int(which))
    console.print(f"deleted {name}@{which}")
