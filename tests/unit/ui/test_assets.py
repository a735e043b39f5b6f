"""The UI's assets ship in the package (its package-data globs cover each one) and load
nothing from elsewhere: the machine may be offline."""

from __future__ import annotations

import fnmatch
import re
import tomllib
from pathlib import Path

from tideflow.ui.app import STATIC

ROOT = Path(__file__).resolve().parents[3]


def test_every_asset_is_package_data() -> None:
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"
    ]["tideflow"]
    assets = sorted(p.relative_to(STATIC.parent.parent).as_posix() for p in STATIC.iterdir())
    assert assets, STATIC
    uncovered = [a for a in assets if not any(fnmatch.fnmatch(a, g) for g in globs)]
    assert uncovered == [], f"add them to [tool.setuptools.package-data]: {uncovered}"


def test_the_page_loads_only_its_own_assets() -> None:
    page = (STATIC / "index.html").read_text()
    for ref in re.findall(r'(?:href|src)="([^"#]+)"', page):
        assert ref.startswith("/ui/static/"), ref
        assert (STATIC / ref.removeprefix("/ui/static/")).is_file(), ref
    for asset in STATIC.iterdir():
        urls = set(re.findall(r"https?://[^\s\"'`)]+", asset.read_text()))
        assert urls <= {"http://www.w3.org/2000/svg"}, (asset.name, urls)
