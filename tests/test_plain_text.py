"""plain_text: every terminal control sequence and control character taken out (CSI in
both forms, OSC and the other control strings ended by BEL or ST, escapes, bells,
carriage returns, backspaces, C1 controls), every printable character around them kept;
and the places text reaches a person or a file through it: stored error text, the
terminal's notes, the trackers."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hdcfl_ray.errors import ClientUpdateFailed, failure_text, failure_traceback
from hdcfl_ray.plain_text import plain_text

# every control character but newline and tab: C0, DEL, C1
CONTROLS = [chr(code) for code in (*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0)) if chr(code) not in "\n\t"]
ESC = "\x1b"
# the characters that open a sequence (ESC itself, CSI and the control strings' 8-bit forms)
INTRODUCERS = [ESC, "\x9b", "\x90", "\x98", "\x9d", "\x9e", "\x9f"]

# text with no control character in it (newlines and tabs included, any script)
printable = st.text(st.characters(blacklist_characters=CONTROLS, blacklist_categories=("Cs",)), max_size=40)


def _chars(first: int, last: int) -> st.SearchStrategy[str]:
    return st.text(st.sampled_from([chr(code) for code in range(first, last + 1)]), max_size=4)


csi = st.builds(
    lambda introducer, parameters, intermediates, final: introducer + parameters + intermediates + final,
    st.sampled_from([ESC + "[", "\x9b"]),
    _chars(0x30, 0x3F),
    _chars(0x20, 0x2F),
    st.sampled_from([chr(code) for code in range(0x40, 0x7F)]),
)
# OSC, DCS, SOS, PM, APC in their 7- and 8-bit forms, ended by BEL or by ST in either form
control_string = st.builds(
    lambda introducer, body, terminator: introducer + body + terminator,
    st.sampled_from([ESC + "]", ESC + "P", ESC + "X", ESC + "^", ESC + "_", "\x9d", "\x90", "\x98", "\x9e", "\x9f"]),
    st.text(st.characters(blacklist_characters=[*CONTROLS, "\n", "\t"], blacklist_categories=("Cs",)), max_size=20),
    st.sampled_from(["\x07", ESC + "\\", "\x9c"]),
)
# ESC, intermediate bytes, a final byte (ESC c, ESC ( B, ESC 7); not the ones that open CSI or a control string
escape = st.builds(
    lambda intermediates, final: ESC + intermediates + final,
    _chars(0x20, 0x2F),
    st.sampled_from([chr(code) for code in range(0x30, 0x7F) if chr(code) not in "[]PX^_"]),
)
# a lone control character: bell, carriage return, backspace, DEL, C1 such as ST
lone_control = st.sampled_from([control for control in CONTROLS if control not in INTRODUCERS])
sequence = st.one_of(csi, control_string, escape, lone_control)


@settings(max_examples=300, deadline=None)
@given(printable)
def test_text_without_controls_comes_back_unchanged(text: str) -> None:
    assert plain_text(text) == text


@settings(max_examples=500, deadline=None)
@given(st.lists(st.tuples(printable, st.lists(sequence, max_size=3)), max_size=8))
def test_control_sequences_inserted_anywhere_leave_exactly_the_original_text(pieces: list[tuple[str, list[str]]]) -> None:
    original = "".join(text for text, _ in pieces)
    with_controls = "".join(text + "".join(inserted) for text, inserted in pieces)
    assert plain_text(with_controls) == original


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=60))
def test_any_text_comes_out_with_no_control_character_but_newline_and_tab(text: str) -> None:
    assert not set(plain_text(text)) & set(CONTROLS)


@settings(max_examples=200, deadline=None)
@given(printable, st.sampled_from([ESC + "]", "\x9d", ESC + "P", ESC + "_"]), printable, printable)
def test_an_unterminated_control_string_loses_its_opening_only(before: str, opening: str, body: str, after: str) -> None:
    # a BEL on a later line does not end it: the newline already broke it off
    assert plain_text(before + opening + body + "\n" + after + "\x07") == before + body + "\n" + after
    assert plain_text(before + opening + body) == before + body


@pytest.mark.parametrize(
    ("text", "plain"),
    [
        ("\x1b[2J\x1b[Hcleared", "cleared"),  # clear the screen, cursor home
        ("\x1bcreset", "reset"),  # full reset (clears the screen too)
        ("\x9b31mred\x9b0m", "red"),  # 8-bit CSI
        ("\x1b[38;2;255;0;0mtrue colour\x1b[0m", "true colour"),
        ("\x1b]0;a title\x07text", "text"),  # window title, ended by BEL
        ("\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\ text \x07 more", "link text  more"),  # hyperlink ended by ST; a later bell eats nothing
        ("\x1b(Bcharset", "charset"),
        ("progress 50%\rprogress 100%", "progress 50%progress 100%"),
        ("typo\b\b\bed \x07bell\x00", "typoed bell"),
        ("lines\nand\ttabs stay", "lines\nand\ttabs stay"),
        ("ends with a lone ESC\x1b", "ends with a lone ESC"),
        ("unfinished CSI \x1b[12;3", "unfinished CSI 12;3"),
    ],
)
def test_known_sequences_come_out_as_the_text_a_terminal_would_show(text: str, plain: str) -> None:
    assert plain_text(text) == plain


def test_stored_failure_text_has_no_control_characters() -> None:
    error = ValueError("\x1b[31mboom\x1b[0m\r\nsecond\bline\x07 \x9b2J")
    assert failure_text(error) == "ValueError: boom\nsecondline "


def _ray_wrapped(cause: BaseException, traceback_text: str) -> BaseException:
    """`cause` as Ray raises it in the driver when a worker raised it."""
    from ray.exceptions import RayTaskError

    wrapper = RayTaskError("ClientHost.train_many", traceback_text, cause, proctitle="ray::ClientHost.train_many()", pid=7, ip="127.0.0.1")
    return wrapper.as_instanceof_cause()


def test_a_ray_wrapped_client_failure_reads_as_on_the_local_backend_with_its_traceback_after() -> None:
    cause = ClientUpdateFailed((7,), 3, "ValueError: bad batch")
    remote = "Traceback (most recent call last):\n  File \"plugin.py\", line 1, in local_update\n\x1b[31mValueError: bad batch\x1b[0m"
    wrapped = _ray_wrapped(cause, remote)
    assert ESC in str(wrapped)  # Ray colours its header
    assert failure_text(wrapped) == failure_text(cause) == "ClientUpdateFailed: client 7 failed in round 3: ValueError: bad batch"
    where = failure_traceback(wrapped)
    assert 'File "plugin.py", line 1, in local_update' in where and "ValueError: bad batch" in where
    assert not set(where) & set(CONTROLS)


def test_a_local_client_failure_shows_its_own_errors_traceback() -> None:
    try:
        try:
            raise ValueError("\x1b[2Jbad batch")
        except ValueError as error:
            raise ClientUpdateFailed((7,), 3, failure_text(error)) from error
    except ClientUpdateFailed as failure:
        where = failure_traceback(failure)
    assert where.startswith("Traceback (most recent call last):") and where.endswith("ValueError: bad batch")
    assert failure_traceback(RuntimeError("the run's own failure")) == ""


def test_a_notice_reaches_the_terminal_as_plain_text_not_markup(capsys: pytest.CaptureFixture[str]) -> None:
    from hdcfl_ray.terminal.live_view import QuietObserver

    QuietObserver().on_notice("tracker mlflow: \x1b[2J\x1b]0;pwned\x07failed ([bold]not markup[/bold])\r")
    assert capsys.readouterr().err.strip() == "note: tracker mlflow: failed ([bold]not markup[/bold])"


def test_trackers_get_the_scenario_run_folder_and_errors_as_plain_text(tmp_path: Path) -> None:
    from hdcfl_ray.config.loading import build_scenario
    from hdcfl_ray.trackers.base import TrackerContext
    from tests.conftest import tiny_scenario

    scenario = build_scenario(tiny_scenario(output={"dir": "runs\x1b[2J\x07/here"}))
    context = TrackerContext(scenario, tmp_path / "run\x1b]0;title\x07-1")
    assert context.parameters()["output.dir"] == "runs/here"
    assert context.run_name == "run-1" and not set(context.tags()["hdcfl_ray.run_dir"]) & set(CONTROLS)


def test_a_failing_trackers_error_is_noted_as_plain_text(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hdcfl_ray.trackers import TRACKERS
    from tests.test_trackers import tracked_run

    monkeypatch.setitem(TRACKERS, "mlflow", (__name__, "pyarrow", "mlflow"))
    run = tracked_run(tmp_path, ["mlflow"])
    (notice,) = run.notices
    assert "tracker mlflow: logging round 1 failed (ConnectionError: the tracking server went away)" in notice
    assert not set(notice) & set(CONTROLS)


class Tracker:
    """A tracker (registered over mlflow's name above) whose error carries terminal codes."""

    def start(self, context: object) -> None:
        pass

    def log_round(self, step: int, metrics: dict[str, float]) -> None:
        raise ConnectionError("\x1b[31mthe tracking server\x1b[0m went away\r\x07")

    def finish(self, status: str) -> None:
        pass
