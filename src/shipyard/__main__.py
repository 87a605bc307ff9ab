"""``python -m shipyard`` and the ``shipyard`` command (pyproject's ``[project.scripts]``)."""

from shipyard import heap


def main() -> None:
    # Collections paused for the command line's imports: every command but `serve`
    # resumes them before it runs (cli._root); `serve` once its gateway is up.
    heap.pause()
    from shipyard.cli import main as run

    run()


if __name__ == "__main__":
    main()
