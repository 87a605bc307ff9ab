"""uvicorn or granian as the HTTP server of the runtime and of the gateway, side by side.

    /tmp/bench-venv/bin/python bench/servers.py    # ROUNDS=3 WARMUP=2 DURATION=8 CONCS="8 32"

The venv needs shipyard, scikit-learn and granian (rloop too, for the granian-rloop
column): ``python3 -m venv /tmp/bench-venv && /tmp/bench-venv/bin/pip install -e .
scikit-learn granian rloop``. wrk must be on PATH (``apt-get install -y wrk``; it is not
kept across machines, and the script stops with that hint when it is missing).

Three apps, each under every server in turn, on 127.0.0.1:

- ``floor``: the peer-benchmark harness's bare ASGI echo app (its ``raw_asgi/app.py``), to
  check the issue's reference figure within this run. The harness is an optional checkout
  (``BENCH_DIR``, bench/README.md); without it leave ``floor`` out of ``APPS``.
- ``runtime``: the built-in runtime (RuntimeApp, ``POST /invocations``) serving the echo
  model (tests/models/echo: no handlers, the default JSON codecs) and the sklearn model
  (LogisticRegression, 20 features, one row per request). uvicorn is
  ``python -m shipyard.runtime``, i.e. ``runtime/server.py serve()`` as it is.
- ``gateway``: ``shipyard serve`` with an endpoint of one instance of each model. Only the
  gateway's server changes; its instance still runs uvicorn. Under granian the head limits
  of http/server.py are replaced by granian's nearest flags, and a probe (with the
  head timeout cut to 2 s so it is quick) shows what each server answers at those limits.

Servers: ``uvicorn`` (uvloop, httptools, as shipyard runs it), ``granian`` (ASGI, one
worker, one runtime thread, HTTP/1 only, uvloop) and ``granian-rloop`` (the same on
granian's Rust event loop; skipped when rloop is not installed). ROUNDS rounds; in each,
every app/model cell runs every server, in an order rotated per round, so drift of this
noisy 2-core machine hits all alike. wrk -t1 per concurrency: WARMUP s discarded, then
DURATION s measured. Prints and writes bench/results/servers-<date>.md: median req/s and
p99 per cell, ratios to uvicorn, every round, the probe and the exact commands.
APPS="runtime" (say) runs only those apps, into servers-<date>-runtime.md; SERVERS picks
servers; GRANIAN_EXTRA adds granian flags. Tried that way on the runtime and left out:
``--runtime-mode st`` or ``mt`` and ``--backpressure 64`` (no better), ``--task-impl rust``
(p99 of 150-350 ms).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import shlex
import shutil
import socket
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from gateway_overhead import check, write_sklearn
from harness import (
    HERE,
    PEER_BODY,
    POST_LUA,
    Control,
    ServerProcess,
    WrkResult,
    cpu_probe_ms,
    entry,
    env_float,
    env_ints,
    free_port,
    http_status,
    measure,
    peer_harness,
    require_wrk,
    table,
    time_budget,
    wait_until,
)

from shipyard.settings import Settings

ROOT = HERE.parent
CELLS = (("floor", "echo"), ("runtime", "echo"), ("runtime", "sklearn"),
         ("gateway", "echo"), ("gateway", "sklearn"))  # fmt: skip
PROBE_TIMEOUT_S = 2.0
"""The gateway's head timeout while probing (default 10 s): the stalled-head case waits it out."""

GRANIAN_BASE = ["--http", "1", "--no-ws", "--workers", "1", "--runtime-threads", "1",
                "--log-level", "warning", "--no-access-log"]  # fmt: skip
"""HTTP/1 only (uvicorn speaks nothing else; no protocol sniffing), no websockets, one
worker and one Rust runtime thread (uvicorn's single process; this machine has 2 cores,
and wrk needs one)."""


@dataclass(frozen=True)
class Started:
    process: ServerProcess
    base: str
    """http://127.0.0.1:PORT"""
    url: str
    """Where wrk POSTs."""
    command: str


def servers() -> list[str]:
    names = os.environ.get("SERVERS", "uvicorn granian granian-rloop").split()
    if "granian-rloop" in names and importlib.util.find_spec("rloop") is None:
        print("rloop is not installed: skipping granian-rloop", file=sys.stderr)
        names.remove("granian-rloop")
    return names


