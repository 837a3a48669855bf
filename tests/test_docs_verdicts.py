"""No verdict word in the documentation contradicts the numbers it stands beside.

Prose that quotes a paired comparison seed by seed ("+2.33 / +1.44 / -0.22 pp") and names
it ("ahead", "behind", "indistinguishable", "not ahead") in the same clause is held to
the rule the report applies (analysis/verdict.py): the word must be the verdict those
differences give. Checked on the README and every hand-written page that quotes
generated tables (the pages naming their sources, as tests/test_docs_quote_tables.py
reads them); the generated tables are the rule's own output."""

from __future__ import annotations

import re
from pathlib import Path

from analysis.verdict import paired_verdict

ROOT = Path(__file__).resolve().parents[1]
SOURCES = re.compile(r"<!--\s*numbers from:")
SIGNED = r"([+\-−]\d+(?:\.\d+)?|0(?:\.0+)?)"  # differences are written with their sign
TRIPLE = re.compile(SIGNED + r"\s*/\s*" + SIGNED + r"\s*/\s*" + SIGNED)
WORD = re.compile(r"\b(not |never )?(ahead|behind|indistinguishable)\b")
# a verdict word speaks for the differences of its own clause
CLAUSE = re.compile(r";|:\s|\.\s|\|")


def pages() -> list[Path]:
    return [ROOT / "README.md"] + [path for path in sorted((ROOT / "docs").rglob("*.md")) if SOURCES.search(path.read_text())]


def paragraphs(text: str) -> list[tuple[int, str]]:
    """(first line, text) of each paragraph, bullet and table row outside code blocks."""
    found: list[tuple[int, str]] = []
    current: list[tuple[int, str]] = []
    in_code = False
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip().startswith(("```", "~~~")):
            in_code = not in_code
            continue
        if in_code:
            continue
        if not line.strip() or line.lstrip().startswith(("* ", "- ", "#", "|")):
            if current:
                found.append((current[0][0], " ".join(part for _, part in current)))
            current = [(number, line)] if line.strip() else []
            continue
        current.append((number, line))
    if current:
        found.append((current[0][0], " ".join(part for _, part in current)))
    return found


def contradictions(text: str, where: str) -> tuple[list[str], int]:
    found, checked = [], 0
    for line, paragraph in paragraphs(text):
        for clause in CLAUSE.split(paragraph):
            words = list(WORD.finditer(clause))
            for triple in TRIPLE.finditer(clause):
                if not words:
                    continue
                verdict = paired_verdict([float(value.replace("−", "-")) for value in triple.groups()])
                before = [word for word in words if word.start() < triple.start()]
                word = before[-1] if before else words[0]
                negated, named = word.group(1), word.group(2)
                checked += 1
                if (named == verdict) == bool(negated):
                    found.append(f"{where}:{line}: '{word.group(0).strip()}' beside {triple.group(0)}, which the rule calls {verdict}")
    return found, checked


def test_no_verdict_word_contradicts_the_differences_beside_it() -> None:
    problems, checked = [], 0
    for page in pages():
        found, count = contradictions(page.read_text(), str(page.relative_to(ROOT)))
        problems += found
        checked += count
    assert checked > 20, "the check found almost nothing to check: has the way docs quote differences changed?"
    assert not problems, "\n".join(problems)


def test_the_check_catches_a_verdict_stronger_than_its_numbers() -> None:
    wrong = "* HDC-FL is ahead of FedAvg-SE in the mean (+2.33 / +1.44 / -0.22 pp).\n"
    right = "* HDC-FL is indistinguishable from FedAvg-SE in the mean (+2.33 / +1.44 / -0.22 pp); behind FedALA (-0.51 / -0.23 / -0.02).\n"
    assert contradictions(wrong, "page")[0] and not contradictions(right, "page")[0]
    assert not contradictions("* not ahead of it (+2.33 / +1.44 / -0.22).\n", "page")[0]
