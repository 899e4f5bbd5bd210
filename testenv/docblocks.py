"""The shell blocks of Markdown files, read as a user reads them: the commands to type, one
by one, and the section they stand in. For the test that runs the commands the docs give
(tests/e2e/test_docs_paths.py), so that the docs cannot drift from what works. Pure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SHELL = ("sh", "bash", "shell")
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^\s`]*)")
HEADING = re.compile(r"^(?P<level>#{1,6})\s+(?P<title>.*?)\s*#*\s*$")
NOTE = re.compile(r"^\s*<!--\s*(?P<note>.*?)\s*-->\s*$")


@dataclass(frozen=True, slots=True)
class Block:
    """One fenced block: where it is, under which headings, and what it holds."""

    path: str
    line: int
    """1-based line of the opening fence."""
    sections: tuple[str, ...]
    """The headings it stands under, outermost first."""
    language: str
    text: str
    """The contents, with the fence's indentation removed."""
    note: str = ""
    """An HTML comment (`<!-- not run: ... -->`) on the last non-blank line before it."""

    @property
    def section(self) -> str:
        return self.sections[-1] if self.sections else ""

    @property
    def commands(self) -> list[str]:
        return commands(self.text)

    def where(self) -> str:
        return f"{self.path}:{self.line}"


def blocks(markdown: str, *, path: str = "", languages: tuple[str, ...] = SHELL) -> list[Block]:
    """The fenced blocks of `markdown` in one of `languages` (every block when empty)."""
    found: list[Block] = []
    headings: list[tuple[int, str]] = []
    lines = markdown.splitlines()
    index = 0
    note = ""
    while index < len(lines):
        line = lines[index]
        opening = FENCE.match(line)
        if opening is None:
            heading = HEADING.match(line)
            if heading is not None:
                level = len(heading["level"])
                headings = [(lvl, t) for lvl, t in headings if lvl < level]
                headings.append((level, heading["title"]))
            if line.strip():
                comment = NOTE.match(line)
                note = comment["note"] if comment else ""
            index += 1
            continue
        indent, fence = len(opening["indent"]), opening["fence"]
        body: list[str] = []
        index += 1
        while index < len(lines):
            closing = FENCE.match(lines[index])
            if (
                closing is not None
                and closing["fence"][0] == fence[0]
                and len(closing["fence"]) >= len(fence)
                and not closing["info"]
            ):
                break
            body.append(_dedent(lines[index], indent))
            index += 1
        language = opening["info"].lower()
        if not languages or language in languages:
            found.append(
                Block(
                    path=path,
                    line=index - len(body),
                    sections=tuple(t for _, t in headings),
                    language=language,
                    text="\n".join(body),
                    note=note,
                )
            )
        note = ""
        index += 1  # past the closing fence
    return found


def _dedent(line: str, indent: int) -> str:
    """`line` without up to `indent` leading spaces (a fence inside a list item)."""
    stripped = len(line) - len(line.lstrip(" "))
    return line[min(stripped, indent) :]


def commands(text: str) -> list[str]:
    """The commands of a shell block as a user types them: continuation lines (ending in a
    backslash) joined, blank lines and lines holding only a comment left out. A comment
    after a command is kept (the shell drops it); `without_comment` takes it off."""
    found: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.rstrip()
        if line.endswith("\\") and not line.endswith("\\\\"):
            pending += line[:-1].rstrip() + " "
            continue
        line = pending + line.strip()
        pending = ""
        if line and not line.startswith("#"):
            found.append(line)
    if pending.strip():
        found.append(pending.strip())
    return found


def without_comment(command: str) -> str:
    """`command` without a trailing `# comment`: a `#` that starts a word outside quotes."""
    quote = ""
    escaped = False
    for position, char in enumerate(command):
        if escaped:
            escaped = False
        elif char == "\\" and quote != "'":
            escaped = True
        elif quote:
            if char == quote:
                quote = ""
        elif char in "'\"":
            quote = char
        elif char == "#" and (position == 0 or command[position - 1].isspace()):
            return command[:position].rstrip()
    return command.strip()
