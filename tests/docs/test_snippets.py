"""Every code block of the README and of docs/ that a reader would paste runs, as
pasted, against a real gateway: a renamed parameter, a missing import or a wrong name in
the docs fails here.

Each page gets its own gateway on a free port, started as ``make run`` starts one
(``--demo``) where the page tells its reader to have ``make run`` going, and its own
folder as the working directory. A page's blocks run in order on one xdist worker; the
pages spread over the workers.

The pages say ``http://127.0.0.1:8080`` (the CLI's default URL too). Before a block runs,
the runner replaces in its text ``127.0.0.1:8080`` by the test gateway's address,
``.venv/bin/`` by the folder of this interpreter, the placeholder ``/path/to/`` (a path
the page asks the reader to give) by the page's folder, and the example folder ``/srv/``
by a folder ``srv`` in it; bash blocks also get ``SHIPYARD_URL``. Nothing else in a block
is changed. Files a page shows (a stack file) are written with the same replacements.

Python blocks of one page run in order in one namespace, in this process, so a later
block uses an earlier one's names; a line ``print(...)  # what`` says what it prints,
and the block's output must have that line, in order. Bash blocks run with
``bash -eu -o pipefail``, answering ``y`` to whatever asks (``shipyard apply``). A
reader's AWS configuration is not there: the blocks bring their own region and
credentials.

How a page marks a block it cannot run here (and why), a file it shows, or what its
reader has from an earlier page: tests/docs/snippets.py.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import GatewayProcess, free_port, start_gateway, wait_in_service
from tests.docs.setups import SETUPS
from tests.docs.snippets import ROOT, Block, MarkerError, Page, pages, read_page

PAGES = [page for page in map(read_page, pages()) if page.blocks]
BIN = Path(sys.executable).parent
_PRINT_SAYS = re.compile(r"^print\(.*\)\s+#\s*(.+)$")


def _demo(page: Page) -> bool:
    """Whether the page's reader has ``make run`` going, and so the endpoint ``demo``."""
    return "`make run` going" in (ROOT / page.path).read_text()


@dataclass
class PageRun:
    """A page being run: its gateway, its folder and its Python namespace."""

    page: Page
    folder: Path
    gateway: GatewayProcess | None = None
    namespace: dict[str, Any] = field(default_factory=dict)
    failed_at: str | None = None
    ports: dict[str, str] = field(default_factory=dict)
    """The page's ports (``127.0.0.1:8081``) and the test gateway's ones in their place."""

    def start(self) -> GatewayProcess:
        if self.gateway is None:
            (self.folder / "srv").mkdir(exist_ok=True)
            home = self.folder.with_name(f"{self.folder.name}-home")  # not in a model folder
            demo = _demo(self.page)
            args = self._serve_args() + (["--demo"] if demo else [])
            self.gateway = start_gateway(home, args=args)
            self.ports["127.0.0.1:8080"] = self.gateway.url.removeprefix("http://")
            if demo:  # `make run` has it by the time one pastes
                wait_in_service(self.gateway.sm, "demo")
            for name in self.page.setups:
                SETUPS[name](self.gateway, self.folder, self.namespace)
        return self.gateway

    def _serve_args(self) -> list[str]:
        """The arguments of the page's ``shipyard serve`` block, its ports made free."""
        serves = [block for block in self.page.blocks if block.serves]
        if not serves:
            return []
        argv = shlex.split(serves[0].code, comments=True)
        assert argv[:2] == ["shipyard", "serve"], f"{serves[0].where}: not shipyard serve"
        args = argv[2:]
        for i, arg in enumerate(args[:-1]):
            if arg.endswith("-port"):
                port = str(free_port())
                self.ports[f"127.0.0.1:{args[i + 1]}"] = f"127.0.0.1:{port}"
                args[i + 1] = port
        return args

    def stop(self) -> None:
        if self.gateway is not None:
            self.gateway.stop()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, PageRun]]:
    started: dict[str, PageRun] = {}
    yield started
    for run in started.values():
        run.stop()


@pytest.fixture
def no_aws_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The blocks run without the developer's AWS configuration, as on a fresh machine."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))


def test_every_page_names_only_known_setups() -> None:
    for page in PAGES:
        unknown = set(page.setups) - set(SETUPS)
        assert not unknown, f"{page.path}: unknown setup {sorted(unknown)} ({sorted(SETUPS)})"


