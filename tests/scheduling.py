"""How the suite is run: which tests make the fast tier, and how ``make test`` spreads the
suite over its xdist workers (a pytest plugin that tests/conftest.py loads, and
tests/unit/test_xdist_groups.py checks)."""

from __future__ import annotations

from pathlib import Path

import pytest

_STARTING_FOLDERS = frozenset(
    "cli console containers docs e2e fuzz jobs openai_door ray runtime".split()
)
"""The folders of tests/ whose modules start gateways, instances, job runners or a
cluster."""
_STARTING_FIXTURES = frozenset({"gateway", "gateway_factory", "ray_gateway", "start_runtime"})
"""Fixtures that start such processes, wherever a test uses them."""


def _starts_processes(item: pytest.Item) -> bool:
    tests = Path(__file__).parent
    folder = item.path.relative_to(tests).parts[0] if item.path.is_relative_to(tests) else ""
    fixtures = getattr(item, "fixturenames", ())
    return folder in _STARTING_FOLDERS or not _STARTING_FIXTURES.isdisjoint(fixtures)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each module's tests run on one xdist worker, one after another, unless they are
    in a group of their own (``xdist_group``: one container engine, one tiny LM). The
    group is named after the module's file (two of one name in two folders share one).

    Many modules start a gateway, instances or a Ray cluster once for all their tests
    (module-scoped fixtures); spread test by test over three workers, each worker that
    ran one of them started its own. ``make test`` schedules these groups in collection
    order (``--no-loadscope-reorder``), so the many small unit modules come last and
    even out the workers' ends.

    A test that starts processes of its own (gateways, instances, job runners, a
    cluster, a fresh interpreter) is marked ``processes``, which ``make test-fast``
    leaves out: by its folder, by the fixtures it uses, or by hand (``pytestmark``).
    """
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.path.stem))
        if item.get_closest_marker("processes") is None and _starts_processes(item):
            item.add_marker(pytest.mark.processes)
