"""The README and the docs/ pages, kept true to the tree and the code.

- every relative link (markdown links and images) and every repository path
  they name in backticks or in prose (`csrc/...`, `fastloader/...`,
  `benchmarks/...`, ...) exists, and a link's `#anchor` into the README or a
  docs page names one of its headings;
- every `python -m fastloader COMMAND` they show is a command of the CLI, and
  every `--option` written after it is one that command's parser accepts (the
  parsers come from fastloader/tools/cli.py's build_parser, introspected);
- every keyword argument of a `DataLoader(...)` call in their examples is one
  `fastloader.DataLoader` accepts;
- the README stays a front page: under 320 lines, with the set-up section CI
  reads and a link to every docs page.
"""
from __future__ import annotations

import argparse
import ast
import glob
import inspect
import os
import re
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")


def _pages():
    """README.md and docs/*.md, as (path relative to ROOT, text)."""
    paths = [README] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
    out = []
    for p in paths:
        with open(p, encoding="utf-8") as f:
            out.append((os.path.relpath(p, ROOT).replace(os.sep, "/"), f.read()))
    return out


PAGES = _pages()
PAGE_IDS = [name for name, _ in PAGES]

# ---- markdown pieces ---------------------------------------------------------------

_FENCE = re.compile(r"^(```+|~~~+)([^\n`]*)\n(.*?)^\1[ \t]*$", re.M | re.S)
_INLINE = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.S)
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def fenced_blocks(text):
    """[(language, code)] of the fenced code blocks."""
    return [(m.group(2).strip().lower(), m.group(3)) for m in _FENCE.finditer(text)]


def strip_fences(text):
    """text with every fenced block blanked (line count kept)."""
    return _FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def inline_spans(text):
    """The inline code spans of text outside fenced blocks, whitespace collapsed."""
    return [" ".join(m.group(2).split()) for m in _INLINE.finditer(strip_fences(text))]


def prose(text):
    """text outside fenced blocks and inline code."""
    return _INLINE.sub(" ", strip_fences(text))


def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces -> '-'."""
    h = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
    h = h.strip().lower()
    h = re.sub(r"[^\w\- ]", "", h)
    return h.replace(" ", "-")


def anchors(text):
    out, seen = set(), {}
    for m in re.finditer(r"^#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*$", strip_fences(text), re.M):
        s = slug(m.group(1))
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else f"{s}-{n}")
    return out


# ---- (a) links and repository paths --------------------------------------------------

# folders of the repository a page may name as `folder/...`; build/ (made by
# the scripts) and absolute paths are not checked
_REPO_DIRS = ("csrc", "fastloader", "benchmarks", "scripts", "tests", "docs", "fuzz", ".ci")
_PATH_RE = r"(?:%s)/[\w.*<>/+-]*" % "|".join(re.escape(d) for d in _REPO_DIRS)
_SPAN_PATH = re.compile(r"(%s)(?:::[\w\[\]-]+)?" % _PATH_RE)          # a whole span that is a path
_PROSE_PATH = re.compile(r"(?<![\w/.`<-])(%s[\w*>/])" % _PATH_RE)     # a path in running text


def _exists(path):
    """path (relative to ROOT) exists; `*` and `<placeholder>` match any name."""
    path = path.rstrip("/") or "."
    pattern = re.sub(r"<[^>/]*>", "*", path)
    if "*" in pattern:
        return bool(glob.glob(os.path.join(ROOT, pattern)))
    return os.path.exists(os.path.join(ROOT, path))


def missing_paths(name, text):
    """The relative link targets and repository paths of one page that do not
    exist, and its links whose #anchor names no heading: a sorted list."""
    bad = set()
    here = os.path.dirname(os.path.join(ROOT, name))
    body = strip_fences(text)
    page_text = dict(PAGES)
    for m in _LINK.finditer(body):
        target = m.group(1)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
            continue
        file_part, _, frag = target.partition("#")
        full = os.path.normpath(os.path.join(here, file_part)) if file_part else os.path.join(ROOT, name)
        rel = os.path.relpath(full, ROOT).replace(os.sep, "/")
        if rel.startswith("../") or not os.path.exists(full):
            bad.add(f"link {target}")
            continue
        if frag and rel in page_text and frag.lower() not in anchors(page_text[rel]):
            bad.add(f"link {target} (no heading #{frag} in {rel})")
    for span in inline_spans(text):
        m = _SPAN_PATH.fullmatch(span)
        if m and not _exists(m.group(1)):
            bad.add(f"`{span}`")
    no_links = _LINK.sub(lambda m: m.group(0)[: m.group(0).index("](") + 1], prose(text))
    for m in _PROSE_PATH.finditer(no_links):
        p = m.group(1).rstrip(".")
        if not _exists(p):
            bad.add(p)
    return sorted(bad)


