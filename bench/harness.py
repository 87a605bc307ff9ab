"""What every benchmark here needs: processes stopped by PID, a gateway, wrk, a table.

Standard library only, so the peer wrapper (``peer/serve.py``) can import it from a venv
that has shipyard but none of its dev dependencies.

Process hygiene: every process is started in its own session and stopped by PID
(SIGTERM, wait, SIGKILL). The gateway's instance processes lead sessions of their own,
so each :class:`ServerProcess` also remembers its descendants (with their start times,
so a recycled PID is never signalled) and stops whichever of them outlive it.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

HERE = Path(__file__).resolve().parent
POST_LUA = HERE / "post.lua"
TIMED_LUA = HERE / "timed.lua"
PEER_BODY = Path(os.environ.get("BENCH_BODY", HERE / "request.json"))
"""The peer harness's request ({"instances": [[20 floats]]}, 227 B), kept here so that the
benchmarks that only borrow its body run without the harness; BENCH_BODY overrides it."""
PEER_HARNESS_NEEDED = (
    "needs the peer-benchmark harness, an optional checkout that is not part of this "
    'repository (bench/README.md, "The peer harness"): set BENCH_DIR to its folder'
)
WRK_INSTALL_HINT = "wrk is not installed: apt-get install -y wrk"
ROLE_ARN = "arn:aws:iam::123456789012:role/bench"


class BenchTimeout(Exception):
    """The whole run went past its time budget."""


# ----------------------------------------------------------------------------- run bounds
def peer_harness() -> Path:
    """The peer-benchmark harness's folder: BENCH_DIR, else ``shared/bench-peers`` in the
    folder that holds this repository (as bench/peer/harness_dir.sh finds it). Exits 2
    saying what is needed when it is not there."""
    folder = Path(os.environ.get("BENCH_DIR") or HERE.parent.parent / "shared" / "bench-peers")
    if not (folder / "run_one.sh").is_file():
        print(
            f"{Path(sys.argv[0]).name}: {PEER_HARNESS_NEEDED}. Not found: {folder}", file=sys.stderr
        )
        sys.exit(2)
    return folder


def require_wrk() -> str:
    """The path of wrk; exits with an install hint when it is missing."""
    path = shutil.which("wrk")
    if path is None:
        print(WRK_INSTALL_HINT, file=sys.stderr)
        sys.exit(2)
    return path


@contextmanager
def time_budget(seconds: float) -> Iterator[None]:
    """Raise :class:`BenchTimeout` after ``seconds``; SIGTERM/SIGINT raise KeyboardInterrupt.

    Either way the ``finally`` blocks of the caller run, so its processes get stopped.
    """

    def on_alarm(signum: int, frame: FrameType | None) -> None:
        raise BenchTimeout(f"run exceeded its budget of {seconds:.0f} s")

    def on_term(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    old_alarm = signal.signal(signal.SIGALRM, on_alarm)
    old_term = signal.signal(signal.SIGTERM, on_term)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old_alarm)
        signal.signal(signal.SIGTERM, old_term)


def provenance(started: float, probe_before: float) -> str:
    """What a figure in bench/results needs beside it: the command that made it (with the
    environment variables the script reads), the tree, the time span, and the machine's
    CPU probe before and after the run."""
    script = Path(sys.argv[0])
    try:
        names = set(re.findall(r"[\"']([A-Z][A-Z0-9_]{2,})[\"']", script.read_text()))
    except OSError:
        names = set()
    names |= {"BENCH_BODY"}  # read here, for every script
    names -= {"PATH", "HOME"}  # read by scripts to pass on, not settings of the run
    env = [
        f"{name}={shlex.quote(os.environ[name])}" for name in sorted(names) if name in os.environ
    ]
    python = os.path.relpath(sys.executable)
    command = " ".join([*env, python if not python.startswith("..") else sys.executable, *sys.argv])
    tree = "an unknown tree"
    if shutil.which("git"):
        git = ["git", "-C", str(HERE.parent)]
        head = subprocess.run(
            [*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        )
        # Results files are what runs write, often several in a row: not the code run.
        dirty = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no", "--",
                                ".", ":(exclude)bench/results"],
                               capture_output=True, text=True)  # fmt: skip
        if head.returncode == 0:
            tree = head.stdout.strip() + (" with uncommitted changes" if dirty.stdout else "")
    span = time.strftime("%Y-%m-%d %H:%M", time.gmtime(started))
    span += time.strftime("-%H:%M UTC", time.gmtime())
    return (
        f"Recorded by `{command}` at {tree}, {span}, {os.cpu_count()} cores; CPU probe "
        f"{probe_before} ms before and {cpu_probe_ms()} ms after (lower is faster)."
    )


def entry(main: Callable[[], int]) -> None:
    """Run ``main`` and exit with its code; 130 when interrupted, 3 past the time budget.
    A run that ends well prints its provenance last (:func:`provenance`).

    By then every ``finally`` has run, so the processes the run started are stopped.
    """
    started, probe_before = time.time(), cpu_probe_ms()
    try:
        code = main()
        if code == 0:
            print(f"\n{provenance(started, probe_before)}", flush=True)
    except KeyboardInterrupt:
        print("interrupted; the processes this run started were stopped", file=sys.stderr)
        code = 130
    except BenchTimeout as exc:
        print(f"{exc}; the processes this run started were stopped", file=sys.stderr)
        code = 3
    sys.exit(code)


def env_float(name: str, default: float) -> float:
    value = os.environ.get(name)
    return float(value) if value else default


def env_ints(name: str, default: Sequence[int]) -> list[int]:
    value = os.environ.get(name)
    return [int(v) for v in value.split()] if value else list(default)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ----------------------------------------------------------------------------- processes
def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time in jiffies) of a live process, else None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    rest = stat[stat.rindex(")") + 2 :].split()
    if rest[0] in ("Z", "X"):
        return None
    return int(rest[1]), int(rest[19])


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds the process has used (not its children); OSError once
    it is gone."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children_map() -> dict[int, list[tuple[int, int]]]:
    children: dict[int, list[tuple[int, int]]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            info = _stat(int(name))
            if info is not None:
                children.setdefault(info[0], []).append((int(name), info[1]))
    return children


@dataclass
class ServerProcess:
    """A process this run started, plus the descendants it was seen with."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    seen: dict[int, int] = field(default_factory=dict)  # pid -> start time

    def __repr__(self) -> str:
        return f"ServerProcess({self.name!r}, pid={self.process.pid})"

    @classmethod
    def start(
        cls,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> ServerProcess:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as out:
            process = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
                cwd=cwd,
                start_new_session=True,
            )
        return cls(name, process, log_path)

    def alive(self) -> bool:
        return self.process.poll() is None

    def track(self) -> dict[int, int]:
        """Record the live descendants (instances the gateway started, their children)."""
        children = _children_map()
        stack = [self.process.pid]
        while stack:
            for pid, started in children.get(stack.pop(), []):
                if pid not in self.seen:
                    self.seen[pid] = started
                stack.append(pid)
        return self.seen

    def cpu_s(self) -> float:
        """CPU seconds (user + system) used so far by the leader and the live descendants
        :meth:`track` has seen: a server's whole tree, instances included."""
        total = 0.0
        for pid in [self.process.pid, *self.seen]:
            with suppress(OSError):
                total += cpu_seconds(pid)
        return total

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, grace_s: float = 20.0) -> list[int]:
        """SIGTERM → wait → SIGKILL, the leader, then its leftovers; PIDs still alive (none)."""
        if self.alive():
            self.track()
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        left = [p for p, t in self.seen.items() if (_stat(p) or (0, -1))[1] == t]
        for sig, wait_s in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 2.0)):
            for pid in left:
                try:
                    # An instance leads its own session: signal its whole group, so a
                    # `cmd:` wrapper shell takes its server along.
                    if os.getpgid(pid) == pid:
                        os.killpg(pid, sig)
                    else:
                        os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + wait_s
            while left and time.monotonic() < deadline:
                time.sleep(0.05)
                left = [p for p in left if (_stat(p) or (0, -1))[1] == self.seen[p]]
            if not left:
                return []
        return left


