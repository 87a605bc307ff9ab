"""Route tables: what the reconciler publishes and the router reads, one per endpoint.

A table is replaced whole, never edited, so a request holds a consistent view of the
variants it was routed by; only the instances' counters (routing/instance.py) and the
variants' waiting queues change in place.
"""

from __future__ import annotations

import bisect
import itertools
import random
from collections.abc import Sequence

from shipyard.capture.writer import VariantCapture
from shipyard.metrics import VariantMetrics
from shipyard.records import AsyncConfig
from shipyard.routing.instance import Instance, Queue
from shipyard.routing.policies import Policy
from shipyard.routing.priorities import UNCONFIGURED, QueueRules
from shipyard.routing.shadow import copy_shares
from shipyard.routing.strategies import UNLIMITED, Admission, Dispatch, OneModel


class VariantRoute:
    """One production variant's instances, its weight and its policy.

    ``capture`` is set when the endpoint config captures data (DataCaptureConfig): the
    runtime door offers it every invocation answered (capture/writer.py).

    ``waiters`` is the variant's queue (routing/instance.py) of requests held at the
    gateway until an instance can take them; it is handed from one published table to
    the next, so a swap never strands a waiting request. ``coming`` counts the instances
    being started for the variant (a scale-out): while there are any, a request that
    finds every instance full waits for them here, even under a policy that does not
    queue otherwise, instead of being refused while capacity is on its way. ``shadow``
    marks a shadow variant: never picked by weight nor by TargetVariant, it only takes
    the copies routing/shadow.py sends it.

    A route may hold the copies of one inference component instead of a variant's
    instances (``component``); it is then found by that name, never by weight.

    ``rules`` are its priority queue's (routing/priorities.py): levels, a bound of its
    own, deadlines; a variant without any waits in one line as before.

    ``dispatch`` and ``admission`` are the strategies the router follows for the
    variant's requests (routing/strategies.py): one model under ``policy`` and no limit
    unless others are given (a multi-model variant's MultiModelDispatch, an adapter
    component's AdapterDispatch; a serverless variant's ServerlessAdmission, a component
    at zero's FromZero). What differs between kinds of variant is theirs alone.
    """

    __slots__ = (
        "name",
        "weight",
        "policy",
        "instances",
        "metrics",
        "capture",
        "waiters",
        "queue_limit",
        "coming",
        "shadow",
        "dispatch",
        "admission",
        "component",
        "rules",
    )

    def __init__(
        self,
        name: str,
        *,
        weight: float,
        policy: Policy,
        instances: Sequence[Instance],
        metrics: VariantMetrics,
        capture: VariantCapture | None = None,
        coming: int = 0,
        shadow: bool = False,
        component: str | None = None,
        admission: Admission | None = None,
        dispatch: Dispatch | None = None,
        rules: QueueRules = UNCONFIGURED,
    ) -> None:
        self.name = name
        self.rules = rules
        """Its priority queue's rules (routing/priorities.py); unconfigured, one level."""
        self.component = component
        """For the copies of an inference component: its name (``name`` is then the
        variant that hosts it)."""
        self.shadow = shadow
        self.weight = weight
        self.policy = policy
        self.instances = list(instances)
        self.metrics = metrics
        self.capture = capture
        self.dispatch: Dispatch = dispatch if dispatch is not None else OneModel(policy)
        self.admission: Admission = admission if admission is not None else UNLIMITED
        self.coming = coming
        self.waiters = Queue()
        queued = len(instances) if policy.queues else 0
        bound = self.admission.bound
        if bound is not None:
            self.queue_limit = bound  # the admission's own bound (MaxConcurrency)
        elif not self.dispatch.queues:
            self.queue_limit = 0
        elif self.admission.starts_instances:
            # Room to wait for the first instance, and as many as the policy queues.
            self.queue_limit = policy.max_in_flight * max(queued + coming, 1)
        else:
            self.queue_limit = policy.max_in_flight * (queued + coming)
        if rules.max_queue is not None:
            self.queue_limit = rules.max_queue  # the model's own bound

    def __repr__(self) -> str:
        return f"VariantRoute({self.name!r}, weight={self.weight}, instances={self.instances})"

    def release(self) -> None:
        """An instance answered: give the oldest waiting request its turn."""
        self.waiters.turn()

    def wake_all(self) -> None:
        self.waiters.wake_all()


class EndpointRoute:
    """The routing table of one endpoint: its variants and their weights.

    ``variants`` holds shadow variants too (their instances are the endpoint's); only
    production ones are picked by weight. ``copies`` maps a production variant to the
    shadows that get a share of its requests (routing/shadow.py), empty without shadows.
    """

    __slots__ = (
        "name",
        "variants",
        "by_name",
        "async_config",
        "copies",
        "components",
        "hosts_components",
        "_production",
        "_cumulative",
        "_total",
    )

    def __init__(
        self,
        name: str,
        variants: Sequence[VariantRoute],
        *,
        async_config: AsyncConfig | None = None,
        components: Sequence[VariantRoute] | None = None,
    ) -> None:
        self.name = name
        self.async_config = async_config
        self.hosts_components = components is not None
        """An endpoint of inference components: its requests name one (``components``)."""
        self.components = {c.component: c for c in components or () if c.component}
        """Set for an asynchronous endpoint, whose requests come from the queue."""
        self.variants = list(variants)
        self.by_name = {v.name: v for v in self.variants}
        self._production = [v for v in self.variants if not v.shadow]
        self.copies = copy_shares(self._production, [v for v in self.variants if v.shadow])
        weights = [max(v.weight, 0.0) for v in self._production]
        if sum(weights) <= 0:
            weights = [1.0] * len(self._production)  # all weights zero: split evenly
        self._cumulative = list(itertools.accumulate(weights))
        self._total = self._cumulative[-1] if self._cumulative else 0.0

    def __repr__(self) -> str:
        return f"EndpointRoute({self.name!r}, variants={[v.name for v in self.variants]})"

    def successor(self, variant: VariantRoute) -> VariantRoute | None:
        """What in this table stands for ``variant`` of an earlier one: the variant of
        its name, or the copies of its inference component."""
        if variant.component is not None:
            return self.components.get(variant.component)
        return self.by_name.get(variant.name)

    def pick_variant(self, rng: random.Random) -> VariantRoute:
        if len(self._production) == 1:
            return self._production[0]
        return self._production[bisect.bisect_right(self._cumulative, rng.random() * self._total)]

    def instances(self) -> list[Instance]:
        return [i for v in (*self.variants, *self.components.values()) for i in v.instances]