def granian_argv(server: str, interface: str, port: int, target: str, workdir: Path) -> list[str]:
    binary = shutil.which("granian", path=str(Path(sys.executable).parent))
    if binary is None:
        raise RuntimeError(f"granian is not installed beside {sys.executable}")
    loop = "rloop" if server == "granian-rloop" else "uvloop"
    argv = [binary, "--interface", interface, "--host", "127.0.0.1", "--port", str(port)]
    argv += [*GRANIAN_BASE, "--loop", loop, *shlex.split(os.environ.get("GRANIAN_EXTRA", ""))]
    return [*argv, "--working-dir", str(workdir), target]


def gateway_limit_flags(settings: Settings) -> list[str]:
    """granian's nearest equivalents of the gateway's head limits (http/server.py).

    hyper answers 431 once a head outgrows the read buffer (in practice somewhat past it:
    see the probe), and drops a connection whose head is late after the header read
    timeout. Its limit of 100 headers is fixed (not a flag), which
    happens to be ``max_headers``'s default.
    """
    buffer = max(8192, settings.max_head_bytes)
    timeout_ms = min(60_000, max(1, round(settings.head_timeout_s * 1000)))
    return ["--http1-buffer-size", str(buffer), "--http1-header-read-timeout", str(timeout_ms)]


def launch(
    name: str, argv: list[str], env: dict[str, str], ready: str, log: Path, work: Path
) -> tuple[ServerProcess, str]:
    """Start ``argv``; once GET ``ready`` (a path) answers as expected, the process and base URL."""
    port = int(argv[argv.index("--port") + 1])
    base = f"http://127.0.0.1:{port}"
    process = ServerProcess.start(name, argv, log, env)

    def up() -> bool:
        if not process.alive():
            raise RuntimeError(f"{name} exited early:\n{process.log_tail()}")
        status = http_status(base + ready)
        return status == 200 if ready != "/" else status != 0

    try:
        wait_until(up, 90, f"{name} {ready}")
    except BaseException:
        process.stop()
        raise
    return process, base


def start(
    app: str, model: str, server: str, model_dir: Path, work: Path, env: dict[str, str]
) -> Started:
    """``app`` serving ``model`` under ``server``, answering; for the gateway, deployed."""
    port = free_port()
    py = sys.executable
    log = work / f"{app}-{model}-{server}.log"
    home = work / f"home-{model}-{server}-{port}"
    if app == "floor":
        env = {**env, "BENCH_MODEL": model}
        raw_asgi = peer_harness() / "raw_asgi"
        if server == "uvicorn":
            argv = [py, "-m", "uvicorn", "app:app", "--app-dir", str(raw_asgi), "--host",
                    "127.0.0.1", "--port", str(port), "--loop", "uvloop", "--http",
                    "httptools", "--no-access-log", "--log-level", "warning"]  # fmt: skip
        else:
            argv = granian_argv(server, "asgi", port, "app:app", raw_asgi)
        ready, path = "/", "/"
    elif app == "runtime":
        if server == "uvicorn":
            argv = [py, "-m", "shipyard.runtime", "--port", str(port)]
            argv += ["--model-dir", str(model_dir)]
        else:
            # asginl: ASGI without lifespan, as serve() runs uvicorn (lifespan="off").
            argv = granian_argv(server, "asginl", port, "granian_targets:runtime", HERE)
            env = {**env, "BENCH_MODEL_DIR": str(model_dir)}
        ready, path = "/ping", "/invocations"
    else:
        home.mkdir(parents=True)
        if server == "uvicorn":
            argv = [py, "-m", "shipyard", "serve", "--host", "127.0.0.1", "--port", str(port),
                    "--home", str(home)]  # fmt: skip
        else:
            argv = granian_argv(server, "asgi", port, "granian_targets:gateway", HERE)
            argv[-3:-3] = gateway_limit_flags(Settings())
            env = {**env, "BENCH_HOME": str(home)}
        ready, path = "/healthz", f"/endpoints/{model}/invocations"
    process, base = launch(f"{app}-{server}", argv, env, ready, log, work)
    try:
        if app == "gateway":
            process.track()
            Control(base).deploy(model, model_dir.as_uri(), count=1)
            process.track()
        check(base + path, PEER_BODY.read_bytes(), model)
    except BaseException:
        process.stop()
        raise
    shown = [f"{k}={v}" for k, v in env.items()] + argv
    command = _redact(shown, port, work, model_dir, home)
    return Started(process, base, base + path, command)


