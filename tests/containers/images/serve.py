"""A hosting image's server, as a team would write one for SageMaker: ``serve`` starts
it on 8080 (or SAGEMAKER_BIND_TO_PORT); it answers /ping and /invocations with what it
sees of its container, so the tests can check the contract from inside.

Its behaviour is baked into each test image by the variable IMAGE_MODE: ``serve``
(default), ``exit`` (ends at once, saying so), ``noping`` (never healthy). With
SAGEMAKER_MULTI_MODEL=true it is also a multi-model container (``/models``)."""

import json
import os
import signal
import socket
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODE = os.environ.get("IMAGE_MODE", "serve")
VERSION = os.environ.get("IMAGE_VERSION", "1")
MODEL = "/opt/ml/model"


def model_answer():
    try:
        with open(os.path.join(MODEL, "answer.txt")) as f:
            return f.read().strip()
    except OSError:
        return None


def model_writable():
    try:
        with open(os.path.join(MODEL, "written.txt"), "w") as f:
            f.write("x")
        return True
    except OSError:
        return False


LOADED = {}
"""Multi-model (SAGEMAKER_MULTI_MODEL=true): model name -> its answer.txt."""


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/ping" and MODE != "noping":
            return self.answer(200, b"")
        if self.path == "/execution-parameters" and os.environ.get("SAGEMAKER_BATCH") == "true":
            asked = {"MaxConcurrentTransforms": 1, "BatchStrategy": "SINGLE_RECORD"}
            return self.answer(200, json.dumps(asked).encode(), "application/json")
        if self.path == "/models":
            listed = [{"modelName": n, "modelUrl": u} for n, (u, _) in LOADED.items()]
            return self.answer(200, json.dumps({"models": listed}).encode())
        self.answer(404 if self.path != "/ping" else 503, b"")

    def do_DELETE(self):
        name = self.path.removeprefix("/models/")
        self.answer(200 if LOADED.pop(name, None) else 404, b"")

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path == "/models":  # the multi-model container API's load
            load = json.loads(body)
            if load["model_name"] in LOADED:
                return self.answer(409, b"")
            with open(os.path.join(load["url"], "answer.txt")) as f:
                LOADED[load["model_name"]] = (load["url"], f.read().strip())
            return self.answer(200, b"")
        if self.path.startswith("/models/") and self.path.endswith("/invoke"):
            name = self.path.removeprefix("/models/").removesuffix("/invoke")
            if name not in LOADED:
                return self.answer(404, b"")
            seen = {"model": LOADED[name][1], "url": LOADED[name][0], "body": body.decode()}
            return self.answer(200, json.dumps(seen).encode(), "application/json")
        if self.path != "/invocations":
            return self.answer(404, b"")
        if body == b"fail":
            return self.answer(500, b"failed on purpose")
        if os.environ.get("SAGEMAKER_BATCH") == "true":  # a transform's records
            return self.answer(200, body.upper(), "text/csv")
        seen = {
            "version": VERSION,
            "model": model_answer(),
            "model_writable": model_writable(),
            "hostname": socket.gethostname(),
            "argv": sys.argv[1:],
            "port": self.server.server_address[1],
            "environ": dict(os.environ),
            "body": body.decode(errors="replace"),
            "cpus": len(os.sched_getaffinity(0)),
        }
        self.answer(200, json.dumps(seen).encode(), "application/json")

    def answer(self, status, body, content_type="text/plain"):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, fmt, *args):
        print("request", fmt % args, flush=True)


def main():
    if sys.argv[1:] != ["serve"]:
        sys.exit(f"expected the argument serve, got {sys.argv[1:]}")
    if MODE == "exit":
        sys.exit("this image ends at once, on purpose")
    port = int(os.environ.get("SAGEMAKER_BIND_TO_PORT", "8080"))
    server = ThreadingHTTPServer(("0.0.0.0", port), Handler)
    # PID 1 has no default handler for SIGTERM: the contract's polite stop is ours to take.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(f"serving version {VERSION} on {port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
