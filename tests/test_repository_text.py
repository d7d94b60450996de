"""The repository speaks only of itself. Its tracked text must not name what a reader of it cannot
resolve: a numbered stop, issue, session, sitting or turn of the process that built it (the word
followed by its number, also inside a file name), a paper called by a number ("seed" and a
three-digit paper number: it reads as a random seed), or the shared spec outside the repository
(the algorithms' reference is docs/algorithms.md). History, where it matters, is told with a commit.

What stays allowed: another project's tracker named with its project (``ray-project/ray#N``,
"PyTorch issue N", a GitHub ``/issues/N`` address), a number that counts something (the word
followed by "5 rounds", "2 s"), and the words alone ("a Ray session", "stops").

Every tracked text file is read (``git ls-files``; binaries are left out by their suffix or a NUL
byte), docs/results/ and this file included: its examples below are templates whose numbers and
names are filled in as the tests run. Without git, or outside a checkout, the tests skip.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: suffixes never read as text
BINARY_SUFFIXES = frozenset(
    {".png", ".jpg", ".jpeg", ".gif", ".pdf", ".parquet", ".pkl", ".pickle", ".pt", ".pth", ".npz",
     ".npy", ".gz", ".zip", ".tar", ".bz2", ".xz", ".whl", ".so", ".ico", ".ttf", ".woff", ".woff2"}
)

_WORD = r"(?:stop|issue|session|sitting|turn)s?"
#: a process word and its number, with a space, "#", "-" or "_" between them or none (the word must
#: not end a longer word: "return 3", "backstop 2" are not hits)
_NUMBERED = re.compile(rf"(?<![A-Za-z]){_WORD}(?:[ \t]*#[ \t]*|[ \t]+|[_-])?(\d+)", re.IGNORECASE)
#: what makes the number a quantity, not a name: a unit after it ("5 rounds early", "2 s long")
_QUANTITY = re.compile(
    r"(?:\.\d+)?[ \t]*(?:%|x\b|s\b|ms\b|rounds?\b|epochs?\b|steps?\b|iterations?\b|batch(?:es)?\b|"
    r"seconds?\b|minutes?\b|hours?\b|times\b|clients?\b|trials?\b|workers?\b|samples?\b|"
    r"more\b|fewer\b)",
    re.IGNORECASE,
)
#: the word right before a match (``upstream`` takes brackets, quotes and a possessive off it)
_WORD_BEFORE = re.compile(r"(\S+)[ \t]+$")
#: capitalised words that do not name another project
_NOT_PROJECTS = frozenset(
    {"The", "This", "That", "These", "Those", "Its", "An", "A", "See", "In", "On", "Of", "For", "And",
     "Per", "Each", "Every", "Since", "After", "Before", "At", "By", "From", "Our", "Their", "Same",
     "Earlier", "Later", "Last", "Next", "First", "One", "Two", "As", "Then", "With", "Without",
     "Which", "What", "When", "Where", "Until", "Under", "Over", "Both", "Whose", "Such", "Raysim"}
)
#: a paper named by its seed number: "seed", then a three-digit paper number
_SEED_PAPER = re.compile(r"\bseeds?[ \t_-]+00\d\b", re.IGNORECASE)
_ALGORITHMS_MD = re.compile(r"ALGORITHMS\.md")


def upstream(before: str) -> bool:
    """Whether the text before a match names another project's tracker: a path ("ray-project/ray")
    or a capitalised name that is not a plain word ("PyTorch", "Ray's")."""
    m = _WORD_BEFORE.search(before)
    if m is None:
        return False
    word = m.group(1).strip("([{\"'`*_").removesuffix("'s")
    return "/" in word or (word[:1].isupper() and word not in _NOT_PROJECTS)


def process_numbers(line: str) -> list[str]:
    """The stop/issue/session/sitting/turn numbers of the project's own process in ``line``."""
    return [
        m.group(0)
        for m in _NUMBERED.finditer(line)
        if not _QUANTITY.match(line, m.end()) and not upstream(line[: m.start()])
    ]


def findings(line: str) -> list[str]:
    """Every text in ``line`` the repository must not hold, in the order of the checks."""
    return [
        *process_numbers(line),
        *(m.group(0) for m in _SEED_PAPER.finditer(line)),
        *(m.group(0) for m in _ALGORITHMS_MD.finditer(line)),
    ]