@pytest.mark.parametrize(
    ("page", "block"),
    [
        pytest.param(page, block, marks=pytest.mark.xdist_group(f"snippets-{page.path}"))
        for page in PAGES
        for block in page.blocks
    ],
    ids=lambda value: value.path if isinstance(value, Page) else f"line{value.line}",
)
@pytest.mark.usefixtures("no_aws_config")
def test_block_runs_as_pasted(
    page: Page,
    block: Block,
    runs: dict[str, PageRun],
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if page.path not in runs:
        folder = tmp_path_factory.mktemp(Path(page.path).stem)
        runs[page.path] = PageRun(page, folder)
    run = runs[page.path]
    try:
        if block.skip is not None:
            pytest.skip(f"{block.where}: {block.skip}")
        if run.failed_at is not None:
            pytest.skip(f"{block.where}: not run, as the page's block at {run.failed_at} failed")
        if block.file is not None:
            target = run.folder / block.file
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(_text(block, run.folder, run.ports))
            return
        try:
            gw = run.start()
            monkeypatch.chdir(run.folder)
            if block.serves:
                return  # the gateway started with its arguments
            if block.language == "python":
                _run_python(block, _text(block, run.folder, run.ports), run.namespace)
            else:
                _run_bash(block, _text(block, run.folder, run.ports), gw, run.folder)
        except BaseException:
            run.failed_at = block.where
            raise
    finally:
        if block is page.blocks[-1]:
            run.stop()


def _text(block: Block, folder: Path, ports: dict[str, str]) -> str:
    text = block.code.replace(".venv/bin/", f"{BIN}/").replace("/path/to/", f"{folder}/")
    text = text.replace("/srv/", f"{folder}/srv/")
    for page_port, test_port in ports.items():
        text = text.replace(page_port, test_port)
    return text


def _run_python(block: Block, text: str, namespace: dict[str, Any]) -> None:
    # Blank lines ahead, so that a traceback names the page's own line numbers.
    source = "\n" * (block.line - 1) + text
    namespace.setdefault("__name__", "__snippet__")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(source, str(ROOT / block.page), "exec"), namespace)
    sys.stdout.write(printed.getvalue())  # shown with a failure, as pytest captures it
    lines = iter(printed.getvalue().splitlines())
    for n, said in _said_printed(block):
        assert any(line.strip() == said for line in lines), (
            f"{block.page}:{n} says it prints {said!r}; printed:\n{printed.getvalue()}"
        )


def _said_printed(block: Block) -> Iterator[tuple[int, str]]:
    """The line and text of each ``print(...)  # text`` of the block."""
    for n, line in enumerate(block.code.splitlines(), start=block.line):
        if (found := _PRINT_SAYS.match(line)) is not None:
            yield n, found.group(1).strip()


def _run_bash(block: Block, text: str, gw: GatewayProcess, folder: Path) -> None:
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "SHIPYARD_URL": gw.url}
    with contextlib.suppress(KeyError):
        del env["VIRTUAL_ENV"]
    with tempfile.TemporaryFile() as answers:
        # A file rather than a pipe: each command reads a buffer's worth and leaves the
        # rest, at the file's offset, to the next one.
        answers.write(b"y\n" * 50_000)
        answers.seek(0)
        done = subprocess.run(
            ["bash", "-eu", "-o", "pipefail", "-c", text],
            cwd=folder,
            env=env,
            stdin=answers,
            capture_output=True,
            text=True,
            timeout=90,
            check=False,
        )
    assert done.returncode == 0, (
        f"{block.where}: exit status {done.returncode}\n--- stdout\n{done.stdout}"
        f"\n--- stderr\n{done.stderr}\n--- gateway log (tail)\n{gw.log()[-3000:]}"
    )


@pytest.mark.parametrize(
    "marker",
    [
        "<!-- snippet: skip -->",  # no reason
        "<!-- snippet: skpi (a typo) -->",
        "<!-- snippet: skip (not before a fence) -->\n\ntext\n",
        "<!-- snippet: gateway -->\n```yaml\nnot: run\n```\n",
    ],
)
def test_a_marker_the_runner_cannot_follow_is_an_error(tmp_path: Path, marker: str) -> None:
    page = tmp_path / "page.md"
    page.write_text(f"# A page\n\n{marker}\n```python\nprint(1)\n```\n")
    with pytest.raises(MarkerError):
        read_page(page, "page.md")


def test_blocks_are_read_with_their_markers_files_and_lines(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- snippet: setup clients, scores -->\n"
        "<!-- snippet: gateway -->\n"
        "```bash\nshipyard serve --grpc-port 8081\n```\n"
        "```python\nx = 1\n```\n"
        "<!-- snippet: skip (needs a Ray cluster) -->\n"
        "```sh\nray start --head\n```\n"
        "```yaml\n# stack.yaml\nmodels: {}\n```\n"
        "```yaml\nnot: a file\n```\n"
    )
    read = read_page(page, "page.md")
    assert read.setups == ("clients", "scores")
    assert [(b.line, b.language, b.skip, b.file, b.serves) for b in read.blocks] == [
        (4, "bash", None, None, True),
        (7, "python", None, None, False),
        (11, "bash", "needs a Ray cluster", None, False),
        (14, "yaml", None, "stack.yaml", False),
    ]
