"""The demo's services log: each run starts one, the run before is kept."""

from pathlib import Path

from app.demo import fresh_log


def test_the_last_runs_log_is_kept_and_the_new_one_starts_empty(tmp_path: Path):
    log = tmp_path / "demo" / "services.log"
    assert fresh_log(log) is None  # nothing before: the folder is made, nothing kept
    assert log.read_text() == ""
    log.write_text("run 1\n")
    kept = fresh_log(log)
    assert kept == tmp_path / "demo" / "services.log.1"
    assert kept.read_text() == "run 1\n"
    assert log.read_text() == ""
    log.write_text("run 2\n")
    fresh_log(log)
    assert kept.read_text() == "run 2\n"  # one generation: run 1 is gone


def test_an_empty_log_does_not_replace_the_one_kept(tmp_path: Path):
    """A run that wrote nothing (stopped at once) leaves the last real log in place."""
    log = tmp_path / "services.log"
    log.write_text("run 1\n")
    fresh_log(log)
    fresh_log(log)  # the log of a run that wrote nothing
    assert (tmp_path / "services.log.1").read_text() == "run 1\n"