def wait_until(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise TimeoutError(f"{what} not ready after {timeout_s:g} s")


def http_status(url: str, body: bytes | None = None, timeout_s: float = 5.0) -> int:
    """Status of a GET (or POST of ``body``); 0 when the server cannot be reached."""
    request = urllib.request.Request(url, data=body, method="POST" if body is not None else "GET")
    if body is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            response.read()
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0


def post(url: str, body: bytes, timeout_s: float = 30.0) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=body, method="POST")
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return int(response.status), response.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read()


# ----------------------------------------------------------------------------- servers
def start_runtime(
    model_dir: Path, log_path: Path, *, python: str = sys.executable
) -> tuple[ServerProcess, str]:
    """One standalone instance process; returns it and its invocations URL once it pings."""
    port = free_port()
    argv = [python, "-m", "shipyard.runtime", "--port", str(port), "--model-dir", str(model_dir)]
    server = ServerProcess.start("runtime", argv, log_path)
    base = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        if not server.alive():
            raise RuntimeError(f"runtime exited early:\n{server.log_tail()}")
        return http_status(base + "/ping") == 200

    try:
        wait_until(ready, 60, "runtime /ping")
    except BaseException:
        server.stop()
        raise
    return server, base + "/invocations"


def start_gateway(
    home: Path,
    *,
    python: str = sys.executable,
    port: int | None = None,
    args: Sequence[str] = (),
    env: dict[str, str] | None = None,
) -> tuple[ServerProcess, str]:
    """``shipyard serve`` on a free port with ``home``; returns it and its URL once healthy."""
    port = port or free_port()
    home.mkdir(parents=True, exist_ok=True)
    argv = [python, "-m", "shipyard", "serve", "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--home", str(home), *args]
    server = ServerProcess.start("gateway", argv, home / "gateway.log", env)
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        if not server.alive():
            raise RuntimeError(f"gateway exited early:\n{server.log_tail()}")
        return http_status(url + "/healthz") == 200

    try:
        wait_until(ready, 60, "gateway /healthz")
    except BaseException:
        server.stop()
        raise
    return server, url


