"""Tries, from inside a model or a job, what a sandbox must prevent; reports what it got.

As a model, the request body is ``{"gateway_pid": N, "paths": {"name": "/a/path"},
"writes": {"name": "/a/path"}}``; as a training job's script (``python inference.py
--gateway_pid N --paths '{...}' --writes '{...}'``), the report is written to the model
folder as ``probe.json``. ``writes`` are files it tries to create.
"""

import argparse
import json
import os


def probe(
    gateway_pid: int, paths: dict[str, str], writes: dict[str, str] | None = None
) -> dict[str, object]:
    """What could be read (the first bytes, or the error), what could be written,
    whether the gateway's PID is seen under /proc, and who we are."""
    paths = {"environ": f"/proc/{gateway_pid}/environ", **paths}
    read: dict[str, object] = {}
    for name, path in paths.items():
        try:
            with open(path, "rb") as f:
                read[name] = {"ok": f.read(4096).decode(errors="replace")}
        except OSError as exc:
            read[name] = {"error": f"{type(exc).__name__}: {exc}"}
    wrote: dict[str, object] = {}
    for name, path in (writes or {}).items():
        try:
            with open(path, "x") as f:
                f.write("written by the probe")
            wrote[name] = {"ok": path}
        except OSError as exc:
            wrote[name] = {"error": f"{type(exc).__name__}: {exc}"}
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        pids = []
    return {
        "read": read,
        "wrote": wrote,
        "sees_gateway": gateway_pid in pids,
        "pids": sorted(pids),
        "uid": os.getuid(),
        "gid": os.getgid(),
        "pid": os.getpid(),
    }


def predict_fn(data, model):
    return probe(int(data["gateway_pid"]), dict(data.get("paths", {})), data.get("writes"))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--gateway_pid", type=int, required=True)
    parser.add_argument("--paths", default="{}")
    parser.add_argument("--writes", default="{}")
    args = parser.parse_args()
    report = probe(args.gateway_pid, json.loads(args.paths), json.loads(args.writes))
    with open(os.path.join(os.environ["SM_MODEL_DIR"], "probe.json"), "w") as f:
        json.dump(report, f)
    print("probed", json.dumps({"uid": report["uid"], "sees_gateway": report["sees_gateway"]}))
