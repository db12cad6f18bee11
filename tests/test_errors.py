"""kit.errors and the CLI's error paths: every exception ends in one line and the exit code `exit_code` gives
(130 for Ctrl-C, 2 for anything else); an unforeseen one leaves its traceback in a log file the line names,
or on stderr with KIT_DEBUG=1; a UsageError's parameter is named as the command's option."""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

import pytest

from kit.cli import commands, main
from kit.errors import EXIT, InputError, KitError, UsageError, exit_code
from kit.pipeline import cell
from kit.rundir import check_folder


def test_exit_code_is_the_one_mapping() -> None:
    assert exit_code(KeyboardInterrupt()) == EXIT["interrupted"] == 130
    for exc in (KitError("x"), UsageError("x", param="p"), RuntimeError("x"), OSError(30, "ro")):
        assert exit_code(exc) == EXIT["error"] == 2
    assert EXIT["fail"] not in {exit_code(e) for e in (KitError("x"), ValueError("x"), KeyboardInterrupt())}


def _raising(exc: BaseException):
    def cmd(_args: object) -> int:
        raise exc

    return cmd


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("KIT_DEBUG", raising=False)
    return tmp_path / "cache" / "pr29654-kit" / "errors"


def test_unforeseen_error_is_one_line_and_a_log(
    cache: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(commands, "cmd_evidence", _raising(ZeroDivisionError("boom\nsecond line")))
    assert main(["evidence", "anything"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("kit evidence: error: ZeroDivisionError: boom (unforeseen"), err
    log = Path(re.search(r"traceback is in (\S+\.log)", err).group(1))
    assert log.parent == cache
    text = log.read_text()
    assert "Traceback (most recent call last)" in text and "ZeroDivisionError: boom" in text


def test_the_log_falls_back_to_the_temp_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A cache that cannot hold the log (here: a file where the folder would be) is skipped, not fatal."""
    (tmp_path / "cache").write_text("a file")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    monkeypatch.setattr(commands, "cmd_evidence", _raising(RuntimeError("x")))
    assert main(["evidence", "anything"]) == 2
    log = Path(re.search(r"traceback is in (\S+\.log)", capsys.readouterr().err).group(1))
    assert log.parent == tmp_path / "tmp" / "pr29654-kit-errors" and "RuntimeError" in log.read_text()


def test_kit_debug_prints_the_traceback(
    cache: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KIT_DEBUG", "1")
    monkeypatch.setattr(commands, "cmd_evidence", _raising(RuntimeError("boom")))
    assert main(["evidence", "anything"]) == 2
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "kit evidence: error: RuntimeError: boom" in err
    assert not cache.exists()  # shown, so not logged


def test_a_kit_error_is_its_one_line_and_logs_nothing(
    cache: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(commands, "cmd_evidence", _raising(InputError("x is damaged: remake it", path="x")))
    assert main(["evidence", "anything"]) == 2
    assert capsys.readouterr().err == "kit evidence: error: x is damaged: remake it\n"
    assert not cache.exists()


def test_ctrl_c_is_130(
    cache: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(commands, "cmd_evidence", _raising(KeyboardInterrupt()))
    assert main(["evidence", "anything"]) == 130
    assert capsys.readouterr().err == "kit evidence: interrupted\n"


@pytest.mark.parametrize(
    ("param", "message", "line"),
    [
        ("seed", "seed must be >= 0", "--seed: seed must be >= 0"),  # a params key that is an option
        ("--batch", "invalid batch 'a b'", "--batch: invalid batch 'a b'"),
        ("axes.arm", "unknown arm", "axes.arm: unknown arm"),  # a matrix key: named as the YAML says it
        ("--batch", "--batch x: taken", "--batch x: taken"),  # already named: not twice
        (None, "no parameter", "no parameter"),
    ],
)
def test_a_usage_error_names_its_parameter(
    param: str | None,
    message: str,
    line: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(commands, "cmd_make_checkpoint", _raising(UsageError(message, param=param)))
    assert main(["make-checkpoint", "dir"]) == 2
    assert capsys.readouterr().err == f"kit make-checkpoint: error: {line}\n"


def test_a_real_usage_error_names_the_option(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """kit make-checkpoint --seed -1: the checkpoint's own check raises UsageError(param="seed")."""
    assert main(["make-checkpoint", str(tmp_path / "ck"), "--seed", "-1"]) == 2
    assert capsys.readouterr().err.startswith("kit make-checkpoint: error: --seed: seed must be")
    assert not (tmp_path / "ck").exists()


def test_a_plain_stage_maps_exceptions_through_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    """The batch's plain runner (`python -m kit.pipeline.cell`): the same codes as the CLI."""
    assert cell.main(["analyze", "/nonexistent/run"]) == exit_code(KitError("x")) == 2
    assert "Error: " in capsys.readouterr().err.strip().splitlines()[-1]


def test_check_folder_refuses_an_unwritable_folder(tmp_path: Path) -> None:
    """The writable check runs on the folder the write would land in: the path itself, else its nearest
    existing parent. Made unwritable by the user cases' helper (a read-only bind mount when root)."""
    from test_user_cases import read_only

    ro = tmp_path / "ro"
    code = (
        "import sys; from kit.rundir import check_folder; from kit.errors import NotWritable\n"
        "try:\n    check_folder(sys.argv[1], 'the test', '--out')\n"
        "except NotWritable as e:\n    print('REFUSED', e.path, e)\n"
    )
    _, out = read_only("ro")(tmp_path, [sys.executable, "-c", code, str(ro / "new" / "deeper")])
    assert out.startswith(f"REFUSED {ro} cannot write the test in {ro}: "), out
    assert "pass --out a folder you can write" in out
    check_folder(ro / "new" / "deeper", "the test")  # writable again outside: passes
    (tmp_path / "f").write_text("")
    with pytest.raises(InputError, match="is a file, not a folder"):  # a file in the way: as before
        check_folder(tmp_path / "f" / "x", "the test")


def test_new_folder_is_one_line_when_it_exists_races_or_cannot_be_made(tmp_path: Path) -> None:
    """The fuzzer's and the suite's OUT: made once; a second maker (also one racing the first), or a folder
    the system refuses (/sys, even to root), gets a one-line error of exit 2, never a traceback."""
    import threading

    from kit.errors import ExistsError, NotWritable
    from kit.rundir import new_folder

    target = tmp_path / "a" / "out"
    got: list[str] = []

    def make() -> None:
        try:
            new_folder(target, "runs")
            got.append("made")
        except ExistsError:
            got.append("exists")

    threads = [threading.Thread(target=make) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == ["exists", "exists", "exists", "made"] and target.is_dir()
    with pytest.raises(NotWritable, match="cannot create /sys/kit-new-folder for runs") as e:
        new_folder(Path("/sys/kit-new-folder"), "runs")
    assert exit_code(e.value) == EXIT["error"]


def test_an_engine_failure_names_its_cause_not_nsys_trailer(tmp_path: Path) -> None:
    """A profiled engine that fails: its one line names the exception, not nsys's closing "End of file"."""
    from kit.proc import engine_failed, failure_line

    log = tmp_path / "engine.log"
    trailer = "Generating '/tmp/nsys-report-1.qdstrm'\n[1/1] [==100%] profile.nsys-rep\nGenerated:\n"
    trailer += "    /tmp/r/profile.nsys-rep\nEnd of file\n"
    log.write_text("Traceback (most recent call last):\nRuntimeError: sizes differ (2 vs 1)\n" + trailer)
    assert engine_failed(1, log).endswith(": RuntimeError: sizes differ (2 vs 1)")
    log.write_text("cell c0001 done\n" + trailer)
    assert failure_line(log) == "cell c0001 done"
    log.write_text(trailer)
    assert "nothing but nsys" in failure_line(log)
