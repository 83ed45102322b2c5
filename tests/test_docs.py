"""The README and docs/ as a user meets them: every link resolves inside the repository, and every
command shown runs.

Commands are taken from fenced ``sh`` blocks, indented code blocks and inline code that starts with a
command (``mkctl``, ``kubectl``, ``make``, ...). Those that need no running federation run for real
(``mkctl settings`` regenerates docs/CONFIGURATION.md's tables into a copy, which must not change);
those that do get their ``--help`` with the same words, so a sub-command or flag that does not exist
fails here; a path into the repository they name must exist. ``mkctl`` runs in-process (fast);
``kubectl`` as the installed binary (skipped where it is not). The handover guide's blocks are played
for real against the demo by ``tests/e2e/test_handover_guide.py``, and ``make demo`` / ``make test`` by
running them.
"""

from __future__ import annotations

import contextlib
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import typer.main
from typer.testing import CliRunner

from mkctl.main import app

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
GUIDE_SECTION = "## The guide, in the demo"
"""docs/HANDOVER.md's guide: played for real by tests/e2e/test_handover_guide.py."""
PROGRAMS = ("mkctl ", ".venv/bin/mkctl ", "kubectl ", "make ", "createdb ", "python -m ", "pytest ", "MKD_TEST_")
RUN_FOR_REAL = {("settings",), ("keys", "generate"), ("--version",)}
"""mkctl commands that need no federation: run as shown (in a scratch directory)."""


@dataclass(frozen=True)
class Shown:
    page: str
    line: int
    text: str
    block: bool = False
    """Shown in a code block (to be typed), not named inline in prose."""

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {self.text}"


def _without_guide(page: Path, text: str) -> str:
    if page.name != "HANDOVER.md" or GUIDE_SECTION not in text:
        return text
    head, _, rest = text.partition(GUIDE_SECTION)
    guide, sep, tail = rest.partition("\n## ")
    return head + "\n" * (guide.count("\n") + 1) + sep + tail  # line numbers kept


def _is_command(line: str) -> bool:
    return (line + " ").startswith(PROGRAMS)


def commands(page: Path) -> list[Shown]:
    """Every command shown on ``page``: code blocks (fenced sh/bash/console, or indented) and inline code."""
    text = _without_guide(page, page.read_text(encoding="utf-8"))
    lines = text.splitlines()
    found: list[Shown] = []
    fence: str | None = None
    pending = ""
    start = 0
    for n, raw in enumerate(lines, 1):
        stripped = raw.strip()
        if stripped.startswith("```"):
            fence = None if fence is not None else (stripped[3:].strip() or "text")
            continue
        in_block = (fence in ("sh", "bash", "console", "shell")) or (fence is None and raw.startswith("    ") and (
            bool(pending) or not raw.lstrip().startswith(("-", "|", "*"))))
        if fence is not None and not in_block:
            continue
        if in_block:
            line = stripped.removeprefix("$ ")
            if pending:
                line, pending = pending + " " + line, ""
            elif not _is_command(line):
                continue  # output, YAML under a heredoc, prose continued
            else:
                start = n
            if line.endswith("\\"):
                pending = line[:-1].strip()
                continue
            found.append(Shown(page.name, start, _uncomment(line), block=True))
            continue
        for span in re.findall(r"`([^`]+)`", raw):
            if _is_command(span + " ") and " " in span:
                found.append(Shown(page.name, n, span.strip()))
    return found


def _uncomment(line: str) -> str:
    """The command without a trailing ``# comment`` (outside quotes)."""
    try:
        words = shlex.split(line, comments=True)
    except ValueError:
        return line
    return shlex.join(words)


def all_commands() -> list[Shown]:
    return [one for page in PAGES for c in commands(page) for one in expand(c)]


def expand(shown: Shown) -> list[Shown]:
    """A synopsis as prose writes it, as the commands it stands for: ``list|show`` and ``a/b/c`` (a
    sub-command) are alternatives, ``[--flag X]`` is shown with its flag, ``…`` is left out."""
    if not any(mark in shown.text for mark in ("|", "[", "…")) and not re.search(r"^mkctl [a-z]+/", shown.text):
        return [shown]
    words = [w for w in shown.text.replace("[", " ").replace("]", " ").split() if w != "…"]
    choices: list[list[str]] = []
    for i, w in enumerate(words):
        if "|" in w:
            choices.append(w.split("|"))
        elif i == 1 and re.match(r"^[a-z]+(/[a-z]+)+$", w):
            choices.append(w.split("/"))
        else:
            choices.append([w])
    out = [[]]  # type: list[list[str]]
    for options in choices:
        out = [[*o, c] for o in out for c in options]
    return [Shown(shown.page, shown.line, " ".join(o), shown.block) for o in out]


