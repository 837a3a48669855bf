"""LICENSE, CITATION.cff and the README's methods table say what the project is."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

import hdcfl_ray
from hdcfl_ray.algorithms.registry import method_names

ROOT = Path(__file__).resolve().parent.parent


def test_license_is_mit():
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License") and "hdcfl-ray developers" in text


def test_citation_names_this_version():
    citation = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    version = re.search(r'^version = "([^"]+)"$', (ROOT / "pyproject.toml").read_text(), flags=re.MULTILINE).group(1)
    assert citation["cff-version"] == "1.2.0" and citation["message"]
    assert citation["title"] == "hdcfl-ray" and citation["type"] == "software"
    assert str(citation["version"]) == version == hdcfl_ray.__version__
    assert citation["authors"] == [{"name": "hdcfl-ray developers"}]
    assert citation["license"] == "MIT"


def test_readme_methods_table_lists_every_method_once():
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Methods") :]
    section = section[: section.index("\n## ", 1)]
    rows = re.findall(r"^\| [^|]+ \| `([a-z_0-9]+)` \| ([^|]+) \|$", section, flags=re.MULTILINE)
    assert sorted(name for name, _ in rows) == sorted(method_names())
    assert all(paper.strip() for _, paper in rows)
