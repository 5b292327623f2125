"""The documentation's links resolve: every relative link in README.md and docs/*.md names an existing file or
folder, and every docs/*.md page that the code or pyproject.toml points readers to exists."""

from __future__ import annotations

import os
import re
from pathlib import Path

from conftest import REPO as ROOT

PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")   # [text](target "title")
FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"`[^`]*`")
DOC_PATH = re.compile(r"docs/[\w-]+\.md")
EXTERNAL = ("http://", "https://", "mailto:")
SKIPPED_DIRS = {"build", "dist", "node_modules", "__pycache__"}


def markdown_links(text: str) -> list[tuple[int, str]]:
    """(line number, target) of every inline link outside fenced code blocks and code spans; a link's text may
    wrap onto the next line."""
    prose, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            line = ""
        prose.append("" if fenced else line)
    text = CODE_SPAN.sub(lambda m: "\n" * m.group().count("\n"), "\n".join(prose))   # keeps the line numbers
    return [(text.count("\n", 0, m.start()) + 1, m.group(1)) for m in LINK.finditer(text)]


def broken_links(page: Path, root: Path = ROOT) -> list[str]:
    """'page:line: (target)' for each relative link whose file or folder (fragment stripped) does not exist."""
    broken = []
    for number, target in markdown_links(page.read_text(encoding="utf-8")):
        if target.startswith(EXTERNAL) or target.startswith("#"):
            continue
        if not (page.parent / target.split("#", 1)[0]).exists():
            broken.append(f"{page.relative_to(root)}:{number}: ({target})")
    return broken


def code_files(root: Path = ROOT) -> list[Path]:
    """The repository's .py files (hidden folders such as .venv and .git, and build outputs, left out)."""
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in SKIPPED_DIRS and not d.endswith(".egg-info")]
        found += [Path(folder) / f for f in files if f.endswith(".py")]
    return sorted(found)


def test_markdown_links_resolve():
    assert (ROOT / "README.md") in PAGES and len(PAGES) > 1
    broken = [entry for page in PAGES for entry in broken_links(page)]
    assert not broken, "links to files or folders that do not exist:\n" + "\n".join(broken)


def test_docs_pages_named_in_code_exist():
    missing = []
    for source in [*code_files(), ROOT / "pyproject.toml"]:
        for number, line in enumerate(source.read_text(encoding="utf-8").splitlines(), 1):
            missing += [f"{source.relative_to(ROOT)}:{number}: {name}" for name in DOC_PATH.findall(line)
                        if not (ROOT / name).exists()]
    assert not missing, "docs pages named in the code that do not exist:\n" + "\n".join(missing)


def test_the_check_finds_broken_links_and_skips_code_and_external_ones(tmp_path):
    (tmp_path / "there.md").write_text("x")
    (tmp_path / "folder").mkdir()
    page = tmp_path / "page.md"
    page.write_text("[ok](there.md#a) [dir](folder) [gone](missing.md#b) [web](https://x.org) [top](#top)\n"
                    "`[code](nowhere.md)` ![image](gone.png) [titled](absent.md \"a title\")\n"
                    "```\n[fenced](nowhere.md)\n```\n", encoding="utf-8")
    assert broken_links(page, tmp_path) == ["page.md:1: (missing.md#b)", "page.md:2: (absent.md)"]