def name_findings(path: str) -> list[str]:
    """A process number in a file's name (the word and its number, as in ``suite_<word><number>.log``)."""
    return [m.group(0) for m in _NUMBERED.finditer(path.rsplit("/", 1)[-1])]


# ---- the patterns on their own -------------------------------------------------------------------

#: what the examples' templates are filled with: a number, a paper's number, the shared spec's name
FILL = {"n": "29", "paper": "002", "papers": "003/000", "spec": "ALGORITHMS" + ".md"}


@pytest.mark.parametrize(
    "text",
    [
        "suites pack tighter (issue {n})",
        "Issue {n}'s 0.80 for 1 worker",
        "(stop {n}, commit 90aba20)",
        "Stop {n} took the worker's start off",
        "the code of stop {n};",
        "stops {n}-42",
        "as asked in issue #{n}",
        "The stop-{n} runs at E = 5",
        "[log](bench/suite_stop{n}.log)",
        "in stop {n}'s sitting",
        "session {n}: the picture moved",
        "sitting {n} gave 0.8",
        "turn {n} asked for it",
        "The issue {n} ratio",
        "SphereFed and FedETF (issue {n})",
        "Raysim issue {n}",
        "Fed3+2p (seed {paper}), Table 1",
        "FedFCD (seeds {papers})",
        "Seed {paper}'s OCR reads",
        "the spec is `../shared/{spec}`",
    ],
)
def test_flags(text: str) -> None:
    text = text.format(**FILL)
    assert findings(text), text


@pytest.mark.parametrize(
    "text",
    [
        "stop {n} rounds early",
        "clients stop {n} epochs before the end",
        "a Ray session, started once",
        "the session's workers",
        "issues are filed upstream",
        "see ray-project/ray#51234",
        "PyTorch issue {n} describes the slowdown",
        "(Ray's issue {n})",
        "a session {n} s long",
        "ray-project/ray issue {n}",
        "https://github.com/ray-project/ray/issues/51234",
        "return 3",
        "in turn, 2 clients",
        "a value sitting on a .5 boundary",
        "seed 0 and seed 1; seeds 0-4",
        "seed 2024",
        "docs/algorithms.md",
        "tests/engine/test_executor_session.py",
    ],
)
def test_passes(text: str) -> None:
    text = text.format(**FILL)
    assert not findings(text), findings(text)


@pytest.mark.parametrize(
    ("path", "flagged"),
    [
        ("docs/bench/suite_stop{n}.log", True),
        ("docs/bench/overhead-issue{n}.log", True),
        ("tests/engine/test_executor_session.py", False),
        ("docs/bench/cross_device_86d6ea2.log", False),
    ],
)
def test_name_pattern(path: str, flagged: bool) -> None:
    assert bool(name_findings(path.format(**FILL))) == flagged


# ---- the repository -------------------------------------------------------------------------------


def tracked_files() -> list[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    done = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=False, timeout=60)
    if done.returncode != 0:
        pytest.skip(f"git ls-files failed: {done.stderr.decode(errors='replace').strip()}")
    return [p for p in done.stdout.decode().split("\0") if p]


def text_of(path: str) -> str | None:
    """The file's text, or None for a binary or a file the checkout does not have."""
    if Path(path).suffix.lower() in BINARY_SUFFIXES:
        return None
    try:
        data = (ROOT / path).read_bytes()
    except (FileNotFoundError, IsADirectoryError):
        return None
    if b"\0" in data[:8192]:
        return None
    return data.decode("utf-8", errors="replace")


def test_text_speaks_only_of_the_repository() -> None:
    bad = []
    for path in tracked_files():
        text = text_of(path)
        if text is None:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            for hit in findings(line):
                bad.append(f"{path}:{number}: {hit!r} in {line.strip()[:160]!r}")
    summary = f"{len(bad)} text(s) naming the project's own process or a file outside it:"
    assert not bad, "\n".join([summary, *bad])


def test_file_names_speak_only_of_the_repository() -> None:
    present = (p for p in tracked_files() if (ROOT / p).exists())
    bad = [f"{path}: {hits}" for path in present if (hits := name_findings(path))]
    assert not bad, "\n".join(["file names with process numbers:", *bad])
