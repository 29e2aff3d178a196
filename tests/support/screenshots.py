"""The dashboard's screenshots in ``docs/img/``, taken of a real server that trained the digits
example twice: the job page, the runs table, compare and the Models page.

``make screenshots`` runs this module (``python -m tests.support.screenshots docs/img``) to keep
the README's pictures current; ``tests/browser/test_tour.py`` runs it into a temporary directory
so the generator itself never rots.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from playwright.sync_api import Page, expect, sync_playwright

from tests.support.servers import EXAMPLE, Server, assert_clean_stop, start_server

CHROMIUM = Path(os.environ.get("TRAINHOUSE_CHROMIUM", "/usr/bin/chromium"))
VIEWPORT = {"width": 1400, "height": 900}
MODEL = "digits-cnn"
# each picture: its file, the page's route, and what shows the page has loaded its data
PAGES: dict[str, tuple[str, Callable[[Page], None]]] = {}


def _page(name: str, route: str) -> Callable[[Callable[[Page], None]], Callable[[Page], None]]:
    def register(ready: Callable[[Page], None]) -> Callable[[Page], None]:
        PAGES[name] = (route, ready)
        return ready

    return register


def _charts(page: Page, at_least: int) -> None:
    """Wait until ``at_least`` plotly charts have drawn their lines."""
    page.wait_for_function(
        "n => document.querySelectorAll('.js-plotly-plot .scatterlayer .trace').length >= n",
        arg=at_least,
    )


@_page("dashboard-job.png", "#/jobs/2")
def _job(page: Page) -> None:
    expect(page.get_by_test_id("job-state")).to_have_text("COMPLETED")
    _charts(page, 2)


@_page("dashboard-runs.png", "#/jobs?columns=hparams.lr,metrics.val_acc.max,metrics.val_loss.min")
def _runs(page: Page) -> None:
    expect(page.locator("table tbody tr").first).to_be_visible()
    expect(page.get_by_text("digits-cnn").first).to_be_visible()
    expect(page.locator("td[data-field='metrics.val_acc.max']").first).not_to_be_empty()


@_page("dashboard-compare.png", "#/compare?ids=1,2")
def _compare(page: Page) -> None:
    _charts(page, 2)
    numbers = page.get_by_test_id("numbers-row").first
    expect(numbers).to_be_visible()
    numbers.scroll_into_view_if_needed()  # the numbers table in view


@_page("dashboard-models.png", f"#/models/{MODEL}")
def _models(page: Page) -> None:
    expect(page.get_by_text("prod").first).to_be_visible()


def train(server: Server, epochs: int) -> list[int]:
    """The digits example twice (two learning rates), each saving its model as a version of
    ``digits-cnn``; the second version gets the alias ``prod``."""
    ids = []
    for lr in ("0.002", "0.004"):
        job = server.cli_json(
            "submit",
            str(EXAMPLE),
            "--set",
            f"hparams.epochs={epochs}",
            "--set",
            f"hparams.lr={lr}",
            "--set",
            f"hparams.save_model={MODEL}",
            "--detach",
        )
        ids.append(int(job["id"]))
    for job_id in ids:
        final = server.wait(job_id, {"COMPLETED", "FAILED", "CANCELED"}, timeout=600)
        if final["state"] != "COMPLETED":
            raise RuntimeError(f"job {job_id} ended {final['state']}: {final}")
    result = server.cli("models", "alias", MODEL, "2", "prod")
    if result.returncode != 0:
        raise RuntimeError(result.stderr + result.stdout)
    return ids


def shoot(server: Server, out: Path) -> list[Path]:
    """One screenshot per page of :data:`PAGES`, in ``out``; the paths."""
    out.mkdir(parents=True, exist_ok=True)
    taken = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=["--no-sandbox"]
        )
        try:
            for name, (route, ready) in PAGES.items():
                context = browser.new_context(viewport=VIEWPORT, color_scheme="light")  # type: ignore[arg-type]
                page = context.new_page()
                page.set_default_timeout(60_000)
                page.goto(f"{server.url}/{route}")
                ready(page)
                time.sleep(1)  # let the charts finish their transitions
                page.screenshot(path=str(out / name))
                taken.append(out / name)
                context.close()
        finally:
            browser.close()
    return taken


def generate(out: Path, *, epochs: int = 4) -> list[Path]:
    """Start a server in a temporary home, train, take the screenshots into ``out``."""
    with tempfile.TemporaryDirectory(prefix="trainhouse-shots-") as tmp:
        server = start_server(Path(tmp) / "home", "--cpus", "4")
        try:
            train(server, epochs)
            return shoot(server, out)
        finally:
            assert_clean_stop(server)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="where the PNG files go (docs/img)")
    parser.add_argument("--epochs", type=int, default=4)
    args = parser.parse_args(argv)
    for path in generate(args.out, epochs=args.epochs):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
