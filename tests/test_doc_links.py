"""Every relative link in the project's Markdown files points somewhere: the file (or folder) it
names exists, and an anchor into a Markdown file names one of that file's headings, slugged the way
GitHub slugs them. Links in fenced code blocks and inline code are not links; http(s), mailto and
other links with a scheme are not checked. Pure Python, no models."""
from __future__ import annotations

import os
import re
import unicodedata
from pathlib import Path
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parent.parent
SKIP_DIRS = {".venv", ".cache", "build", "node_modules"}

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
ATX_HEADING = re.compile(r"^ {0,3}#{1,6}(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
SETEXT_UNDERLINE = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)
# [text](target "title"), with one level of brackets allowed inside the text; ![alt](...) too.
INLINE_LINK = re.compile(r"\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>\n]*>|[^)\s]+)(?:\s+(?:\"[^\"]*\"|'[^']*'))?\s*\)")
REFERENCE_DEFINITION = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(<[^>\n]*>|\S+)")
HTML_ANCHOR = re.compile(r"<a\s[^>]*\b(?:id|name)\s*=\s*[\"']([^\"']+)[\"']", re.I)
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading's text (github-slugger, without the duplicate count):
    lowercase, every character but letters, digits, marks, spaces, '-' and '_' removed, each space
    a '-'."""
    kept = []
    for ch in heading.strip().lower():
        if ch == " ":
            kept.append("-")
        elif ch in "-_" or unicodedata.category(ch)[0] in "LNM":
            kept.append(ch)
    return "".join(kept)


def heading_text(raw: str) -> str:
    """The text GitHub renders for a heading's Markdown: code spans, links and tags reduced to
    their text."""
    text = CODE_SPAN.sub(lambda m: m.group(2), raw)
    text = re.sub(r"!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"</?[A-Za-z][^>]*>", "", text)
    return text


def prose_lines(text: str) -> list[str]:
    """The file's lines with fenced code blocks blanked out (so line numbers stay)."""
    out, fence = [], None
    for line in text.split("\n"):
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)
            out.append("")
        elif fence is not None:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) and not line.strip().lstrip(fence[0]):
                fence = None
            out.append("")
        else:
            out.append(line)
    return out


def anchors_of(path: Path) -> set[str]:
    """Every anchor a Markdown file has: its headings' slugs (duplicates numbered -1, -2, ... as
    GitHub numbers them) and the ids of its HTML anchors."""
    lines = prose_lines(path.read_text(encoding="utf-8"))
    headings = []
    for i, line in enumerate(lines):
        m = ATX_HEADING.match(line)
        if m:
            headings.append(m.group(1) or "")
        elif (SETEXT_UNDERLINE.match(line) and i > 0 and lines[i - 1].strip()
              and not ATX_HEADING.match(lines[i - 1]) and not SETEXT_UNDERLINE.match(lines[i - 1])):
            headings.append(lines[i - 1].strip())
    anchors, occurrences = set(), {}
    for raw in headings:
        base = slug = github_slug(heading_text(raw))
        while slug in occurrences:
            occurrences[base] += 1
            slug = f"{base}-{occurrences[base]}"
        occurrences[slug] = 0
        anchors.add(slug)
    for line in lines:
        anchors.update(HTML_ANCHOR.findall(line))
    return anchors


def links_of(path: Path) -> list[tuple[int, str]]:
    """(line number, target) of every link in a Markdown file, outside code."""
    out = []
    for number, line in enumerate(prose_lines(path.read_text(encoding="utf-8")), 1):
        line = CODE_SPAN.sub(lambda m: "`" + "x" * len(m.group(2)) + "`", line)
        targets = INLINE_LINK.findall(line) + REFERENCE_DEFINITION.findall(line)
        out.extend((number, t[1:-1] if t.startswith("<") else t) for t in targets)
    return out


def markdown_files() -> list[Path]:
    files = []
    for folder, dirs, names in os.walk(ROOT):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith("."))
        files.extend(Path(folder) / n for n in sorted(names) if n.endswith(".md"))
    return files


def broken_links() -> list[str]:
    anchors: dict[Path, set[str]] = {}
    broken = []
    for md in markdown_files():
        for number, target in links_of(md):
            if SCHEME.match(target):
                continue
            where = f"{md.relative_to(ROOT)}:{number}: ({target})"
            path_part, _, anchor = target.partition("#")
            path_part = unquote(path_part.split("?")[0])
            if not path_part:
                dest = md
            elif path_part.startswith("/"):
                dest = ROOT / path_part.lstrip("/")
            else:
                dest = md.parent / path_part
            dest = Path(os.path.normpath(dest))
            if not dest.exists():
                broken.append(f"{where} no such file")
                continue
            if anchor and dest.suffix == ".md" and dest.is_file():
                if dest not in anchors:
                    anchors[dest] = anchors_of(dest)
                if unquote(anchor) not in anchors[dest]:
                    broken.append(f"{where} no heading #{anchor} in {dest.relative_to(ROOT)}")
    return broken


def test_slugs_follow_github():
    assert github_slug("Where things stand (2026-12-05)") == "where-things-stand-2026-12-05"
    assert github_slug(heading_text("sps loop vs `llama-speculative-simple`, CPU (2026-12-01)")) \
        == "sps-loop-vs-llama-speculative-simple-cpu-2026-12-01"
    assert github_slug(heading_text("A draft that declines its tokens (`--draft-p-min`), adaptive lengths")) \
        == "a-draft-that-declines-its-tokens---draft-p-min-adaptive-lengths"
    assert github_slug("The LoRA arbiter's pass; 1.5 epochs & more") == "the-lora-arbiters-pass-15-epochs--more"
    assert github_slug("Gemma 3 270M <- SmolLM2 snake_case") == "gemma-3-270m---smollm2-snake_case"
    assert github_slug("  Ünïcode lettres é  ") == "ünïcode-lettres-é"


def test_duplicate_headings_are_numbered(tmp_path):
    md = tmp_path / "dup.md"
    md.write_text("# Title\n\n## Run\n\n```\n## Run\n```\n\n## Run\n\n## Run-1\n\nSetext\n---\n", encoding="utf-8")
    assert anchors_of(md) == {"title", "run", "run-1", "run-1-1", "setext"}


def test_links_outside_code_only(tmp_path):
    md = tmp_path / "links.md"
    md.write_text("[a](x.md#h) `[b](y.md)` ![c](<img one.png> \"t\")\n```\n[d](z.md)\n```\n[e]: ref.md\n",
                  encoding="utf-8")
    assert [t for _, t in links_of(md)] == ["x.md#h", "img one.png", "ref.md"]


def test_every_relative_link_resolves():
    broken = broken_links()
    assert not broken, "broken links:\n" + "\n".join(broken)
