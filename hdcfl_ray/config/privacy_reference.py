"""The generated parts of docs/privacy.md: the `privacy:` section's keys (rendered from
PrivacyConfig's fields and descriptions, as the scenario reference is) and the table of
what each built-in method sends under DP (rendered from each MethodSpec's `privacy`
rule). `python -m hdcfl_ray.config.privacy_reference --write docs/privacy.md` rewrites
both blocks; tests/test_privacy_docs.py fails while either is out of date."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hdcfl_ray.algorithms.registry import builtin_method_specs
from hdcfl_ray.config.reference import block_between, section_reference, with_block
from hdcfl_ray.config.schema import ProtocolConfig
from hdcfl_ray.contract import AdaptiveClipConfig, PrivacyConfig

PRIVACY_PAGE = "docs/privacy.md"  # from the repository root
REGENERATE_COMMAND = f"python -m hdcfl_ray.config.privacy_reference --write {PRIVACY_PAGE}"
KEYS_MARKERS = ("<!-- privacy-keys:start -->", "<!-- privacy-keys:end -->")
METHODS_MARKERS = ("<!-- privacy-methods:start -->", "<!-- privacy-methods:end -->")


def privacy_keys_block() -> str:
    """Every key of the `privacy:` section with its default and meaning, adaptive_clip's
    own keys shown (its default is null: a fixed clip), as a fenced YAML block."""
    shown = PrivacyConfig.model_construct(adaptive_clip=AdaptiveClipConfig())  # the defaults, unvalidated: both noise keys null
    return f"```yaml\nprivacy:\n{section_reference(PrivacyConfig, shown, depth=1)}```\n"


def privacy_methods_table() -> str:
    """What each built-in method sends under DP and keeps on the client, and the releases
    its rule plans over a run of the default protocol.rounds at the method's defaults; a
    line saying none does yet."""
    rounds = ProtocolConfig().rounds
    rows = []
    for name, spec in builtin_method_specs().items():
        if spec.privacy is None:
            continue
        planned = spec.privacy.planned_releases(spec.params(), rounds, rounds)
        shown = ", ".join(f"{steps} at z{'' if scale == 1.0 else f' x {scale:g}'}" for scale, steps in planned if steps)
        rows.append(f"| `{name}` | {spec.privacy.sends} | {spec.privacy.kept_on_client or '-'} | {shown or 'none'} |")
    if not rows:
        return "No method accepts a `privacy:` section yet: a scenario with one is refused, naming the methods that do.\n"
    header = (
        f"| method | what goes through the mechanism | what stays on the client | noised releases in {rounds} rounds "
        "(its defaults) |\n|---|---|---|---|\n"
    )
    return header + "\n".join(rows) + "\n"


def with_generated(markdown: str) -> str:
    """`markdown` (the privacy page) with both generated blocks as the code now renders them."""
    markdown = with_block(markdown, *KEYS_MARKERS, privacy_keys_block())
    return with_block(markdown, *METHODS_MARKERS, privacy_methods_table())


def stale_blocks(markdown: str) -> list[str]:
    """The names of the page's generated blocks that differ from what the code renders."""
    stale = []
    if block_between(markdown, *KEYS_MARKERS) != privacy_keys_block():
        stale.append("the privacy section's keys")
    if block_between(markdown, *METHODS_MARKERS) != privacy_methods_table():
        stale.append("the table of what each method sends")
    return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hdcfl_ray.config.privacy_reference", description="Rewrite or check the generated blocks of the privacy page."
    )
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--write", metavar="MARKDOWN", type=Path, help=f"rewrite the blocks in MARKDOWN ({PRIVACY_PAGE})")
    action.add_argument("--check", metavar="MARKDOWN", type=Path, help="exit 1 when a block in MARKDOWN is out of date")
    args = parser.parse_args(argv)
    path: Path = args.write or args.check
    try:
        markdown = path.read_text(encoding="utf-8")
        if args.write:
            path.write_text(with_generated(markdown), encoding="utf-8")
            return 0
        stale = stale_blocks(markdown)
    except (OSError, ValueError) as exc:
        print(f"error: {path}: {exc}", file=sys.stderr)
        return 2
    if stale:
        print(f"{path}: {' and '.join(stale)} are out of date; run: {REGENERATE_COMMAND}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