# --- links ---------------------------------------------------------------------------------------------


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    return {_slug(m) for m in re.findall(r"^#{1,6} (.+)$", page.read_text(encoding="utf-8"), flags=re.M)}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_resolves_inside_the_repository(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    assert "../shared" not in text, f"{page.name} points outside the repository (../shared)"
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"^[a-z]+:", target):
            continue  # http(s), mailto: not ours to check offline
        path, _, anchor = target.partition("#")
        where = (page.parent / path).resolve() if path else page
        if not where.is_relative_to(ROOT) or not where.exists():
            broken.append(f"{target}: {where} is not in the repository")
        elif anchor and where.suffix == ".md" and anchor not in _anchors(where):
            broken.append(f"{target}: {where.name} has no heading #{anchor}")
    assert not broken, f"{page.name}: " + "; ".join(broken)


# --- commands ------------------------------------------------------------------------------------------


def test_the_pages_show_commands() -> None:
    shown = all_commands()
    assert len(shown) > 40, [str(c) for c in shown]
    assert any(c.text == "make demo" for c in shown) and any(c.text == "make test" for c in shown)


runner = CliRunner()


def _mkctl_words(words: list[str]) -> list[str] | None:
    if words[0] in ("mkctl", ".venv/bin/mkctl"):
        return words[1:]
    if words[:2] == ["kubectl", "mkd"]:
        return words[2:]
    return None


def _repo_paths(words: list[str]) -> list[str]:
    """Arguments naming a file or folder of the repository (not ``state/``, which the demo makes)."""
    out = []
    for w in words:
        value = w.partition("=")[2] if w.startswith("-") and "=" in w else w
        if re.match(r"^(deploy|examples|demo|docs|tests|bench|requirements|packaging)/", value):
            out.append(value.rstrip(","))
    return out


