"""Every document reference resolves inside the repository (issue 66 item 5): the markdown links of
every page (files and, for pages, their #anchors) and every path to a document the code cites."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGES = sorted([REPO / "README.md", REPO / "REPRODUCTION.md", *(REPO / "docs").rglob("*.md")])
CODE = sorted(p for d in ("geodml", "tests", "examples", "launch") for p in (REPO / d).rglob("*")
              if p.suffix in (".py", ".sh", ".sbatch", ".toml") and p.is_file())
LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)\)|!\[[^\]\n]*\]\(([^)\s]+)\)")
CITED = re.compile(r"(?<![\w./-])((?:docs/[\w./-]+|README|REPRODUCTION)\.md)")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    out, seen = set(), {}
    in_code = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not line.startswith("#"):
            continue
        s = slug(line.lstrip("#"))
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else f"{s}-{n}")
    return out


def test_slug_by_hand():
    assert slug(" One engine (2026-12-02)") == "one-engine-2026-12-02"
    assert slug(" `--channels-last`: channels-last convolutions") == "--channels-last-channels-last-convolutions"


def test_every_markdown_link_resolves():
    bad = []
    for page in PAGES:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for m in LINK.finditer(text):
            target = m.group(1) or m.group(2)
            if re.match(r"^[a-z]+:", target):   # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                bad.append(f"{page.relative_to(REPO)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                bad.append(f"{page.relative_to(REPO)}: {target} (no such heading)")
    assert not bad, "\n".join(bad)


def test_every_document_the_code_cites_exists():
    bad = []
    for f in [*CODE, *PAGES]:
        for m in CITED.finditer(f.read_text()):
            if not (REPO / m.group(1)).exists():
                bad.append(f"{f.relative_to(REPO)}: {m.group(1)}")
    assert not bad, "\n".join(bad)


def test_no_reference_to_a_design_document_outside_the_repository():
    here = Path(__file__).resolve()
    offenders = [str(f.relative_to(REPO)) for f in [*CODE, *PAGES] if f != here and "DESIGN" + ".md" in f.read_text()]
    assert offenders == []
    assert (REPO / "docs" / "design.md").exists()