@pytest.mark.parametrize("name", PAGE_IDS)
def test_links_and_paths_exist(name):
    bad = missing_paths(name, dict(PAGES)[name])
    assert not bad, f"{name} names files or anchors that do not exist: {bad}"


def test_path_checker_catches_a_missing_file():
    text = ("See [x](docs/nope.md), `csrc/core/nope.c`, tests/nope_test.py and "
            "[y](README.md#no-such-heading); `csrc/core/engine.c` and `fastloader/` exist.\n"
            "```\ncsrc/in/a/code/block.c\n```\n")
    assert missing_paths("README.md", text) == [
        "`csrc/core/nope.c`", "link README.md#no-such-heading (no heading #no-such-heading in README.md)",
        "link docs/nope.md", "tests/nope_test.py"]


# ---- (b) command lines ------------------------------------------------------------------


@pytest.fixture(scope="module")
def cli():
    """{command: {subcommand or None: set of option strings}} from the real parsers."""
    from fastloader.tools.cli import build_parser

    def sub_action(p):
        return next((a for a in p._actions if isinstance(a, argparse._SubParsersAction)), None)

    def options(p):
        return {o for a in p._actions for o in a.option_strings}

    out = {}
    top = sub_action(build_parser())
    for cmd, p in top.choices.items():
        entry = {None: options(p)}
        sa = sub_action(p)
        if sa is not None:
            for sub, sp in sa.choices.items():
                entry[sub] = options(p) | options(sp)
        out[cmd] = entry
    return out


_INVOKE = re.compile(r"python3? -m fastloader\b(.*)")


def command_lines(text):
    """Every `python -m fastloader ...` the page shows, as (the rest of the
    line, whether the options after the command may be checked): one per line
    of a code block (up to a `#` comment) and per inline span; in prose only
    the command word is checked."""
    out = []
    for _, code in fenced_blocks(text):
        for line in code.splitlines():
            for m in _INVOKE.finditer(line):
                out.append((re.split(r"\s#", m.group(1))[0], True))
    for span in inline_spans(text):
        for m in _INVOKE.finditer(span):
            out.append((m.group(1), True))
    for m in _INVOKE.finditer(" ".join(prose(text).split())):
        out.append((m.group(1), False))
    return out


def command_problems(text, cli):
    bad = []
    for rest, check_options in command_lines(text):
        words = rest.split()
        if not words:
            continue  # `python -m fastloader` alone
        cmd = words[0].rstrip(".,;:)")
        if cmd.startswith("-") or not re.fullmatch(r"[a-z][a-z-]*", cmd):
            if cmd.isupper() or cmd.startswith(("-", "<", "[")):
                continue  # a placeholder: `python -m fastloader COMMAND --help`
            bad.append(f"python -m fastloader {cmd}: not a command word")
            continue
        if cmd not in cli:
            bad.append(f"python -m fastloader {cmd}: no such command (the CLI has {sorted(cli)})")
            continue
        accepted = cli[cmd][None]
        subs = [s for s in cli[cmd] if s is not None]
        if subs and len(words) > 1 and not words[1].startswith("-"):
            sub = words[1].rstrip(".,;:)")
            if sub in cli[cmd]:
                accepted = cli[cmd][sub]
            elif re.fullmatch(r"[a-z][a-z0-9-]*", sub):
                bad.append(f"python -m fastloader {cmd} {sub}: no such {cmd} sub-command (it has {subs})")
                continue
            else:  # a placeholder (FORMAT): any sub-command's option
                accepted = set().union(*(cli[cmd][s] for s in cli[cmd]))
        if not check_options:
            continue
        for w in words[1:]:
            m = re.match(r"(--[A-Za-z0-9][\w-]*)", w)
            if m and m.group(1) not in accepted:
                bad.append(f"python -m fastloader {cmd}: no option {m.group(1)}")
    return sorted(set(bad))


@pytest.mark.parametrize("name", PAGE_IDS)
def test_commands_and_options_exist(name, cli):
    bad = command_problems(dict(PAGES)[name], cli)
    assert not bad, f"{name} shows command lines the CLI does not accept: {bad}"


def test_command_checker_catches_a_wrong_option(cli):
    text = ("Run `python -m fastloader bench --workers 0,1 --no-such-flag` or\n"
            "```bash\npython -m fastloader pack shards a b --shard-size 1MB   # --not-checked\n"
            "python -m fastloader pack tarballs a b\n```\n"
            "and python -m fastloader frobnicate in prose.\n")
    assert command_problems(text, cli) == [
        "python -m fastloader bench: no option --no-such-flag",
        "python -m fastloader frobnicate: no such command (the CLI has %s)" % sorted(cli),
        "python -m fastloader pack tarballs: no such pack sub-command (it has %s)"
        % [s for s in cli["pack"] if s is not None],
    ]