def check(shown: Shown, tmp_path: Path) -> None:
    words = shlex.split(shown.text)
    while words and re.match(r"^[A-Z_]+=", words[0]):  # VAR=value before the command
        words = words[1:]
    for path in _repo_paths(words):
        assert (ROOT / path).exists(), f"{shown}: {path} is not in the repository"
    mkctl = _mkctl_words(words)
    if mkctl is not None:
        _check_mkctl(shown, mkctl, tmp_path)
    elif words[0] == "kubectl":
        kubectl = shutil.which("kubectl")
        if kubectl is None:
            pytest.skip("kubectl is not installed")
        done = subprocess.run([kubectl, *words[1:], "--help"], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, f"{shown}: {done.stderr.strip()}"
    elif words[0] == "make":
        targets = [w for w in words[1:] if "=" not in w]
        makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
        for target in targets:
            assert re.search(rf"^{re.escape(target)}:", makefile, flags=re.M), f"{shown}: no target {target}"
        for w in words[1:]:
            if w.startswith("DEMO_ARGS="):
                _check_mkctl(shown, ["demo", *shlex.split(w.partition("=")[2])], tmp_path)
    elif words[0] == "pytest":
        assert all((ROOT / w).exists() for w in words[1:] if not w.startswith("-")), shown
    elif words[:2] == ["python", "-m"]:  # benchmarks and kubesim: their --help (they run for minutes)
        done = subprocess.run([sys.executable, "-m", words[2], "--help"], capture_output=True, text=True,
                              timeout=120, cwd=ROOT)
        assert done.returncode == 0, f"{shown}: {done.stderr.strip()[-2000:]}"
    elif words[0] == "createdb":  # PostgreSQL's client, where it is installed
        tool = shutil.which("createdb")
        if tool is None:
            pytest.skip("createdb (PostgreSQL's client tools) is not installed")
        done = subprocess.run([tool, "--help"], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, f"{shown}: {done.stderr.strip()}"
        unknown = [w for w in words[1:] if w.startswith("-") and w not in done.stdout]
        assert not unknown, f"{shown}: createdb has no {unknown}"
    else:
        pytest.fail(f"{shown}: no way to check this command here")


def _check_mkctl(shown: Shown, args: list[str], tmp_path: Path) -> None:
    real = next((key for key in RUN_FOR_REAL if tuple(args[:len(key)]) == key), None)
    if real == ("settings",) and "--update" in args:
        target = args[args.index("--update") + 1]
        copy = tmp_path / Path(target).name
        shutil.copy(ROOT / target, copy)
        args = [*args[:args.index("--update") + 1], str(copy), *args[args.index("--update") + 2:]]
        result = runner.invoke(app, args, env={})
        assert result.exit_code == 0, f"{shown}: {result.output}"
        assert copy.read_text(encoding="utf-8") == (ROOT / target).read_text(encoding="utf-8"), (
            f"{target} is not what `{shown.text}` generates: run it")
        return
    if real is not None:
        with contextlib.chdir(tmp_path):
            result = runner.invoke(app, args, env={})
        assert result.exit_code == 0, f"{shown}: exit {result.exit_code}: {result.output}"
        return
    path = _resolve(shown, args)
    result = runner.invoke(app, [*path, "--help"], env={})
    assert result.exit_code == 0, f"{shown}: exit {result.exit_code}: {result.output}"


def _resolve(shown: Shown, args: list[str]) -> list[str]:
    """The sub-command path of ``args``; every ``--flag`` shown must be one of that command's (or the
    root's: ``--debug`` is taken anywhere)."""
    root = typer.main.get_command(app)
    command: Any = root
    path: list[str] = []
    flags = _flags(root)
    for word in args:
        if hasattr(command, "commands") and not word.startswith("-") and word in command.commands:
            command = command.commands[word]
            path.append(word)
            flags |= _flags(command)
        elif word.startswith("-") and word != "-":
            flag = word.partition("=")[0]
            assert flag in flags, f"{shown}: `mkctl {' '.join(path)}` has no {flag}"
    assert not hasattr(command, "commands") or path, f"{shown}: no such command"
    return path


def _flags(command: Any) -> set[str]:
    return {o for p in command.params for o in (*p.opts, *p.secondary_opts)} | {"--help", "-h"}


@pytest.mark.parametrize("shown", all_commands(), ids=str)
def test_every_command_shown_runs(shown: Shown, tmp_path: Path) -> None:
    check(shown, tmp_path)


# --- no diary --------------------------------------------------------------------------------------------

PACKAGES = ("federation", "dispatcher", "worker_agent", "mkctl", "kubesim", "migrations")
DIARY = re.compile(r"\b[Ii]ssue \d+\b|\b(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh"
                   r"|twelfth|thirteenth|earlier|previous|last|this) session\b|\bround \d+\b")


def test_no_diary_in_the_code_its_help_or_the_docs() -> None:
    """Docs, help and docstrings say what mkd does, not when or in which round of work it was done:
    no issue numbers, no sessions (the why lives in git log, figures in bench/RESULTS.md)."""
    files = [*PAGES, *(p for package in (*PACKAGES, "tests", "bench") for p in (ROOT / package).rglob("*.py"))]
    found = [f"{p.relative_to(ROOT)}:{n}: {line.strip()[:120]}" for p in files
             for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if DIARY.search(line)]
    assert not found, "\n".join(found)


def _paragraphs(doc: str) -> int:
    return len([b for b in re.split(r"\n[ \t]*\n", doc.strip()) if b.strip()])


def test_module_docstrings_are_one_paragraph() -> None:
    """A module's docstring says what it owns: a summary line and at most one paragraph; details go to
    the class or function they are about (migrations keep alembic's revision header; a benchmark's
    docstring is its ``--help``)."""
    import ast

    long = []
    for package in (*PACKAGES, "tests"):
        for path in (ROOT / package).rglob("*.py"):
            doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")), clean=True) or ""
            doc = re.sub(r"\n\s*Revision ID:.*", "", doc, flags=re.S) if "versions" in path.parts else doc
            if _paragraphs(doc) > 2:
                long.append(f"{path.relative_to(ROOT)}: {_paragraphs(doc)} paragraphs")
    assert not long, "\n".join(long)


def test_the_documented_states_are_the_workload_states() -> None:
    from dispatcher.states import WorkloadState

    text = (ROOT / "docs" / "OPERATIONS.md").read_text(encoding="utf-8")
    sentence = text.partition("States are one vocabulary everywhere")[2].partition("in\nany case")[0]
    assert set(re.findall(r"`(\w+)`", sentence)) == {s.value for s in WorkloadState}, sentence
