"""How ``make test`` spreads the suite over its xdist workers (a pytest plugin that
tests/conftest.py loads, and tests/unit/test_xdist_groups.py checks)."""

from __future__ import annotations

import pytest


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
    """
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.path.stem))
