"""What reading LEAF's JSON will take, from the files' sizes before any is parsed: the
samples kept (FEMNIST one byte per pixel, text one per character), and the peak while
reading (the largest file's text, decoded once, beside everything kept so far, and the
copies that join the users' arrays into splits). Large reads say so first; a read
that could not fit this machine's memory is refused before it starts."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

from hdcfl_ray.errors import ScenarioError
from hdcfl_ray.host_memory import machine_memory_bytes

ANNOUNCE_FROM_BYTES = 100 * 2**20  # smaller reads are quick and say nothing
_HEAD_BYTES = 1 << 20
_FIRST_X = re.compile(rb'"x"\s*:\s*\[\s*(["\[])')


@dataclass(frozen=True)
class ReadEstimate:
    files: int
    file_bytes: int
    largest_file_bytes: int
    kept_bytes: int

    @property
    def peak_bytes(self) -> int:
        # the largest file as bytes and as text while it decodes, with the samples kept so far;
        # then the users' arrays, the joined split and the train/test copies of it
        return max(2 * self.largest_file_bytes + self.kept_bytes, 3 * self.kept_bytes)

    def describe(self) -> str:
        return (
            f"reading LEAF's JSON: {self.files} file{'' if self.files == 1 else 's'}, {_mb(self.file_bytes)}; about {_mb(self.kept_bytes)} of samples kept "
            f"and {_mb(self.peak_bytes)} of memory at the peak of the read"
        )


def estimate_read(files: list[Path]) -> ReadEstimate:
    sizes = [path.stat().st_size for path in files]
    total = sum(sizes)
    return ReadEstimate(len(files), total, max(sizes, default=0), int(total * _kept_per_file_byte(files[0])) if files else 0)


def check_read_fits(files: list[Path], where: Path) -> ReadEstimate:
    """Say what a large read will take (on stderr, before it starts); refuse one that
    would not fit this machine's memory."""
    estimate = estimate_read(files)
    memory = machine_memory_bytes()
    if memory is not None and estimate.peak_bytes > memory:
        raise ScenarioError(
            f"dataset.path: {where}: {estimate.describe()}, more than this machine's {_mb(memory)}; read fewer users "
            "(LEAF's --sf samples a share of them) or point dataset.path at some of the files"
        )
    if estimate.peak_bytes >= ANNOUNCE_FROM_BYTES:
        print(estimate.describe(), file=sys.stderr, flush=True)
    return estimate


def _kept_per_file_byte(path: Path) -> float:
    """Bytes kept per byte of file, from the file's first megabyte: a text window keeps
    about a byte per character written; a pixel keeps one byte for the characters of
    one number and its comma (5 for LEAF's 1.0, about 20 for a grey like 0.38431...)."""
    try:
        with path.open("rb") as handle:
            head = handle.read(_HEAD_BYTES)
    except OSError:
        return 1.0
    found = _FIRST_X.search(head)
    if found is None or found.group(1) == b'"':
        return 1.0
    numbers = head[found.end() :]
    commas = numbers.count(b",")
    return 1.0 if commas == 0 else min(1.0, commas / len(numbers))


def _mb(size: int) -> str:
    return f"{size / 2**30:.1f} GB" if size >= 2**30 else f"{size / 2**20:.0f} MB"
