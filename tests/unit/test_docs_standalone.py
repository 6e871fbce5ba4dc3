"""The documentation stands alone: nothing in the repository points outside it.

Every file of ``src/``, ``docs/``, ``tests/``, ``bench/`` and ``examples/``, and
``README.md`` and ``CONTRIBUTING.md``, is read as text: none may name a file that a
clone lacks (the specification documents the project was first written from, or a
folder beside the repository), and no markdown link may lead out of the repository.
Every relative link of a markdown page must reach an existing file (its anchor is not
checked here; ``mkdocs build --strict`` checks anchors of the docs site). Citations
of a page in code name its path from the repository's root
(``docs/design.md, <section>``), and that file exists. The docs site's navigation
(``mkdocs.yml``) lists every page of ``docs/``, and every page it lists exists.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCANNED_DIRS = ("src", "docs", "tests", "bench", "examples")
SCANNED_FILES = ("README.md", "CONTRIBUTING.md")
SKIPPED_DIRS = {"__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache", "results"}

# Written in pieces, so that this file does not name them itself.
FORBIDDEN = (
    "../" + "shared",
    "/work/" + "shared",
    "python-api" + ".md",
    "schema-reference" + ".txt",
    "postgres-architecture" + ".txt",
    "engine-design" + ".txt",
    "engine-design" + ",",
)

# [text](target) or ![alt](target), with an optional title; and [label]: target.
INLINE_LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_LINK = re.compile(r"^\s{0,3}\[[^\]\n]+\]:\s+<?(\S+?)>?(?:\s.*)?$", re.MULTILINE)
FENCE = re.compile(r"^([ \t]*)(```|~~~)[^\n]*\n.*?^\1\2[ \t]*$", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`[^`\n]*`")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
# A page cited in code: "docs/design.md, Pause" or "(CONTRIBUTING.md)".
CITATION = re.compile(r"(?<![\w/.-])([\w/.-]+\.md)(?=,\s|\))")


def scanned() -> Iterator[Path]:
    """Every text file the documentation rules apply to."""
    for name in SCANNED_DIRS:
        for path in sorted((ROOT / name).rglob("*")):
            if path.is_file() and not SKIPPED_DIRS & set(path.relative_to(ROOT).parts):
                yield path
    for name in SCANNED_FILES:
        yield ROOT / name


def text_of(path: Path) -> str | None:
    """The file's text, or None for a binary file (an image, a compiled file)."""
    data = path.read_bytes()
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def prose(markdown: str) -> str:
    """``markdown`` without its fenced code blocks and inline code spans."""
    return INLINE_CODE.sub("", FENCE.sub("", markdown))


def link_targets(text: str) -> list[str]:
    """The targets of the markdown links in ``text``."""
    return INLINE_LINK.findall(text) + REFERENCE_LINK.findall(text)


def local_target(target: str) -> str | None:
    """The file part of a link that points at a file, else None (a URL, an anchor)."""
    if SCHEME.match(target) or target.startswith("#"):
        return None
    return target.split("#", 1)[0].split("?", 1)[0] or None


def leaves_repository(source: Path, target: str) -> bool:
    """Whether the link ``target`` written in ``source`` leads out of the repository."""
    if target.startswith(("/", "~")):
        return True
    resolved = (source.parent / target).resolve()
    return not resolved.is_relative_to(ROOT)


