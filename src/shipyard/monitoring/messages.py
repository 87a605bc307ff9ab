"""What a monitoring run says of its end, shared by the analyzer, which writes it, and
the runs, which read it (without importing the analyzer's numpy)."""

from __future__ import annotations

NO_DATA = "Job inputs had no data"
"""A run whose window holds no record fails with this reason."""
WITH_VIOLATIONS = "CompletedWithViolations"


def exit_message(violations: int) -> str:
    """A run's ``/opt/ml/output/message``, its processing job's ExitMessage."""
    if violations == 0:
        return "Completed: Job completed successfully with no violations."
    return f"{WITH_VIOLATIONS}: Job completed successfully with {violations} violations."
