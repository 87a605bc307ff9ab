"""A user's server (a cmd: image) that forks a child of its own before it serves.

The child sleeps and writes its PID next to the server's log, so a test can check that
it dies with the instance.
"""

import json
import os
import subprocess
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
Path(os.environ["FORKING_PID_DIR"], f"child-{child.pid}").write_text(str(os.getpid()))


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = json.dumps({"pid": os.getpid(), "child": child.pid}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


ThreadingHTTPServer(
    ("127.0.0.1", int(os.environ["SAGEMAKER_BIND_TO_PORT"])), Handler
).serve_forever()
