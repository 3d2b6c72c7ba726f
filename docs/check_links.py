"""Check that every relative link and #anchor in the project's Markdown resolves.

    python docs/check_links.py                 # docs/, README.md, CHANGELOG.md, benchmarks/
    python docs/check_links.py docs/foo.md     # just these files or folders

Checks inline links and images (`[text](target)`, `![alt](target)`) and reference definitions
(`[name]: target`) outside code blocks and code spans. A link to another site (http, https,
mailto) is not followed. A relative target must name a file in the repository; its #anchor must
name a heading of that file (as Python-Markdown's toc extension, which mkdocs uses, or GitHub
spells it) or an explicit `id="..."`. Prints one line per broken link; exits 1 if any.
"""

from __future__ import annotations

import re
import sys
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = ["docs", "README.md", "CHANGELOG.md", "benchmarks"]

FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"(`+).*?\1")
INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
REFDEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
EXPLICIT_ID = re.compile(r"""\bid=["']([^"']+)["']""")


def heading_text(raw: str) -> str:
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", raw)  # links: their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML tags
    return text.replace("`", "").replace("*", "").replace("&amp;", "&")


def slug_markdown(text: str) -> str:
    """Python-Markdown's toc.slugify (what mkdocs renders)."""
    value = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    value = re.sub(r"[^\w\s-]", "", value).strip().lower()
    return re.sub(r"[-\s]+", "-", value)


def slug_github(text: str) -> str:
    """GitHub's heading ids (what the repository's web view renders)."""
    value = text.strip().lower()
    value = re.sub(r"[^\w\- ]", "", value)
    return value.replace(" ", "-")


def lines_outside_code(path: Path):
    fenced = False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield number, line


_anchor_cache: dict[Path, set[str]] = {}


def anchors_of(path: Path) -> set[str]:
    if path in _anchor_cache:
        return _anchor_cache[path]
    found: set[str] = set()
    seen: dict[str, int] = {}
    for _, line in lines_outside_code(path):
        found.update(EXPLICIT_ID.findall(line))
        match = HEADING.match(line)
        if not match:
            continue
        text = heading_text(match.group(2))
        for slug in {slug_markdown(text), slug_github(text)}:
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            found.add(slug if count == 0 else f"{slug}_{count}")  # mkdocs
            found.add(slug if count == 0 else f"{slug}-{count}")  # GitHub
    _anchor_cache[path] = found
    return found


def targets(path: Path):
    # A link's text may run over a line break: match over the whole text with the code blanked.
    lines = path.read_text(encoding="utf-8").splitlines()
    kept = dict(lines_outside_code(path))
    bare = [CODE_SPAN.sub("", kept[n]) if n in kept else "" for n in range(1, len(lines) + 1)]
    text = "\n".join(bare)
    for match in INLINE.finditer(text):
        yield text.count("\n", 0, match.start()) + 1, match.group(1)
    for number, line in enumerate(bare, 1):
        ref = REFDEF.match(line)
        if ref:
            yield number, ref.group(1)


def check(path: Path) -> list[str]:
    problems = []
    for number, target in targets(path):
        if not target or re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):
            continue  # another site, mailto:, or an empty link
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        where = f"{path.relative_to(ROOT)}:{number}: {target}"
        if not dest.exists():
            problems.append(f"{where}: no such file")
            continue
        try:
            dest.relative_to(ROOT)
        except ValueError:
            problems.append(f"{where}: outside the repository")
            continue
        if anchor and dest.suffix == ".md" and anchor not in anchors_of(dest):
            problems.append(f"{where}: no heading or id #{anchor} in {dest.relative_to(ROOT)}")
    return problems


def markdown_files(args: list[str]):
    for arg in args or DEFAULT:
        path = (ROOT / arg).resolve() if not Path(arg).is_absolute() else Path(arg)
        if path.is_dir():
            yield from sorted(p for p in path.rglob("*.md") if "site" not in p.parts)
        elif path.exists():
            yield path


def main(argv: list[str]) -> int:
    problems = [problem for path in markdown_files(argv) for problem in check(path)]
    for problem in problems:
        print(problem)
    checked = len(list(markdown_files(argv)))
    print(f"{checked} files, {len(problems)} broken links", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
