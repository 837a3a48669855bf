"""docs/privacy.md's generated blocks are the code's: the privacy section's keys (from
PrivacyConfig's fields) and the table of what each method sends under DP (from each
MethodSpec's privacy rule); README.md links the page."""

from __future__ import annotations

from pathlib import Path

from hdcfl_ray.config.privacy_reference import (
    KEYS_MARKERS,
    METHODS_MARKERS,
    PRIVACY_PAGE,
    REGENERATE_COMMAND,
    main,
    privacy_keys_block,
    privacy_methods_table,
    stale_blocks,
    with_generated,
)
from hdcfl_ray.config.reference import block_between

ROOT = Path(__file__).resolve().parents[1]


def test_the_privacy_page_holds_the_generated_keys_and_methods_table() -> None:
    page = (ROOT / PRIVACY_PAGE).read_text(encoding="utf-8")
    assert stale_blocks(page) == [], f"{PRIVACY_PAGE} is out of date; run: {REGENERATE_COMMAND}"
    assert with_generated(page) == page


def test_the_keys_block_shows_every_key_and_the_table_every_method_with_a_rule() -> None:
    from hdcfl_ray.algorithms.registry import builtin_method_specs
    from hdcfl_ray.contract import AdaptiveClipConfig, PrivacyConfig

    keys = privacy_keys_block()
    for name in PrivacyConfig.model_fields:
        assert f"\n  {name}:" in keys
    for name in AdaptiveClipConfig.model_fields:
        assert f"\n    {name}:" in keys
    table = privacy_methods_table()
    accepting = [name for name, spec in builtin_method_specs().items() if spec.privacy is not None]
    assert all(f"| `{name}` |" in table for name in accepting)
    assert accepting or "No method accepts" in table


def test_write_rewrites_both_blocks_and_check_reports_staleness(tmp_path: Path) -> None:
    page = tmp_path / "privacy.md"
    page.write_text("# Privacy\n\n" + "\n\nold\n".join(KEYS_MARKERS) + "\n\ntext\n\n" + "\nold\n".join(METHODS_MARKERS) + "\n")
    assert main(["--check", str(page)]) == 1
    assert main(["--write", str(page)]) == 0 and main(["--check", str(page)]) == 0
    text = page.read_text()
    assert block_between(text, *KEYS_MARKERS) == privacy_keys_block()
    assert block_between(text, *METHODS_MARKERS) == privacy_methods_table()


def test_the_readme_links_the_privacy_page() -> None:
    assert f"({PRIVACY_PAGE})" in (ROOT / "README.md").read_text(encoding="utf-8")
