"""SECURITY.md names tests that exist: a claim whose test was renamed or removed is caught here."""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent

# The short names SECURITY.md's first paragraph gives to the files it cites most.
_ALIASES = {
    "attacks": "tests/test_attacks_21.py",
    "names": "tests/test_security_names.py",
    "properties": "tests/test_security_properties.py",
    "review": "tests/test_review.py",
    "untrusted": "tests/test_formats_untrusted.py",
    "limits": "tests/test_limits.py",
}

# `tests/x.py::test_a`, `alias `::test_a``, or `::test_a` (the file last named on the same line).
_CITATION = re.compile(r"(?:`(tests/[\w/]+\.py)::|\b(" + "|".join(_ALIASES) + r") `::|`::)(test_\w+)`")


def citations(text: str) -> list[tuple[str | None, str]]:
    """The (file, test) pairs a SECURITY.md-style text cites; file is None where no file precedes it."""
    found: list[tuple[str | None, str]] = []
    for line in text.splitlines():
        current: str | None = None
        for match in _CITATION.finditer(line):
            path = match.group(1) or (_ALIASES[match.group(2)] if match.group(2) else None)
            if path is not None:
                current = path
            found.append((current, match.group(3)))
    return found


def missing(text: str) -> list[str]:
    """The citations of `text` whose file or test function does not exist."""
    problems = []
    for path, test in citations(text):
        if path is None:
            problems.append(f"::{test} names no file")
            continue
        source = ROOT / path
        if not source.exists() or not re.search(rf"def {test}\b", source.read_text()):
            problems.append(f"{path}::{test}")
    return problems


def test_every_test_security_md_cites_exists() -> None:
    """Each test SECURITY.md names as the check of a claim is a test function in the file it names."""
    text = (ROOT / "SECURITY.md").read_text()
    assert len(citations(text)) > 50
    assert missing(text) == []


def test_the_check_catches_a_citation_of_a_test_that_does_not_exist() -> None:
    """The oracle: a renamed test, an unknown file and a citation with no file are each reported."""
    text = (
        "| claim | `tests/test_review.py::test_no_such_behaviour`, `::test_who_reviews_new_tools` |\n"
        "| claim | `tests/test_gone.py::test_a` |\n"
        "| claim | `::test_orphan` |\n"
    )
    assert missing(text) == [
        "tests/test_review.py::test_no_such_behaviour",
        "tests/test_gone.py::test_a",
        "::test_orphan names no file",
    ]
