"""The gateway reads a job's files (its log, status and PID files) from a folder the job's
code writes: a link or a FIFO put in place of one is never followed, never waited on.

Each reader of a job's log is tried: GET /jobs/{name}/logs (gateway/api/facade.py),
GetLogEvents (logs/service.py), the console's log view, the status lines and the PID
files the backend reads.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from shipyard.backends.local import LocalBackend
from shipyard.gateway.api.facade import _read_from
from shipyard.gateway.console.door import _read_log
from shipyard.job_contract import open_untrusted, read_status, untrusted_size
from shipyard.logs.service import LogStream, _lines

SECRET = b"the gateway's secret\n"


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    path = tmp_path / "secret.txt"
    path.write_bytes(SECRET)
    return path


@pytest.fixture
def linked(tmp_path: Path, secret: Path) -> Path:
    """A job's log that its code replaced with a link to the secret."""
    log = tmp_path / "attempt-1" / "job.log"
    log.parent.mkdir()
    log.symlink_to(secret)
    return log


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    """A job's log that its code replaced with a FIFO nobody writes."""
    log = tmp_path / "attempt-2" / "job.log"
    log.parent.mkdir()
    os.mkfifo(log)
    return log


def test_open_untrusted_reads_a_file_and_refuses_a_link(tmp_path: Path, linked: Path) -> None:
    plain = tmp_path / "plain.log"
    plain.write_bytes(b"line\n")
    with open_untrusted(plain) as f:
        assert f.read() == b"line\n"
    assert untrusted_size(plain) == 5
    with pytest.raises(OSError):
        open_untrusted(linked)
    assert untrusted_size(linked) == 0, "a link's target is not even measured"
    with pytest.raises(FileNotFoundError):
        open_untrusted(tmp_path / "missing")


@pytest.mark.timeout(10)
def test_open_untrusted_neither_waits_on_nor_reads_a_fifo(fifo: Path) -> None:
    with pytest.raises(OSError, match="not a regular file"):
        open_untrusted(fifo)
    with pytest.raises(OSError):
        open_untrusted(fifo, append=True)  # no reader: refused at once, not waited on
    assert untrusted_size(fifo) == 0


def test_appending_never_writes_through_a_link(tmp_path: Path, secret: Path, linked: Path) -> None:
    with pytest.raises(OSError):
        open_untrusted(linked, append=True)
    assert secret.read_bytes() == SECRET
    made = tmp_path / "runner.log"
    with open_untrusted(made, append=True) as f:
        f.write(b"one\n")
    with open_untrusted(made, append=True) as f:
        f.write(b"two\n")
    assert made.read_bytes() == b"one\ntwo\n"


@pytest.mark.timeout(10)
def test_no_log_reader_serves_a_linked_log_or_waits_on_a_fifo(linked: Path, fifo: Path) -> None:
    for files in ([linked], [fifo], [linked, fifo]):
        assert _read_from(files, 0) == b""
        assert list(_lines(tuple(files), 0)) == []
        assert LogStream("j/algo-1-0", tuple(files), 0).size() == 0
        assert _read_log(files, None, True) == ("", 0)
        assert _read_log(files, 0, True) == ("", 0)


@pytest.mark.timeout(10)
def test_status_lines_are_not_followed(tmp_path: Path, linked: Path, fifo: Path) -> None:
    with pytest.raises(ValueError, match="cannot be read"):
        read_status(linked)
    with pytest.raises(ValueError, match="cannot be read"):
        read_status(fifo)
    assert read_status(tmp_path / "missing") == []


@pytest.mark.timeout(10)
def test_pid_files_are_not_followed(tmp_path: Path) -> None:
    """The backend reads a runner's PID from its folder: a link to a file holding a PID
    (init's, here) is not taken for it, nor is a FIFO waited on."""
    workdir = tmp_path / "attempt-3"
    workdir.mkdir()
    (tmp_path / "init.pid").write_text("1\n")
    (workdir / "runner.pid").symlink_to(tmp_path / "init.pid")
    backend = LocalBackend(run_dir=tmp_path / "run")
    assert backend.find_job(workdir) is None
    (workdir / "runner.pid").unlink()
    os.mkfifo(workdir / "runner.pid")
    assert backend.find_job(workdir) is None
