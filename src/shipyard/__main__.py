"""``python -m shipyard`` and the ``shipyard`` command (pyproject's ``[project.scripts]``)."""

from shipyard import heap

# Before the command line's imports: `serve` settles the heap once the gateway is up, and
# every other command resumes collections before it runs (cli._root).
heap.pause()

from shipyard.cli import main  # noqa: E402

if __name__ == "__main__":
    main()