def relative(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def test_the_scan_covers_the_documentation() -> None:
    """The scan reads the pages and modules the rules are about (a scan that found no
    file would pass every other test here)."""
    names = {relative(path) for path in scanned()}
    assert {"README.md", "CONTRIBUTING.md", "docs/decisions.md", "docs/design.md"} <= names
    assert "src/cyclone/client.py" in names
    assert "tests/unit/test_docs_standalone.py" in names


def test_nothing_names_a_file_outside_the_repository() -> None:
    """No file names the folder beside the repository or the documents kept there."""
    found: list[str] = []
    for path in scanned():
        text = text_of(path)
        if text is None:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            found.extend(f"{relative(path)}:{number}: {word}" for word in FORBIDDEN if word in line)
    assert found == []


def test_citations_name_files_of_the_repository() -> None:
    """Outside the markdown pages, a page is cited by its path from the repository's
    root (``docs/design.md, Pause``, ``(CONTRIBUTING.md, Conventions)``), and that
    file exists: a bare name reads as a file beside the citing one, and a page that is
    not in the repository cannot be read from a clone."""
    found: list[str] = []
    for path in scanned():
        if path.suffix == ".md" or path == Path(__file__).resolve():
            continue  # pages link by relative paths (checked below); this file's samples
        text = text_of(path)
        if text is None:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            found.extend(
                f"{relative(path)}:{number}: {name}"
                for name in CITATION.findall(line)
                if not (ROOT / name).is_file()
            )
    assert found == []


def test_no_markdown_link_leaves_the_repository() -> None:
    """No markdown link, in a page or in a docstring, leads to a path outside the
    repository (an absolute path, or a relative one that climbs out of it)."""
    found: list[str] = []
    for path in scanned():
        text = text_of(path)
        if text is None:
            continue
        for target in link_targets(prose(text) if path.suffix == ".md" else text):
            local = local_target(target)
            if local is not None and leaves_repository(path, local):
                found.append(f"{relative(path)}: {target}")
    assert found == []


@pytest.mark.parametrize(
    "page",
    [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))],
    ids=relative,
)
def test_relative_links_reach_existing_files(page: Path) -> None:
    """Every relative link of README.md and of each docs/ page reaches a file or folder
    of the repository."""
    missing: list[str] = []
    for target in link_targets(prose(page.read_text("utf-8"))):
        local = local_target(target)
        if local is not None and not (page.parent / local).exists():
            missing.append(target)
    assert missing == []


def nav_pages() -> list[str]:
    """The pages mkdocs.yml's ``nav`` lists, relative to docs/."""
    text = (ROOT / "mkdocs.yml").read_text("utf-8")
    nav = text[text.index("\nnav:") :]
    return re.findall(r":\s+(\S+\.md)\s*$", nav, re.MULTILINE)


def test_the_site_navigation_lists_every_page() -> None:
    """Every markdown page of docs/ is in the site's navigation, and every page the
    navigation lists exists (the docs build fails on one that does not)."""
    docs = ROOT / "docs"
    pages = {
        relative(path).removeprefix("docs/")
        for path in docs.rglob("*.md")
        if "hooks" not in path.relative_to(docs).parts
    }
    listed = nav_pages()
    assert sorted(set(listed)) == sorted(listed), "a page is listed twice"
    assert sorted(pages - set(listed)) == []
    assert sorted(set(listed) - pages) == []


def test_the_checks_catch_what_they_look_for(tmp_path: Path) -> None:
    """The link and word checks find a link out of the repository, a missing file and
    each forbidden name (they would otherwise pass by finding nothing)."""
    page = ROOT / "docs" / "index.md"
    text = "[a](../../elsewhere.md) [b](missing.md#x) `[c](../../code.md)` [d](https://x.org)"
    targets = link_targets(prose(text))
    assert targets == ["../../elsewhere.md", "missing.md#x", "https://x.org"]
    assert leaves_repository(page, "../../elsewhere.md")
    assert leaves_repository(page, "/etc/passwd")
    assert not leaves_repository(page, "../README.md")
    assert local_target("https://x.org") is None
    assert local_target("#anchor") is None
    assert local_target("missing.md#x") == "missing.md"
    assert not (page.parent / "missing.md").exists()
    assert REFERENCE_LINK.findall("[label]: ../../out.md\n") == ["../../out.md"]
    fenced = "before\n```python\n[e](../../in_code.md)\n```\nafter [f](g.md)\n"
    assert link_targets(prose(fenced)) == ["g.md"]
    assert CITATION.findall("(decisions.md, Jobs) (docs/design.md) see.md; x.md``") == [
        "decisions.md",
        "docs/design.md",
    ]
    binary = tmp_path / "image.png"
    binary.write_bytes(b"\x89PNG\0\0")
    assert text_of(binary) is None


def code_blocks(markdown: str) -> list[str]:
    """The fenced code blocks of ``markdown``, each with its info string."""
    return [match.group(0) for match in FENCE.finditer(markdown)]


def test_the_tutorial_page_runs_the_readme_code() -> None:
    """docs/tutorial.md shows the README's tutorial: every code block of the page is a
    code block of README.md, so that the page never drifts from the README, whose
    snippets the tests run."""
    readme = code_blocks((ROOT / "README.md").read_text("utf-8"))
    tutorial = code_blocks((ROOT / "docs" / "tutorial.md").read_text("utf-8"))
    assert len(tutorial) >= 5
    assert [block for block in tutorial if block not in readme] == []