def _redact(argv: list[str], port: int, work: Path, model_dir: Path, home: Path) -> str:
    """``argv`` as a shell line, with the run's port and folders as placeholders."""
    text = shlex.join(argv).replace(str(home), "$HOME_DIR").replace(str(model_dir), "$MODEL_DIR")
    text = text.replace(str(work), "$WORK").replace(str(port), "$PORT")
    return text.replace(sys.executable, "python").replace(str(HERE), "bench")


# ----------------------------------------------------------------------------- head probe
def _head(extra: int = 0, big: int = 0) -> bytes:
    lines = [b"GET /healthz HTTP/1.1", b"Host: 127.0.0.1"]
    lines += [b"X-H%d: v" % i for i in range(extra)]
    if big:
        lines.append(b"X-Big: " + b"a" * big)
    return b"\r\n".join(lines) + b"\r\n\r\n"


def _exchange(port: int, data: bytes, *, wait_s: float, then_idle: bool = False) -> str:
    """What the server does with ``data``: its status (with the time when slow) or how it ended.

    ``then_idle``: after the whole answer, how long the server keeps the idle connection.
    """
    with socket.create_connection(("127.0.0.1", port), timeout=wait_s) as sock:
        started = time.monotonic()
        try:
            sock.sendall(data)
        except OSError:
            pass  # it may answer and close before the whole head is sent: read the answer
        try:
            answer = _read_answer(sock)
            if then_idle and answer:
                started = time.monotonic()
                more = sock.recv(65536)
                took = time.monotonic() - started
                return f"closed after {took:.1f} s idle" if not more else f"sent {more[:20]!r}"
        except TimeoutError:
            return f"open after {wait_s:g} s"
        except ConnectionResetError:
            return f"reset after {time.monotonic() - started:.1f} s"
    took = time.monotonic() - started
    if not answer:
        return f"closed, no answer, after {took:.1f} s"
    status = answer.split(b" ", 2)[1].decode()
    return f"{status} after {took:.1f} s" if took > 0.5 else status


def _read_answer(sock: socket.socket) -> bytes:
    """One whole answer (head, then content-length bytes), or what came before the close."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return data


PROBES = (
    ("100 headers", lambda port: _exchange(port, _head(extra=99), wait_s=5)),
    ("101 headers", lambda port: _exchange(port, _head(extra=100), wait_s=5)),
    ("head of 60,000 bytes", lambda port: _exchange(port, _head(big=60_000), wait_s=5)),
    ("head of 70,000 bytes", lambda port: _exchange(port, _head(big=70_000), wait_s=5)),
    ("head of 100,000 bytes", lambda port: _exchange(port, _head(big=100_000), wait_s=5)),
    ("head of 1 MB", lambda port: _exchange(port, _head(big=1_000_000), wait_s=5)),
    (
        "head begun, never finished",
        lambda port: _exchange(port, _head()[:-2], wait_s=PROBE_TIMEOUT_S + 4),
    ),
    (
        "idle keep-alive after an answer",
        lambda port: _exchange(port, _head(), wait_s=PROBE_TIMEOUT_S + 4, then_idle=True),
    ),
)


def probe_limits(names: list[str], work: Path) -> dict[str, dict[str, str]]:
    """For each server, the gateway's answer to each of PROBES (head timeout 2 s)."""
    env = {"SHIPYARD_HEAD_TIMEOUT_S": str(PROBE_TIMEOUT_S)}
    found: dict[str, dict[str, str]] = {}
    for server in names:
        port = free_port()
        home = work / f"probe-{server}"
        home.mkdir()
        if server == "uvicorn":
            argv = [sys.executable, "-m", "shipyard", "serve", "--host", "127.0.0.1", "--port",
                    str(port), "--home", str(home)]  # fmt: skip
        else:
            argv = granian_argv(server, "asgi", port, "granian_targets:gateway", HERE)
            argv[-3:-3] = gateway_limit_flags(Settings(head_timeout_s=PROBE_TIMEOUT_S))
        process, _ = launch(
            f"probe-{server}", argv, {**env, "BENCH_HOME": str(home)}, "/healthz",
            work / f"probe-{server}.log", work,
        )  # fmt: skip
        try:
            found[server] = {name: run(port) for name, run in PROBES}
        finally:
            process.stop()
        print(f"head limits, {server}: {found[server]}", file=sys.stderr, flush=True)
    return found


