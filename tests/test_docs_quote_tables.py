"""Every "mean ± std" a page of the documentation quotes comes from a table a command
generated, so a rerun that changes the table cannot leave stale prose behind.

A page names its generated tables in a comment, anywhere in the page:

    <!-- numbers from: reproduction-tables.md, reproduction-gain-grid.md -->

(paths relative to the page; a name may be a glob such as `calibration/*.md`). Every
"a ± b" in the page outside code blocks must occur in one of them, signs aside; a page
that quotes such a pair without naming a source fails, and so does a named source that
does not exist. A page that names its sources is held to them for every number with two
decimals it quotes (81.35%, +2.19 pp), not only the pairs, outside code blocks and
`code spans`; a number that is a setting rather than a result (a learning rate, a
version) is listed once in `<!-- not from a table: 3.10 (Python), 0.05 (lr) -->`. The
README names its sources, so that its numbers are checked too.

A dated record that no command can regenerate (a before/after comparison across a
code change, replays of runs no longer on disk) sits between
`<!-- record: WHAT, WHEN, WHY NOT GENERATED -->` and `<!-- end record -->`; its pairs
are not checked, the reason must be given, and the page says so in its text. The generated files themselves
(`hdcfl-ray report`, `hdcfl-ray calibrate --report`, studies/crosscheck/run.py
--table) are the sources and are not checked against anything."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAIR = re.compile(r"(\d+(?:\.\d+)?)\s*±\s*(\d+(?:\.\d+)?)")
SOURCES = re.compile(r"<!--\s*numbers from:\s*(.+?)\s*-->", re.DOTALL)
# a number with two decimals, not part of a version such as 2.14.1 or of a longer number
NUMBER = re.compile(r"(?<![\w.])[+-]?(\d+\.\d\d)(?!\d|\.\d)")
NOT_FROM_A_TABLE = re.compile(r"<!--\s*not from a table:\s*(.+?)\s*-->", re.DOTALL)
CODE_SPAN = re.compile(r"`[^`]*`")
COMMENT = re.compile(r"<!--.*?-->")
FENCE = re.compile(r"^(```|~~~)")
RECORD_START = re.compile(r"<!--\s*record:\s*(.*?)\s*-->")
RECORD_END = re.compile(r"<!--\s*end record\s*-->")


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every line outside fenced code blocks and records."""
    found: list[tuple[int, str]] = []
    in_code = in_record = False
    for number, line in enumerate(text.splitlines(), start=1):
        if FENCE.match(line.strip()):
            in_code = not in_code
            continue
        if not in_code and RECORD_START.search(line):
            in_record = True
        if not in_code and not in_record:
            found.append((number, line))
        if not in_code and RECORD_END.search(line):
            in_record = False
    return found


def quoted_pairs(text: str) -> list[tuple[int, tuple[str, str]]]:
    """(line number, (mean, std)) of every pair outside fenced code blocks and records."""
    return [(number, pair) for number, line in prose_lines(text) for pair in PAIR.findall(line)]


def quoted_numbers(text: str) -> list[tuple[int, str]]:
    """(line number, number) of every two-decimal number outside code blocks, code spans,
    comments and records, signs dropped."""
    return [
        (number, value)
        for number, line in prose_lines(text)
        for value in NUMBER.findall(CODE_SPAN.sub(" ", COMMENT.sub(" ", line)))
    ]


def exempt_numbers(text: str) -> set[str]:
    return {value for marker in NOT_FROM_A_TABLE.findall(text) for value in NUMBER.findall(marker)}


def named_sources(page: Path, text: str) -> list[Path]:
    names = [name.strip() for marker in SOURCES.findall(text) for name in marker.split(",") if name.strip()]
    found: list[Path] = []
    for name in names:
        matches = sorted(page.parent.glob(name)) if any(char in name for char in "*?[") else [page.parent / name]
        found += [match.resolve() for match in matches] or [(page.parent / name).resolve()]
    return found


def source_files() -> set[Path]:
    return {source for page in pages() for source in named_sources(page, page.read_text(encoding="utf-8"))}


def test_pair_pattern_reads_signed_and_bold_pairs() -> None:
    text = "| hdcfl | **84.45 ± 1.53** | +1.20 ± 1.17 | -0.14 ±1.25 |\n```\n9.99 ± 9.99\n```\n"
    assert [pair for _, pair in quoted_pairs(text)] == [("84.45", "1.53"), ("1.20", "1.17"), ("0.14", "1.25")]


def test_a_record_is_not_checked_and_must_say_why() -> None:
    text = "1.00 ± 0.10\n<!-- record: before the seed-stream change, 2026-11-30 -->\n2.00 ± 0.20\n<!-- end record -->\n3.00 ± 0.30\n"
    assert [pair for _, pair in quoted_pairs(text)] == [("1.00", "0.10"), ("3.00", "0.30")]


