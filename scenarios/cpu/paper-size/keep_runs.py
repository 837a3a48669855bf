"""Keep a paper-size comparison's finished runs in the repository, so that a comparison
longer than one machine's life (C10 Rot: about five hours on two cores) continues on the
next machine instead of starting over.

    python scenarios/cpu/paper-size/keep_runs.py save rot      # runs/paper-size-compare/rot -> results/paper-size/rot
    python scenarios/cpu/paper-size/keep_runs.py restore rot   # the reverse, for runs runs/ lacks
    python scenarios/cpu/paper-size/keep_runs.py save rot --stopped   # also the stopped runs, with their checkpoints

`save` copies every completed run (its manifest says "completed") without its
checkpoints (only a killed run needs them), and the weights file the runs were
initialised from. With `--stopped` it also keeps the runs that stopped before their last
round once they have a checkpoint, checkpoints and all, so that the next machine resumes them from their last
checkpoint instead of round 1 (stop the sweep first: a run being written is not copied
whole); a kept stopped run is replaced when a later save finds it further along.
`restore` copies back the kept runs that the runs folder lacks and the kept weights file
when weights/ lacks it; the sweep then skips the completed ones and resumes the stopped
ones. Both refuse to mix two pretrainings: runs made from weights other than the kept
file (their manifests record its sha256) stop the command with the fix, since one table
over both would compare runs that did not start from the same encoder.
`hdcfl-ray report results/paper-size/rot` reads the kept runs as it reads runs/.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path

WEIGHTS_NAME = "c10-pool.pt"
_NOT_KEPT = ("checkpoint", "checkpoint.prev", ".checkpoint.tmp", ".checkpoint.discard", ".lock")


class KeepError(Exception):
    """A user-fixable refusal: the message says what differs and what to do."""


_NOT_KEPT_STOPPED = (".checkpoint.tmp", ".checkpoint.discard", ".lock")


def manifest_status(run_dir: Path) -> str | None:
    """The status RUN_DIR's manifest records ("completed", or what a stopped run left);
    None without a readable one."""
    try:
        status = json.loads((run_dir / "manifest.json").read_text()).get("status")
    except (OSError, ValueError):
        return None
    return status if isinstance(status, str) else None


def run_statuses(folder: Path) -> dict[Path, str]:
    """Run folders under FOLDER (any depth) and their manifests' status; a damaged
    manifest is no run."""
    statuses = {manifest.parent: manifest_status(manifest.parent) for manifest in sorted(folder.rglob("manifest.json"))}
    return {run: status for run, status in statuses.items() if status is not None}


def completed_runs(folder: Path) -> list[Path]:
    """Run folders under FOLDER (any depth) whose manifest says the run completed."""
    return [run for run, status in run_statuses(folder).items() if status == "completed"]


def rounds_done(run_dir: Path) -> int:
    """The rounds a run has logged (its rounds table's part files, one per logged round)."""
    return len(list((run_dir / "rounds.parquet").glob("part-*.parquet")))


def weights_digest(run_dir: Path) -> str | None:
    """The sha256 of the weights file a run started from, as its manifest records it."""
    initialisation = json.loads((run_dir / "manifest.json").read_text()).get("initialisation") or {}
    return initialisation.get("sha256")


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def check_one_pretraining(runs: list[Path], weights: Path) -> None:
    """Every run must have started from WEIGHTS (when it exists and the runs were pretrained)."""
    if not weights.is_file():
        return
    expected = file_digest(weights)
    others = [run for run in runs if weights_digest(run) not in (None, expected)]
    if others:
        names = ", ".join(str(run) for run in others[:3]) + (" ..." if len(others) > 3 else "")
        raise KeepError(
            f"{len(others)} run(s) started from other weights than {weights} (sha256 {expected[:12]}): {names}. "
            "Keep one pretraining per folder: move those runs (or the weights file) aside, or rerun them from this file."
        )


def save(runs_folder: Path, kept_folder: Path, weights: Path, stopped: bool = False) -> list[Path]:
    """Copy RUNS_FOLDER's completed runs not yet kept into KEPT_FOLDER (and with `stopped`
    the unfinished ones with their checkpoints, replacing a kept copy that is behind);
    return the new ones."""
    statuses = run_statuses(runs_folder)
    # a stopped run is worth keeping once it has a checkpoint to resume from
    runs = [run for run, status in statuses.items() if status == "completed" or (stopped and (run / "checkpoint").is_dir())]
    kept_weights = kept_folder.parent / WEIGHTS_NAME
    check_one_pretraining(runs, kept_weights if kept_weights.is_file() else weights)
    if not kept_weights.is_file() and weights.is_file() and any(weights_digest(run) for run in runs):
        kept_weights.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(weights, kept_weights)
    saved = []
    for run in runs:
        target = kept_folder / run.relative_to(runs_folder)
        kept_status = manifest_status(target)
        if kept_status == "completed":
            continue
        finished = statuses[run] == "completed"
        if kept_status is not None and not finished and rounds_done(run) <= rounds_done(target):
            continue  # the kept stopped copy is as far along
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(run, target, ignore=shutil.ignore_patterns(*(_NOT_KEPT if finished else _NOT_KEPT_STOPPED)))
        saved.append(target)
    return saved


def restore(kept_folder: Path, runs_folder: Path, weights: Path) -> list[Path]:
    """Copy KEPT_FOLDER's runs that RUNS_FOLDER lacks back into it; return the restored ones."""
    kept_weights = kept_folder.parent / WEIGHTS_NAME
    if kept_weights.is_file():
        if weights.is_file() and file_digest(weights) != file_digest(kept_weights):
            raise KeepError(
                f"{weights} differs from {kept_weights}, the file the kept runs started from; a sweep would mix "
                f"two pretrainings. Move {weights} aside (the kept file is then copied in), or keep both sets apart "
                "with PAPER_SIZE_OUT and no restore."
            )
        if not weights.is_file():
            weights.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(kept_weights, weights)
    restored = []
    for run in run_statuses(kept_folder) if kept_folder.is_dir() else []:
        target = runs_folder / run.relative_to(kept_folder)
        if target.exists():
            continue  # a run on disk (finished, killed or newer) is the sweep's to judge
        shutil.copytree(run, target)
        restored.append(target)
    return restored


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("save", "restore"))
    parser.add_argument("form", help="the comparison's form: ls3 or rot (a folder name under both places)")
    parser.add_argument("--runs", type=Path, default=Path("runs/paper-size-compare"), help="the comparison's runs folder")
    parser.add_argument("--kept", type=Path, default=Path("results/paper-size"), help="where kept runs live in the repository")
    parser.add_argument("--weights", type=Path, default=Path("weights") / WEIGHTS_NAME, help="the pretrained weights file")
    parser.add_argument(
        "--stopped", action="store_true", help="save: also keep the runs that stopped before their last round, with their checkpoints (stop the sweep first)"
    )
    args = parser.parse_args(argv)
    runs_folder, kept_folder = args.runs / args.form, args.kept / args.form
    try:
        if args.action == "save":
            moved = save(runs_folder, kept_folder, args.weights, stopped=args.stopped)
        else:
            moved = restore(kept_folder, runs_folder, args.weights)
    except KeepError as exc:
        print(f"keep_runs.py {args.action} {args.form}: {exc}", file=sys.stderr)
        return 2
    verb = "kept" if args.action == "save" else "restored"
    print(f"{verb} {len(moved)} run(s)" + "".join(f"\n  {path}" for path in moved), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
