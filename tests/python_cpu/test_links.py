"""Every relative link of the README, the docs pages and the results pages
resolves to a file or folder of the tree (a link to a section of a page,
page.md#heading, resolves to the page), so that a reader who follows one, in
the tree or on a page that keeps the tree's layout, never lands nowhere."""
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
LINK = re.compile(r"\]\(([^)\s]+)\)")  # [text](target), inline links


def pages():
    yield ROOT / "README.md"
    yield from sorted((ROOT / "docs").glob("*.md"))
    yield from sorted((ROOT / "results").rglob("*.md"))


def relative_targets(page):
    text = page.read_text(encoding="utf-8")
    text = re.sub(r"```.*?```", "", text, flags=re.S)  # code blocks are not links
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue  # absolute (https:, mailto:) or a section of this page
        yield target.split("#", 1)[0]


def test_every_relative_link_resolves():
    broken = [f"{page.relative_to(ROOT)}: {target}" for page in pages() for target in relative_targets(page)
              if not (page.parent / target).exists()]
    assert not broken, "links to nothing:\n" + "\n".join(broken)


def test_pages_have_links_to_check():
    assert sum(1 for page in pages() for _ in relative_targets(page)) > 100
