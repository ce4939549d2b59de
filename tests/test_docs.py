"""The documentation as a whole: README.md is a front page that reaches every page under docs/,
and every relative link between the pages lands on a file and, with a #fragment, on a heading."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import ROOT

README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md")), ROOT / "constructs_lib" / "README.md"]
README_MAX_LINES = 250
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def prose(text: str) -> str:
    """``text`` without its fenced code blocks (a ``#`` comment there is no heading)."""
    return FENCE.sub("", text)


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    headings = re.findall(r"^#{1,6} (.+)$", prose(page.read_text()), flags=re.M)
    return {anchor(h) for h in headings}


def links(page: Path) -> list[str]:
    """The relative links of ``page``'s prose (web addresses left out)."""
    found = LINK.findall(prose(page.read_text()))
    return [link for link in found if not re.match(r"[a-z]+:", link)]


def broken(page: Path, link: str) -> str | None:
    """Why ``link`` of ``page`` leads nowhere, or None."""
    path, _, fragment = link.partition("#")
    target = (page.parent / path).resolve() if path else page
    if not target.exists():
        return f"{link}: no file {target}"
    if fragment and target.suffix == ".md" and fragment not in anchors(target):
        return f"{link}: no heading #{fragment} in {target.name}"
    return None


def test_the_readme_is_a_front_page_with_the_two_commands() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= README_MAX_LINES
    assert "make synth" in text and "make test" in text
    assert "docs/architecture.svg" in text


def test_the_readme_links_every_docs_page() -> None:
    linked = {(README.parent / link.partition("#")[0]).resolve() for link in links(README)}
    assert {page.resolve() for page in DOCS.glob("*.md")} - linked == set()


def test_the_readme_keeps_no_lab_notebook() -> None:
    """History stays in git: no dates of experiments, commit ids or measured figures in prose."""
    text = prose(README.read_text())
    assert re.findall(r"\b20\d\d-\d\d(?:-\d\d)?\b", text) == []
    assert re.findall(r"\bat [0-9a-f]{7,40}\b", text) == []
    assert "tried and not kept" not in text.lower()


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_lands(page: Path) -> None:
    assert [problem for link in links(page) if (problem := broken(page, link))] == []


def test_the_link_check_finds_a_missing_page_and_a_missing_heading(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n## A `code` heading: here\n\n```bash\n# not a heading\n```\n")

    assert broken(page, "#a-code-heading-here") is None
    assert broken(page, "#not-a-heading") is not None
    assert broken(page, "other.md") is not None
