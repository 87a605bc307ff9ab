"""The process the peer harness starts for shipyard: gateway, deploy, then wait.

    serve.py --port P --home DIR --model NAME --model-dir DIR --instances N [--workers W]

Runs ``shipyard serve`` as a child in this session (``start.sh`` launched us with setsid,
so the harness finds the gateway and its instances by our PID), waits for ``/healthz``,
deploys endpoint NAME (N instances of DIR) over the control plane, and then waits on the
gateway. SIGTERM is passed on to the gateway, which stops its instances; whatever is left
after that the harness stops by PID. Exits non-zero if the gateway or the deploy fails.

Standard library only (plus ``bench/harness.py``): the peer venv has shipyard and
scikit-learn, not boto3.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness import Control, http_status, wait_until


def log(message: str) -> None:
    print(f"[serve.py {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--home", type=Path, required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--instances", type=int, default=1)
    parser.add_argument(
        "--workers",
        type=int,
        default=int(os.environ.get("SHIPYARD_BENCH_WORKERS", "1")),
        help="gateway processes (shipyard serve --workers)",
    )
    parser.add_argument(
        "--strategy",
        default=os.environ.get("SHIPYARD_BENCH_STRATEGY", "RANDOM"),
        help="the variant's RoutingStrategy (RANDOM, LEAST_OUTSTANDING_REQUESTS)",
    )
    args = parser.parse_args()

    shipyard = shutil.which("shipyard", path=str(Path(sys.executable).parent)) or "shipyard"
    argv = [shipyard, "serve", "--host", "127.0.0.1", "--port", str(args.port)]
    argv += ["--workers", str(args.workers)]
    gateway = subprocess.Popen([*argv, "--home", str(args.home)], stdin=subprocess.DEVNULL)

    def on_term(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    url = f"http://127.0.0.1:{args.port}"
    try:

        def healthy() -> bool:
            if gateway.poll() is not None:
                raise RuntimeError(f"gateway exited with code {gateway.returncode}")
            return http_status(url + "/healthz", timeout_s=2) == 200

        wait_until(healthy, 60, "gateway /healthz")
        started = time.monotonic()
        Control(url).deploy(
            args.model, str(args.model_dir), count=args.instances, strategy=args.strategy
        )
        log(f"endpoint {args.model} InService after {time.monotonic() - started:.2f} s")
        return gateway.wait()
    except KeyboardInterrupt:
        return 0
    except Exception as exc:
        log(f"FAILED: {type(exc).__name__}: {exc}")
        return 1
    finally:
        if gateway.poll() is None:
            gateway.terminate()
            try:
                gateway.wait(12)
            except subprocess.TimeoutExpired:
                gateway.kill()
                gateway.wait()


if __name__ == "__main__":
    sys.exit(main())