class ControlError(Exception):
    """The control plane answered an error (AWS JSON 1.1 ``__type`` and ``message``)."""


@dataclass
class Control:
    """A minimal SageMaker control-plane client: AWS JSON 1.1 over urllib, no boto3."""

    url: str

    def call(self, action: str, params: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(self.url + "/", data=json.dumps(params).encode())
        request.add_header("X-Amz-Target", f"SageMaker.{action}")
        request.add_header("Content-Type", "application/x-amz-json-1.1")
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                result: dict[str, Any] = json.loads(response.read() or b"{}")
                return result
        except urllib.error.HTTPError as exc:
            raise ControlError(f"{action}: HTTP {exc.code} {exc.read()[:300]!r}") from exc

    def deploy(
        self,
        name: str,
        model_url: str,
        *,
        count: int = 1,
        strategy: str = "RANDOM",
        environment: dict[str, str] | None = None,
        timeout_s: float = 180.0,
    ) -> None:
        """Create model, endpoint config and endpoint ``name``; return once InService."""
        container: dict[str, Any] = {"Image": "shipyard/python", "ModelDataUrl": model_url}
        if environment:
            container["Environment"] = environment
        self.call(
            "CreateModel",
            {"ModelName": name, "PrimaryContainer": container, "ExecutionRoleArn": ROLE_ARN},
        )
        variant = {
            "VariantName": "v1",
            "ModelName": name,
            "InstanceType": "ml.m5.large",
            "InitialInstanceCount": count,
            "RoutingConfig": {"RoutingStrategy": strategy},
        }
        self.call(
            "CreateEndpointConfig", {"EndpointConfigName": name, "ProductionVariants": [variant]}
        )
        self.call("CreateEndpoint", {"EndpointName": name, "EndpointConfigName": name})
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            described = self.call("DescribeEndpoint", {"EndpointName": name})
            status = described.get("EndpointStatus")
            if status == "InService":
                return
            if status == "Failed":
                raise ControlError(f"endpoint {name} failed: {described.get('FailureReason')}")
            time.sleep(0.2)
        raise TimeoutError(f"endpoint {name} not InService after {timeout_s:g} s")


# ----------------------------------------------------------------------------- load
@dataclass(frozen=True)
class WrkResult:
    """One measured wrk run. Latencies in ms; which kind they are depends on ``raw``."""

    requests: int
    rps: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    wrk_p99_ms: float
    """wrk's own p99, after its coordinated-omission correction (see timed.lua)."""
    errors: int
    busy_cores: float
    """CPU cores busy machine-wide during the run (server, wrk and anything else)."""
    raw: bool
    """Percentiles of the requests' own latencies (timed.lua), not wrk's corrected ones."""

    @property
    def note(self) -> str:
        return f"{self.errors} errors" if self.errors else "0"


def run_wrk(
    url: str,
    body_file: Path,
    *,
    connections: int,
    duration_s: float,
    raw: bool = False,
    script: Path | None = None,
    env: dict[str, str] | None = None,
) -> WrkResult:
    """One closed-loop wrk run of ``connections`` keep-alive connections POSTing ``body_file``.

    Default: ``wrk -t1 -cN`` with post.lua, the peer harness's set-up; its percentiles are
    wrk's, which include wrk's coordinated-omission correction. ``raw``: ``-tN -cN`` with
    timed.lua, percentiles of what each request took (for heavy-tailed latencies, where
    wrk's correction invents many samples). ``script`` replaces post.lua (same output
    line), ``env`` adds variables it reads.
    """
    seconds = max(1, round(duration_s))
    threads, default_script = (connections, TIMED_LUA) if raw else (1, POST_LUA)
    script = script or default_script
    argv = [require_wrk(), f"-t{threads}", f"-c{connections}", f"-d{seconds}s"]
    argv += ["--timeout", "30s", "--latency", "-s", str(script), url]
    env = {**os.environ, **(env or {}), "BENCH_BODY_FILE": str(body_file)}
    before = _cpu_times()
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=seconds + 60)
    total, idle = (b - a for a, b in zip(before, _cpu_times(), strict=True))
    busy = round((total - idle) / total * (os.cpu_count() or 1), 2) if total else 0.0
    match = re.search(r"^BENCH_(JSON|RAW) (\{.*\})$", done.stdout, re.M)
    if done.returncode != 0 or match is None:
        raise RuntimeError(f"wrk failed ({done.returncode}): {done.stdout[-400:]}{done.stderr}")
    s = json.loads(match.group(2))
    if raw:
        return WrkResult(
            requests=s["requests"],
            rps=s["requests"] / (s["duration_us"] / 1e6),
            p50_ms=s["p50_ms"],
            p90_ms=s["p90_ms"],
            p99_ms=s["p99_ms"],
            wrk_p99_ms=s["wrk_p99_ms"],
            errors=s["errors"],
            busy_cores=busy,
            raw=True,
        )
    errors = ("err_connect", "err_read", "err_write", "err_timeout", "err_status")
    return WrkResult(
        requests=s["requests"],
        rps=s["requests"] / (s["duration_us"] / 1e6),
        p50_ms=s["p50_us"] / 1000,
        p90_ms=s["p90_us"] / 1000,
        p99_ms=s["p99_us"] / 1000,
        wrk_p99_ms=s["p99_us"] / 1000,
        errors=sum(s[k] for k in errors),
        busy_cores=busy,
        raw=False,
    )


def _cpu_times() -> tuple[int, int]:
    """(all, idle + iowait) jiffies since boot, summed over the machine's cores."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    return sum(values), values[3] + values[4]


def measure(
    url: str,
    body_file: Path,
    connections: int,
    warmup_s: float,
    duration_s: float,
    *,
    raw: bool = False,
) -> WrkResult:
    """A discarded warm-up run, then the measured one."""
    if warmup_s > 0:
        run_wrk(url, body_file, connections=connections, duration_s=warmup_s, raw=raw)
    return run_wrk(url, body_file, connections=connections, duration_s=duration_s, raw=raw)


# ----------------------------------------------------------------------------- output
def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A markdown table; floats get a precision that suits their size."""

    def cell(value: object) -> str:
        if isinstance(value, float):
            if abs(value) >= 100:
                return f"{value:,.0f}"
            return f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}"
        return str(value)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def cpu_probe_ms() -> float:
    """Best of 5 runs of a fixed pure-Python loop (the peer harness's probe; lower = faster)."""
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        x = 0
        for i in range(300_000):
            x += i * i % 7
        best = min(best, time.perf_counter() - started)
    return round(best * 1000, 1)