def test_every_record_gives_its_reason_and_ends() -> None:
    bad = []
    for page in pages():
        text = page.read_text(encoding="utf-8")
        starts, ends = RECORD_START.findall(text), RECORD_END.findall(text)
        if len(starts) != len(ends):
            bad.append(f"{page.relative_to(ROOT)}: {len(starts)} record starts, {len(ends)} ends")
        bad += [f"{page.relative_to(ROOT)}: a record without its reason" for reason in starts if len(reason) < 20]
    assert bad == [], "\n".join(bad)


def test_every_named_source_exists() -> None:
    missing = []
    for page in pages():
        for source in named_sources(page, page.read_text(encoding="utf-8")):
            if not source.is_file():
                missing.append(f"{page.relative_to(ROOT)} names {source} (not a file)")
    assert missing == [], "\n".join(missing)


def test_every_quoted_mean_and_std_is_in_a_generated_table_the_page_names() -> None:
    sources = source_files()
    stale: list[str] = []
    for page in pages():
        if page.resolve() in sources:
            continue  # a generated table is where the numbers come from
        text = page.read_text(encoding="utf-8")
        quoted = quoted_pairs(text)
        if not quoted:
            continue
        named = named_sources(page, text)
        if not named:
            stale.append(f"{page.relative_to(ROOT)} quotes {len(quoted)} 'mean ± std' pairs and names no generated table "
                         "(add <!-- numbers from: FILE.md --> naming the tables its numbers come from)")
            continue
        available = {pair for source in named if source.is_file() for _, pair in quoted_pairs(source.read_text(encoding="utf-8"))}
        exempt = exempt_numbers(text)
        stale += [f"{page.relative_to(ROOT)}:{line}: {mean} ± {std} is in none of {', '.join(s.name for s in named)}"
                  for line, (mean, std) in quoted if (mean, std) not in available and not {mean, std} <= exempt]
    assert stale == [], "numbers in the docs that no generated table holds (rerun the table's command or fix the prose):\n" + "\n".join(stale)


def split_tables(text: str) -> list[int]:
    """Line numbers (1-based) of table rows cut off from the table above them by one blank
    line: Markdown ends a table at a blank line, so such rows render as stray text."""
    lines = text.splitlines()
    cut = []
    for index in range(2, len(lines)):
        row, gap, above = lines[index], lines[index - 1], lines[index - 2]
        next_line = lines[index + 1] if index + 1 < len(lines) else ""
        starts_a_table = next_line.startswith("|") and set(next_line.replace("|", "").strip()) <= set("-: ")
        if row.startswith("|") and not gap.strip() and above.startswith("|") and not starts_a_table:
            cut.append(index + 1)
    return cut


def test_split_tables_finds_a_row_after_a_blank_line() -> None:
    assert split_tables("| a | b |\n|---|---|\n| 1 | 2 |\n\n| 3 | 4 |\n") == [5]
    assert split_tables("| a |\n|---|\n| 1 |\n\n| b |\n|---|\n| 2 |\n") == []


def test_no_doc_table_is_cut_by_a_blank_line() -> None:
    every = [*pages(), *sorted((ROOT / "docs").glob("**/*.md")), ROOT / "README.md"]
    cut = {str(page.relative_to(ROOT)): split_tables(page.read_text()) for page in dict.fromkeys(every)}
    assert not {page: lines for page, lines in cut.items() if lines}


def test_number_pattern_reads_results_and_skips_versions_code_and_comments() -> None:
    text = "HDC-FL 81.35% (+2.19 pp, -1.41), torch 2.14.1, `lr 0.05`, 3.5 and 12.345 <!-- 9.99 -->\n```\n7.77\n```\n"
    assert [value for _, value in quoted_numbers(text)] == ["81.35", "2.19", "1.41"]
    assert exempt_numbers("<!-- not from a table: 3.10 (Python), 0.05 (lr) -->") == {"3.10", "0.05"}


def test_the_readme_names_the_tables_its_numbers_come_from() -> None:
    assert named_sources(ROOT / "README.md", (ROOT / "README.md").read_text(encoding="utf-8"))


def test_every_number_a_page_quotes_is_in_the_tables_it_names() -> None:
    """Pages that name their generated tables: each two-decimal number must be in one of
    them, so a rerun that moves a number cannot leave the old one in the prose."""
    sources = source_files()
    stale: list[str] = []
    for page in pages():
        text = page.read_text(encoding="utf-8")
        named = named_sources(page, text)
        if page.resolve() in sources or not named:
            continue
        available = {value for source in named if source.is_file() for _, value in quoted_numbers(source.read_text(encoding="utf-8"))}
        available |= exempt_numbers(text)
        stale += [f"{page.relative_to(ROOT)}:{line}: {value} is in none of {', '.join(s.name for s in named)}"
                  for line, value in quoted_numbers(text) if value not in available]
    assert stale == [], "numbers in the docs that no generated table holds (rerun the table's command, fix the prose, or list a setting in <!-- not from a table: ... -->):\n" + "\n".join(stale)
