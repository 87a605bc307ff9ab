"""Fails the SageMaker way: writes its reason to /opt/ml/output/failure, then exits 1."""

import os
import sys
from pathlib import Path

(Path(os.environ["SM_OUTPUT_DATA_DIR"]) / "partial.txt").write_text("half done")
(Path(os.environ["SM_OUTPUT_DIR"]) / "failure").write_text("Bad input: column 'x' is missing\n")
print("this stderr line is not the reason", file=sys.stderr)
sys.exit(1)