# ----------------------------------------------------------------------------- the run
@dataclass(frozen=True)
class Row:
    round: int
    app: str
    model: str
    server: str
    conc: int
    result: WrkResult


def main() -> int:
    require_wrk()
    names = servers()
    rounds = int(env_float("ROUNDS", 3))
    timing = (env_float("WARMUP", 2.0), env_float("DURATION", 8.0))
    concs = env_ints("CONCS", [8, 32])
    apps = os.environ.get("APPS", "floor runtime gateway").split()
    if "floor" in apps:
        peer_harness()  # exits now, saying what is needed, rather than mid-run
    cells = [cell for cell in CELLS if cell[0] in apps]
    runs = rounds * len(cells) * len(names)
    budget = runs * (len(concs) * (sum(timing) + 3) + 20) + 300
    started_at = datetime.now(UTC)
    rows: list[Row] = []
    commands: dict[tuple[str, str], str] = {}
    probes_before = [cpu_probe_ms()]
    loads = [os.getloadavg()[0]]
    with time_budget(budget), tempfile.TemporaryDirectory(prefix="bench-servers-") as tmp:
        work = Path(tmp)
        models = {"echo": work / "echo", "sklearn": work / "sklearn"}
        shutil.copytree(ROOT / "tests" / "models" / "echo", models["echo"])
        if not write_sklearn(models["sklearn"]):
            raise RuntimeError("scikit-learn is not importable: use a venv that has it")
        limits = probe_limits(names, work) if "gateway" in apps else {}
        for round_ in range(rounds):
            order = names[round_ % len(names) :] + names[: round_ % len(names)]
            for app, model in cells:
                for server in order:
                    s = start(app, model, server, models[model], work, {})
                    commands[(app, server)] = s.command
                    try:
                        for c in concs:
                            result = measure(s.url, PEER_BODY, c, *timing)
                            rows.append(Row(round_ + 1, app, model, server, c, result))
                            print(
                                f"round {round_ + 1} {app} {model} {server} c={c}: "
                                f"{result.rps:,.0f} req/s p99 {result.p99_ms:.2f} ms "
                                f"errors {result.errors}",
                                file=sys.stderr,
                                flush=True,
                            )
                    finally:
                        s.process.stop()
            probes_before.append(cpu_probe_ms())
            loads.append(os.getloadavg()[0])
    report = write_report(rows, names, limits, commands, (started_at, probes_before, loads), timing)
    print(report)
    return 0


# ----------------------------------------------------------------------------- the report
def summary(rows: list[Row], names: list[str]) -> str:
    """Median req/s and p99 per cell and server; each granian's ratio to uvicorn."""
    cells = sorted({(r.app, r.model, r.conc) for r in rows}, key=_cell_order)
    headers = ["app", "model", "conc"]
    for server in names:
        headers += [f"{server} req/s", f"{server} p99 ms"]
    headers += [f"{s} / uvicorn (rounds)" for s in names if s != "uvicorn"]
    out: list[list[object]] = []
    for app, model, conc in cells:
        mine = [r for r in rows if (r.app, r.model, r.conc) == (app, model, conc)]
        line: list[object] = [app, model, conc]
        median: dict[str, float] = {}
        for server in names:
            got = [r.result for r in mine if r.server == server]
            median[server] = statistics.median(g.rps for g in got)
            errors = sum(g.errors for g in got)
            line += [median[server], statistics.median(g.p99_ms for g in got)]
            if errors:
                line[-2] = f"{median[server]:,.0f} ({errors} errors)"
        for server in names:
            if server == "uvicorn":
                continue
            per_round = [
                g.result.rps / u.result.rps
                for g in mine
                for u in mine
                if g.server == server and u.server == "uvicorn" and g.round == u.round
            ]
            ratio = median[server] / median["uvicorn"]
            line.append(f"**{ratio:.2f}** ({min(per_round):.2f}–{max(per_round):.2f})")
        out.append(line)
    return table(headers, out)


def _cell_order(cell: tuple[str, str, int]) -> tuple[int, int]:
    return CELLS.index((cell[0], cell[1])), cell[2]


