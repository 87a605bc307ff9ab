"""Runs until SIGTERM, then saves its model in the grace window and exits 0."""

import os
import signal
import sys
import time
from pathlib import Path


def save_and_exit(signum: int, frame: object) -> None:
    (Path(os.environ["SM_MODEL_DIR"]) / "saved.txt").write_text("saved on SIGTERM")
    print("saved the model", flush=True)
    sys.exit(0)


signal.signal(signal.SIGTERM, save_and_exit)
print("ready", flush=True)
time.sleep(60)