# ---- (c) DataLoader keywords --------------------------------------------------------


@pytest.fixture(scope="module")
def loader_keywords():
    import fastloader

    params = inspect.signature(fastloader.DataLoader).parameters.values()
    assert not any(p.kind is p.VAR_KEYWORD for p in params), "DataLoader takes **kwargs: nothing to check"
    return {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def _is_dataloader(func):
    return (isinstance(func, ast.Name) and func.id == "DataLoader") or (
        isinstance(func, ast.Attribute) and func.attr == "DataLoader")


def _call_keywords(tree):
    return [k.arg for node in ast.walk(tree) if isinstance(node, ast.Call) and _is_dataloader(node.func)
            for k in node.keywords if k.arg is not None]


def _balanced_calls(s):
    """The `DataLoader(...)` substrings of s, parentheses balanced."""
    out = []
    for m in re.finditer(r"\bDataLoader\(", s):
        depth, i = 0, m.end() - 1
        while i < len(s):
            depth += {"(": 1, ")": -1}.get(s[i], 0)
            if depth == 0:
                out.append(s[m.start(): i + 1])
                break
            i += 1
    return out


def dataloader_keywords(text):
    """The keyword names given to DataLoader(...) in a page: from the python
    blocks (parsed whole where they parse, else call by call), the other code
    blocks and the inline spans (call by call)."""
    names = []
    snippets = []
    for lang, code in fenced_blocks(text):
        if lang in ("python", "py"):
            try:
                names += _call_keywords(ast.parse(textwrap.dedent(code)))
                continue
            except SyntaxError:
                pass
        snippets += _balanced_calls(code)
    for span in inline_spans(text):
        snippets += _balanced_calls(span)
    for s in snippets:
        try:
            names += _call_keywords(ast.parse(s.strip()))
        except SyntaxError:  # not Python (a placeholder inside): keyword-looking names at depth 1
            inner, depth, words = s[s.index("(") + 1: -1], 0, []
            for tok in re.finditer(r"[()\[\]{}]|([A-Za-z_]\w*)\s*=(?!=)", inner):
                if tok.group(0) in "([{":
                    depth += 1
                elif tok.group(0) in ")]}":
                    depth -= 1
                elif depth == 0:
                    words.append(tok.group(1))
            names += words
    return names


@pytest.mark.parametrize("name", PAGE_IDS)
def test_dataloader_keywords_exist(name, loader_keywords):
    bad = sorted({k for k in dataloader_keywords(dict(PAGES)[name]) if k not in loader_keywords})
    assert not bad, f"{name} passes DataLoader keywords fastloader.DataLoader does not take: {bad}"


def test_keyword_checker_reads_blocks_and_spans(loader_keywords):
    text = ("```python\nloader = fastloader.DataLoader(ds, batch_size=64,\n    num_wrokers=2)\n```\n"
            "and `DataLoader(..., worker_mode=\"process\")`, `DataLoader(ds, <your options>, seeed=0)`.\n")
    got = dataloader_keywords(text)
    assert got == ["batch_size", "num_wrokers", "worker_mode", "seeed"]
    assert sorted(set(got) - loader_keywords) == ["num_wrokers", "seeed"]


# ---- the README as a front page ---------------------------------------------------------


def test_readme_is_a_front_page():
    text = dict(PAGES)["README.md"]
    n = text.count("\n")
    assert n < 320, f"README.md has {n} lines: move detail to a docs/ page"
    linked = {os.path.normpath(m.group(1).partition("#")[0]) for m in _LINK.finditer(strip_fences(text))}
    pages = [p for p in PAGE_IDS if p.startswith("docs/")]
    unlinked = [p for p in pages if os.path.normpath(p) not in linked]
    assert not unlinked, f"README.md does not link these docs pages: {unlinked}"


def test_readme_keeps_the_set_up_section_ci_reads():
    text = dict(PAGES)["README.md"]
    m = re.search(r"^## Set-up and the two commands\n(.*?)(?=^## )", text, re.M | re.S)
    assert m, "README.md lost its '## Set-up and the two commands' section"
    code = [c for lang, c in fenced_blocks(m.group(1)) if lang == "bash"]
    commands = [line.split("#")[0].strip() for c in code for line in c.splitlines() if line.strip()]
    assert commands == ["bash scripts/demo.sh", "bash scripts/test.sh"], commands
