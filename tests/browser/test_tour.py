"""The README's tour shows the dashboard, and the screenshots it shows can be taken again
(``make screenshots``) of a real server that trained the digits example, in real Chromium."""

from __future__ import annotations

import re
import struct
from pathlib import Path

import pytest

from tests.support import screenshots
from tests.support.servers import REPO

pytestmark = pytest.mark.browser

PNG = b"\x89PNG\r\n\x1a\n"


def png_size(path: Path) -> tuple[int, int]:
    """A PNG file's width and height, from its IHDR chunk."""
    head = path.read_bytes()[:24]
    assert head[:8] == PNG and head[12:16] == b"IHDR", f"{path} is not a PNG"
    width, height = struct.unpack(">II", head[16:24])
    return width, height


def test_the_tour_shows_the_dashboard_with_a_current_picture() -> None:
    readme = (REPO / "README.md").read_text()
    tour = readme.split("## A five-minute tour", 1)[1].split("\n## ", 1)[0]
    assert "#/jobs/1" in tour and "[Dashboard](#dashboard)" in tour
    pictures = re.findall(r"!\[[^\]]+\]\((docs/img/[\w.-]+\.png)\)", tour)
    assert pictures == ["docs/img/dashboard-job.png"]
    # every picture the README shows exists and is one the generator takes
    for picture in re.findall(r"\]\((docs/img/[\w.-]+)\)", readme):
        assert Path(picture).name in screenshots.PAGES, picture
        assert png_size(REPO / picture) == (1400, 900), picture


def test_the_screenshots_are_taken_again_of_a_real_server(tmp_path: Path) -> None:
    taken = screenshots.generate(tmp_path / "img", epochs=1)
    assert sorted(p.name for p in taken) == sorted(screenshots.PAGES)
    for path in taken:
        assert png_size(path) == (1400, 900), path
        # a page with tables and charts, not a blank or an error page: a blank 1400x900
        # screenshot compresses to a few kilobytes
        assert path.stat().st_size > 40_000, (path, path.stat().st_size)
