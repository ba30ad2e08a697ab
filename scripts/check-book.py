#!/usr/bin/env python3
"""Check the book's pages and every relative link, without network or installs.

    python3 scripts/check-book.py [ROOT]      # ROOT: the repository (default: this script's ../)
    python3 scripts/check-book.py --self-test # the checker against purpose-broken input

Checks, and names FILE:LINE for each problem:

- every page SUMMARY.md lists exists (a draft chapter, `[Title]()`, has no
  page and counts as missing), and every Markdown file under the book's
  source folder is listed (mdBook renders only listed pages);
- every relative link and image in the book's pages, README.md and
  CHANGELOG.md resolves to a file or folder; a link from a book page stays
  inside the book's source folder and, when it names a Markdown page, that
  page is listed in SUMMARY.md (the rendered book holds nothing else);
- every `#anchor` (on the same page or another Markdown file) names a heading
  there, by the slug GitHub and mdBook both derive from its text (lower case;
  letters, digits, `-` and `_` kept, spaces become `-`, everything else
  dropped; a repeated slug gets `-1`, `-2`, ...), or an explicit `id`/`name`.

Links inside fenced code blocks and inline code are not links. External
links (`http:`, `https:`, `mailto:`, ...) are not followed. Exits 1 when
anything is broken, 0 otherwise.
"""

import os
import re
import sys
import tempfile
from urllib.parse import unquote

FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
ATX = re.compile(r"^\s{0,3}(#{1,6})(?:\s+(.*?))?\s*$")
SETEXT = re.compile(r"^\s{0,3}(=+|-+)\s*$")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
# [text](dest "title") and ![alt](dest): dest is <...> or has no spaces.
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*(<[^>]*>|[^\s()]*(?:\([^\s()]*\)[^\s()]*)*)(?:\s+[\"'(][^)]*)?\s*\)")
REF_DEF = re.compile(r"^\s{0,3}\[([^\]]+)\]:\s*(<[^>]*>|\S+)")
REF_USE = re.compile(r"!?\[((?:[^\[\]]|\[[^\]]*\])*)\](?:\[([^\]]*)\])?")
HTML_ID = re.compile(r"""<[a-zA-Z][^>]*\s(?:id|name)\s*=\s*["']([^"']+)["']""")
HEADING_ID = re.compile(r"\s*\{#([^}\s]+)[^}]*\}\s*$")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def slug(text):
    """The anchor GitHub and mdBook give a heading with this text."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # links keep their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.replace("`", "")
    out = []
    for ch in text.strip().lower():
        if ch.isalnum() or ch in "-_":
            out.append(ch)
        elif ch.isspace():
            out.append("-")
    return "".join(out)


def code_free_lines(text, blank_inline_code=True):
    """(line number, text) of the lines outside fenced code blocks, with
    inline code blanked (unless told otherwise, as for heading text), so
    nothing in code reads as a link or heading."""
    fence = None
    for number, line in enumerate(text.split("\n"), 1):
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)[0] * len(m.group(1))
            continue
        if fence is not None:
            if m and m.group(1).startswith(fence) and not line.strip()[len(m.group(1)):].strip():
                fence = None
            continue
        if blank_inline_code:
            line = INLINE_CODE.sub(lambda c: " " * len(c.group(0)), line)
        yield number, line


class Anchors:
    """The anchors of each Markdown file, read once."""

    def __init__(self):
        self.cache = {}

    def of(self, path):
        if path not in self.cache:
            self.cache[path] = self.read(path)
        return self.cache[path]

    @staticmethod
    def read(path):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        anchors, counts, previous = set(), {}, None
        for _, line in code_free_lines(text, blank_inline_code=False):
            heading = None
            m = ATX.match(line)
            if m:
                heading = re.sub(r"\s+#+\s*$", "", m.group(2) or "")
            elif previous and previous.strip() and SETEXT.match(line) and not ATX.match(previous):
                if not re.match(r"^\s*([-*+]|\d+[.)])\s", previous) and not previous.lstrip().startswith(("|", ">")):
                    heading = previous.strip()
            anchors.update(HTML_ID.findall(line))
            if heading is not None:
                explicit = HEADING_ID.search(heading)
                if explicit:
                    anchors.add(explicit.group(1))
                    heading = heading[: explicit.start()]
                base = slug(heading)
                n = counts.get(base, 0)
                counts[base] = n + 1
                anchors.add(base if n == 0 else f"{base}-{n}")
            previous = line
        return anchors


def book_src(root):
    """The book's source folder, from docs/book.toml's `src` (default `src`)."""
    book = os.path.join(root, "docs")
    src = "src"
    toml = os.path.join(book, "book.toml")
    if os.path.exists(toml):
        with open(toml, encoding="utf-8") as f:
            m = re.search(r'^\s*src\s*=\s*"([^"]+)"', f.read(), re.M)
            if m:
                src = m.group(1)
    return os.path.normpath(os.path.join(book, src))


def links(text):
    """(line, destination) of every inline or reference link outside code.
    A link's text may run over several lines; its line is the one where its
    destination starts."""
    lines = list(code_free_lines(text))
    defs = {}
    body = []
    for number, line in lines:
        m = REF_DEF.match(line)
        if m:
            defs[m.group(1).strip().lower()] = (number, m.group(2))
            yield number, m.group(2)
            line = ""
        body.append((number, line))
    # Paragraphs of consecutive lines, joined, so a link may span lines.
    paragraph, starts = [], []
    for number, line in body + [(None, "")]:
        if line.strip() and number is not None:
            starts.append((sum(len(l) + 1 for l in paragraph), number))
            paragraph.append(line)
            continue
        joined = "\n".join(paragraph)
        line_at = lambda offset: max(n for s, n in starts if s <= offset)
        for m in INLINE_LINK.finditer(joined):
            yield line_at(m.start(1)), m.group(1)
        rest = INLINE_LINK.sub(lambda m: " " * len(m.group(0)), joined)
        for m in REF_USE.finditer(rest):
            if m.group(2) is not None:
                label = (m.group(2) or m.group(1)).strip().lower()
                if label not in defs:
                    yield line_at(m.start()), f"[{label}] (undefined reference)"
        paragraph, starts = [], []


def summary_pages(summary_path):
    """(line, link) of every chapter SUMMARY.md lists."""
    with open(summary_path, encoding="utf-8") as f:
        for number, line in code_free_lines(f.read()):
            for m in re.finditer(r"\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)]*)\)", line):
                yield number, m.group(1).strip()


def check(root):
    """Every problem, as 'file:line: message', in a stable order."""
    root = os.path.abspath(root)
    src = book_src(root)
    problems = []
    rel = lambda p: os.path.relpath(p, root)
    summary = os.path.join(src, "SUMMARY.md")
    listed = set()
    if not os.path.exists(summary):
        problems.append(f"{rel(summary)}:1: SUMMARY.md is missing")
    else:
        for number, dest in summary_pages(summary):
            target = unquote(dest.split("#")[0])
            if not target:
                problems.append(f"{rel(summary)}:{number}: draft chapter `[...]()` has no page")
                continue
            page = os.path.normpath(os.path.join(src, target))
            listed.add(page)
            if not os.path.isfile(page):
                problems.append(f"{rel(summary)}:{number}: listed page {target} does not exist")
    pages = sorted(
        os.path.join(d, f)
        for d, _, files in os.walk(src)
        for f in files
        if f.endswith(".md")
    )
    for page in pages:
        if page != summary and page not in listed and os.path.exists(summary):
            problems.append(f"{rel(page)}:1: page is not listed in SUMMARY.md (mdBook does not render it)")
    others = [os.path.join(root, n) for n in ("README.md", "CHANGELOG.md")]
    anchors = Anchors()
    # SUMMARY.md's own links were checked above, as the list of pages.
    for path in [p for p in pages if p != summary] + [p for p in others if os.path.exists(p)]:
        in_book = path.startswith(src + os.sep)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for number, dest in links(text):
            where = f"{rel(path)}:{number}"
            if dest.endswith("(undefined reference)"):
                problems.append(f"{where}: link to an undefined reference {dest.split(' ')[0]}")
                continue
            problems.extend(f"{where}: {p}" for p in check_link(path, dest, in_book, src, listed, anchors))
    return problems


def check_link(path, dest, in_book, src, listed, anchors):
    """What is wrong with one link's destination, if anything."""
    dest = dest.strip("<>")
    if not dest or SCHEME.match(dest) or dest.startswith("//"):
        return []
    target, _, anchor = dest.partition("#")
    target = unquote(target.split("?")[0])
    if not target:
        file = path
    elif target.startswith("/"):
        return [f"link `{dest}` is absolute: use a relative path"]
    else:
        file = os.path.normpath(os.path.join(os.path.dirname(path), target))
    if not os.path.exists(file):
        return [f"link `{dest}`: {target} does not exist"]
    if in_book and not (file == src or file.startswith(src + os.sep)):
        return [f"link `{dest}` leaves the book's source folder (the rendered book holds only it): name the file as code instead"]
    if in_book and file.endswith(".md") and file not in listed:
        return [f"link `{dest}`: {target} is not listed in SUMMARY.md"]
    if anchor:
        if not file.endswith(".md") or os.path.isdir(file):
            return [f"link `{dest}`: an anchor into a file that is not Markdown"]
        if unquote(anchor) not in anchors.of(file):
            return [f"link `{dest}`: no heading with the anchor #{anchor} in {os.path.basename(file)}"]
    return []


def self_test():
    """Purpose-broken input in a temporary folder: each fault is reported
    at its file and line, and a clean book passes."""
    pages = {
        "docs/book.toml": '[book]\nsrc = "src"\n',
        "docs/src/SUMMARY.md": "# Summary\n\n- [Intro](intro.md)\n- [Gone](gone.md)\n- [Draft]()\n- [Guide](guide/a.md)\n",
        "docs/src/intro.md": (
            "# Intro\n\n## Two words\n\n## Two words\n\n### `code_name` and more!\n\n"
            "[ok](guide/a.md#section-one) [ok2](#two-words-1) [ok3](#code_name-and-more)\n"
            "[bad anchor](guide/a.md#nope)\n"
            "[missing](guide/missing.md)\n"
            "```sh\n[not a link](nowhere.md)\n```\n"
            "`[not a link either](nowhere.md)` [ext](https://example.com/x.md)\n"
            "[outside](../../README.md)\n"
            "[unlisted](orphan.md)\n"
            "[ref][r1] [undefined][r2]\n\n[r1]: guide/a.md#setext-heading\n\n"
            "A link [over two\nlines](guide/a.md#no-such) here.\n"
        ),
        "docs/src/guide/a.md": "# Section one\n\nSetext heading\n--------------\n\n[back](../intro.md#two-words)\n",
        "docs/src/orphan.md": "# Orphan\n",
        "README.md": "# R\n\n[book](docs/src/intro.md#intro) [bad](docs/src/intro.md#missing) [file](scripts/none.py)\n",
        "CHANGELOG.md": "# Changelog\n\n## [Unreleased]\n\n[self](#unreleased)\n",
    }
    expected = [
        "docs/src/SUMMARY.md:4: listed page gone.md does not exist",
        "docs/src/SUMMARY.md:5: draft chapter",
        "docs/src/orphan.md:1: page is not listed in SUMMARY.md",
        "docs/src/intro.md:10: link `guide/a.md#nope`: no heading with the anchor #nope",
        "docs/src/intro.md:11: link `guide/missing.md`: guide/missing.md does not exist",
        "docs/src/intro.md:16: link `../../README.md` leaves the book's source folder",
        "docs/src/intro.md:17: link `orphan.md`: orphan.md is not listed in SUMMARY.md",
        "docs/src/intro.md:18: link to an undefined reference [r2]",
        "docs/src/intro.md:23: link `guide/a.md#no-such`: no heading with the anchor #no-such",
        "README.md:3: link `docs/src/intro.md#missing`: no heading with the anchor #missing",
        "README.md:3: link `scripts/none.py`: scripts/none.py does not exist",
    ]
    with tempfile.TemporaryDirectory() as root:
        for name, text in pages.items():
            os.makedirs(os.path.dirname(os.path.join(root, name)), exist_ok=True)
            with open(os.path.join(root, name), "w", encoding="utf-8") as f:
                f.write(text)
        got = check(root)
        failures = [e for e in expected if not any(g.startswith(e) for g in got)]
        extra = [g for g in got if not any(g.startswith(e) for e in expected)]
        # The same tree, repaired, has nothing to report.
        fixes = {
            "docs/src/SUMMARY.md": "# Summary\n\n- [Intro](intro.md)\n- [Guide](guide/a.md)\n- [Orphan](orphan.md)\n",
            "docs/src/intro.md": "# Intro\n\n## Two words\n\n[ok](guide/a.md#section-one) [ref][r1]\n\n[r1]: guide/a.md#setext-heading\n",
            "README.md": "# R\n\n[book](docs/src/intro.md#intro)\n",
        }
        for name, text in fixes.items():
            with open(os.path.join(root, name), "w", encoding="utf-8") as f:
                f.write(text)
        clean = check(root)
    for e in failures:
        print(f"self-test: expected a problem starting {e!r}, none reported", file=sys.stderr)
    for g in extra:
        print(f"self-test: unexpected problem: {g}", file=sys.stderr)
    for g in clean:
        print(f"self-test: the repaired tree still reports: {g}", file=sys.stderr)
    ok = not failures and not extra and not clean
    print(f"self-test: {len(expected)} planted problems, {'all found' if ok else 'FAILED'}")
    return 0 if ok else 1


def main(argv):
    if argv[1:] == ["--self-test"]:
        return self_test()
    if len(argv) > 2 or (len(argv) == 2 and argv[1].startswith("-")):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    root = argv[1] if len(argv) == 2 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    problems = check(root)
    for p in problems:
        print(p)
    if problems:
        print(f"check-book: {len(problems)} broken link(s) or page(s)", file=sys.stderr)
        return 1
    print(f"check-book: every page in SUMMARY.md exists and every link resolves ({os.path.relpath(book_src(root), os.path.abspath(root))})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