def write_report(
    rows: list[Row],
    names: list[str],
    limits: dict[str, dict[str, str]],
    commands: dict[tuple[str, str], str],
    when: tuple[datetime, list[float], list[float]],
    timing: tuple[float, float],
) -> str:
    started_at, cpu_probes, loads = when
    rounds = max(r.round for r in rows)
    concs = sorted({r.conc for r in rows})
    every = table(
        ["round", "app", "model", "server", "conc", "req/s", "p50 ms", "p99 ms", "errors",
         "busy cores"],
        [
            [r.round, r.app, r.model, r.server, r.conc, r.result.rps, r.result.p50_ms,
             r.result.p99_ms, r.result.errors, r.result.busy_cores]
            for r in sorted(rows, key=lambda r: (_cell_order((r.app, r.model, r.conc)), r.round))
        ],
    )  # fmt: skip
    probe_rows = [[case, *(limits[s][case] for s in names)] for case, _ in PROBES] if limits else []
    knobs = f"ROUNDS={rounds} WARMUP={timing[0]:g} DURATION={timing[1]:g}"
    knobs += f' CONCS="{" ".join(map(str, concs))}"'
    if os.environ.get("APPS"):
        knobs += f' APPS="{os.environ["APPS"]}"'
    probe_flags = " ".join(gateway_limit_flags(Settings(head_timeout_s=PROBE_TIMEOUT_S)))
    versions = ", ".join(
        f"{p} {_version(p)}" for p in ("uvicorn", "httptools", "uvloop", "granian", "rloop")
    )
    wrk = (
        f"BENCH_BODY_FILE={PEER_BODY} wrk -t1 -c$CONC -d{timing[0]:g}s --timeout 30s --latency "
        f"-s bench/{POST_LUA.name} $URL   # warm-up, discarded\n"
        f"BENCH_BODY_FILE={PEER_BODY} wrk -t1 -c$CONC -d{timing[1]:g}s --timeout 30s --latency "
        f"-s bench/{POST_LUA.name} $URL   # measured"
    )
    lines = [
        f"# uvicorn and granian under shipyard's runtime and gateway ({started_at:%Y-%m-%d})",
        "",
        f"`{knobs} /tmp/bench-venv/bin/python bench/servers.py`, from the project root; "
        f"started {started_at:%Y-%m-%d %H:%M} UTC, finished {datetime.now(UTC):%H:%M} UTC.",
        f"Python {platform.python_version()}; {versions}; {os.cpu_count()} cores shared by "
        "server and wrk. CPU probe (ms, lower = faster; before the run, then after each round): "
        + ", ".join(f"{p:g}" for p in cpu_probes)
        + "; load average (1 min) at the same points: "
        + ", ".join(f"{x:.1f}" for x in loads)
        + ".",
        "",
        f"## Median of {rounds} interleaved rounds: req/s and p99 (wrk's, ms)",
        "",
        "Ratio: median req/s of the granian column over uvicorn's; in brackets the lowest and "
        "highest ratio within one round (same round, back to back).",
        "",
        summary(rows, names),
        "",
        "## Head limits of the gateway (probe, head timeout 2 s)",
        "",
        "uvicorn: http/server.py (max_headers 100, max_head_bytes 65536, "
        f"head_timeout_s). granian: {probe_flags}.",
        "",
        table(["request", *names], probe_rows) if probe_rows else "(not run)",
        "",
        "## Every round",
        "",
        every,
        "",
        "## Commands",
        "",
        f"Servers (python is the venv's interpreter, {sys.executable}; $PORT a free port; "
        "$MODEL_DIR the echo model (a copy of tests/models/echo) "
        "or the sklearn model; $HOME_DIR a fresh gateway home; gateway cells then deploy "
        "endpoint <model> of one instance and wrk POSTs /endpoints/<model>/invocations):",
        "",
        "```",
        *(f"# {app}, {server}\n{cmd}" for (app, server), cmd in sorted(commands.items())),
        "```",
        "",
        "Load, per concurrency ($URL: /invocations for the runtime, / for the floor):",
        "",
        "```",
        wrk,
        "```",
        "",
    ]  # fmt: skip
    text = "\n".join(lines)
    ran = {r.app for r in rows}
    only = "" if ran == {a for a, _ in CELLS} else "-" + "-".join(sorted(ran))
    out = HERE / "results" / f"servers-{started_at:%Y-%m-%d}{only}.md"
    out.write_text(text)
    print(f"wrote {out}", file=sys.stderr)
    return text


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    entry(main)
