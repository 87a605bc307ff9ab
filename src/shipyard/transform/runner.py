"""One batch transform job, run to its end.

``TransformRun.run`` starts the job's own instances (InstanceCount of them, through the
Provisioner like any fleet, with ``SAGEMAKER_BATCH=true`` and the other batch variables;
from warm spares where the backend keeps them) while it lists the input, asks one of
them ``GET /execution-parameters``, then feeds every input object not yet finished
through them; ``TransformRun.stop`` stops them, which the supervisor calls once the
job's end is recorded, whatever it is.

Each object is streamed, never held whole: read in chunks, decompressed, split into
records, filtered, packed into payloads and sent through a router of the job's own (the
same router, policy and in-flight counting as endpoints use, but not reachable by
clients), at most ``MaxConcurrentTransforms`` requests per instance at a time. Answers
are written in input order as they come, into ``<S3OutputPath>/<key>.out``, which
appears whole or not at all; only then is the object recorded as finished, so a job
resumed after a restart redoes nothing it wrote. A payload the model still refuses after
``InvocationsMaxRetries`` fails the job with a reason naming the object and the records.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from shipyard.contract import ACCEPT, CONTENT_TYPE
from shipyard.errors import (
    NoSuchObject,
    ObjectStoreError,
    RuntimeFailure,
    ShipyardError,
    SplitError,
    TransformFailed,
    UpstreamError,
)
from shipyard.metrics import Metrics
from shipyard.provisioning.fleet import TRANSFORM_JOB_LOGS, Fleet, Provisioner
from shipyard.records import EndpointConfig, RoutingStrategy, TransformJob, VariantSpec
from shipyard.routing.call import Call
from shipyard.routing.invocation import Invocations
from shipyard.routing.policies import LeastOutstandingRequests
from shipyard.routing.router import Router
from shipyard.routing.table import EndpointRoute, VariantRoute
from shipyard.storage.metadata import MetadataStore, now
from shipyard.storage.objects import ObjectStore
from shipyard.storage.transform_jobs import TransformStore
from shipyard.transform.batching import Payload, payloads, split_answer
from shipyard.transform.jsonpath import (
    apply_input_filter,
    apply_output_filter,
    compile_filter,
    join_input,
)
from shipyard.transform.service import (
    DEFAULT_CONCURRENCY,
    DEFAULT_MAX_PAYLOAD_MB,
    MAX_PAYLOADS_MB,
)
from shipyard.transform.splitting import decompress, record_batches

log = logging.getLogger(__name__)

VARIANT = "AllTraffic"
_MB = 1024 * 1024
_DEFAULT_TIMEOUT_S = 600.0
_DEFAULT_RETRIES = 3
_MAX_RESPONSE_BYTES = 256 * _MB
_MANIFEST_BYTES = 64 * _MB


@dataclass(frozen=True, slots=True)
class Plan:
    """How the job's payloads are made and sent, once defaults and the model's
    ``/execution-parameters`` are applied (the request wins over both)."""

    strategy: str
    max_payload_bytes: int
    concurrency: int
    split_type: str
    compression: str
    content_type: str | None
    accept: str | None
    assemble: str
    timeout_s: float
    retries: int
    input_filter: Any
    output_filter: Any
    join: bool


class TransformRun:
    """Runs one transform job; ``run`` returns when every object is written or raises."""

    def __init__(
        self,
        job: TransformJob,
        *,
        store: TransformStore,
        models: MetadataStore,
        provisioner: Provisioner,
        objects: ObjectStore,
        metrics: Metrics,
        on_progress: Callable[[], None] = lambda: None,
    ) -> None:
        self.job = job
        self.store = store
        self.models = models
        self.provisioner = provisioner
        self.objects = objects
        self.metrics = metrics
        self._on_progress = on_progress
        self._fleet: Fleet | None = None

    def __repr__(self) -> str:
        return f"TransformRun({self.job.name!r})"

    async def run(self) -> None:
        """Every input object through the model; raises TransformFailed with the reason."""
        # The instances start while the input is listed: both take seconds (a model's
        # imports; an S3 prefix of many objects), and neither needs the other.
        launching = asyncio.create_task(self._launch())
        try:
            inputs = await asyncio.to_thread(self._inputs)
            if self.job.objects_total != len(inputs):
                await asyncio.to_thread(self.store.change, self.job.name, objects_total=len(inputs))
            done = await asyncio.to_thread(self.store.finished_objects, self.job.name)
            self._export(len(inputs), len(done), sum(done.values()))
            todo = [(uri, key) for uri, key in inputs if key not in done]
            if not todo:
                return
            fleet = await launching
            plan = await self._plan(fleet)
            router = Router(timeout_s=plan.timeout_s, max_response_bytes=_MAX_RESPONSE_BYTES)
            invocations = Invocations(router)
            try:
                route = self._route(fleet, plan)
                router.publish(route)
                await self._objects(invocations, route, plan, todo, len(inputs), done)
            finally:
                router.close()
        except ShipyardError as exc:
            raise TransformFailed(exc.message) from exc
        except (NoSuchObject, ObjectStoreError) as exc:
            # The caller's input or output location, as SageMaker counts them: an object
            # gone since it was listed (or named by a manifest and never there) included.
            raise TransformFailed(f"ClientError: {exc}") from exc
        finally:
            if not launching.done():
                launching.cancel()  # the fleet stops what it started
            await asyncio.gather(launching, return_exceptions=True)

    async def stop(self) -> None:
        """Stop the job's instances, once ``run`` has ended (its end is recorded first:
        the output is whole, and an instance takes up to 0.2 s to exit)."""
        if self._fleet is not None:
            await self.provisioner.stop_slots(self._fleet.all_slots())

    # -- inputs -----------------------------------------------------------------------

    def _inputs(self) -> list[tuple[str, str]]:
        source = self.job.request["TransformInput"]["DataSource"]["S3DataSource"]
        uri = source["S3Uri"]
        if source["S3DataType"] == "S3Prefix":
            found = self.objects.list_prefix(uri)
            if not found:
                raise TransformFailed(f"ClientError: No objects found under {uri}.")
            return found
        return self._manifest(uri)

    def _manifest(self, uri: str) -> list[tuple[str, str]]:
        """The objects a ManifestFile names. The manifest is the caller's: whatever is
        wrong with it fails the job as a ClientError naming it, never as an error of ours
        (a nesting too deep for the parser included), and one that names no object fails
        as an empty S3Prefix does."""
        try:
            manifest = json.loads(self.objects.read_bytes(uri, limit=_MANIFEST_BYTES))
        except NoSuchObject as exc:
            raise TransformFailed(f"ClientError: Could not find manifest {uri}.") from exc
        except ObjectStoreError as exc:  # its message names the URI
            raise TransformFailed(f"ClientError: Manifest: {exc}") from exc
        except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
            raise TransformFailed(f"ClientError: Manifest {uri} is not JSON: {exc}") from exc
        if (
            not isinstance(manifest, list)
            or not manifest
            or not isinstance(manifest[0], dict)
            or not isinstance(manifest[0].get("prefix"), str)
        ):
            raise TransformFailed(
                f'ClientError: Manifest {uri} is not a JSON list starting with {{"prefix": …}}.'
            )
        prefix, entries = manifest[0]["prefix"], manifest[1:]
        for index, entry in enumerate(entries, start=1):
            if not isinstance(entry, str):
                raise TransformFailed(
                    f"ClientError: Manifest {uri}: entry {index} is not a string (a key "
                    f"under the prefix): {json.dumps(entry)[:100]}."
                )
        if not entries:
            raise TransformFailed(f"ClientError: No objects found in manifest {uri}.")
        return [(self.objects.join(prefix, rel), rel) for rel in entries]

    # -- instances --------------------------------------------------------------------

    async def _launch(self) -> Fleet:
        request = self.job.request
        resources = request["TransformResources"]
        count = int(resources["InstanceCount"])
        config = EndpointConfig(
            name=self.job.name,
            arn=self.job.arn,
            variants=(
                VariantSpec(
                    VARIANT,
                    request["ModelName"],
                    resources["InstanceType"],
                    count,
                    1.0,
                    RoutingStrategy.LEAST_OUTSTANDING_REQUESTS,
                ),
            ),
            created=now(),
        )
        payload_mb = int(request.get("MaxPayloadInMB", DEFAULT_MAX_PAYLOAD_MB))
        # What the job runs at as far as the request says (the model's execution
        # parameters, read once it is up, may fill in what the request leaves out).
        concurrency = bounded_concurrency(
            int(request.get("MaxConcurrentTransforms") or DEFAULT_CONCURRENCY), payload_mb
        )
        environment = {
            "SAGEMAKER_BATCH": "true",
            "SAGEMAKER_MAX_PAYLOAD_IN_MB": str(payload_mb),
            "SAGEMAKER_BATCH_STRATEGY": _strategy_env(request.get("BatchStrategy")),
            "SAGEMAKER_MAX_CONCURRENT_TRANSFORMS": str(concurrency),
            **dict(request.get("Environment") or {}),
        }
        try:
            fleet = await self.provisioner.launch(
                self.job.name,
                config,
                {VARIANT: count},
                {VARIANT: 1.0},
                environment=environment,
                # From a warm spare (imports done) where the backend keeps one and the
                # instance's variables allow it (runtime/spare.py).
                warm=True,
                logs=f"{TRANSFORM_JOB_LOGS}/{self.job.name}",
            )
        except Exception as exc:
            raise TransformFailed(f"AlgorithmError: {exc}") from exc
        self._fleet = fleet
        return fleet

    async def _plan(self, fleet: Fleet) -> Plan:
        request = self.job.request
        advertised = await self._execution_parameters(fleet)
        client = request.get("ModelClientConfig") or {}
        transform_input = request["TransformInput"]
        transform_output = request["TransformOutput"]
        processing = request.get("DataProcessing") or {}
        payload_mb = request.get(
            "MaxPayloadInMB", advertised.get("MaxPayloadInMB", DEFAULT_MAX_PAYLOAD_MB)
        )
        payload_mb = max(int(payload_mb), 1)
        asked = int(
            request.get("MaxConcurrentTransforms")
            or advertised.get("MaxConcurrentTransforms", DEFAULT_CONCURRENCY)
        )
        concurrency = bounded_concurrency(asked, payload_mb)
        if concurrency < asked:
            log.warning(
                "transform job %s: MaxConcurrentTransforms %d runs as %d, the most payloads "
                "of %d MB that stay within %d MB in flight to an instance",
                self.job.name, asked, concurrency, payload_mb, MAX_PAYLOADS_MB,
            )  # fmt: skip
        return Plan(
            strategy=request.get("BatchStrategy")
            or advertised.get("BatchStrategy")
            or "SingleRecord",
            max_payload_bytes=payload_mb * _MB,
            concurrency=concurrency,
            split_type=transform_input.get("SplitType", "None"),
            compression=transform_input.get("CompressionType", "None"),
            content_type=transform_input.get("ContentType"),
            accept=transform_output.get("Accept"),
            assemble=transform_output.get("AssembleWith", "None"),
            timeout_s=float(client.get("InvocationsTimeoutInSeconds", _DEFAULT_TIMEOUT_S)),
            retries=int(client.get("InvocationsMaxRetries", _DEFAULT_RETRIES)),
            input_filter=_filter(processing.get("InputFilter")),
            output_filter=_filter(processing.get("OutputFilter")),
            join=processing.get("JoinSource", "None") == "Input",
        )

    async def _execution_parameters(self, fleet: Fleet) -> dict[str, Any]:
        """What the model asks for at ``GET /execution-parameters``, if it answers."""
        slot = next((s for s in fleet.all_slots() if s.instance is not None), None)
        if slot is None or slot.instance is None:
            return {}
        try:
            async with asyncio.timeout(5.0):
                answer = await slot.instance.pool.request(b"GET", b"/execution-parameters", [])
            if answer.status != 200:
                return {}
            parsed = json.loads(answer.body)
        except (TimeoutError, UpstreamError, OSError, ValueError, RecursionError):
            return {}
        return _advertised(parsed) if isinstance(parsed, dict) else {}

    def _route(self, fleet: Fleet, plan: Plan) -> EndpointRoute:
        instances = [s.instance for s in fleet.all_slots() if s.instance is not None]
        for instance in instances:
            # MaxConcurrentTransforms requests in flight per instance, whatever its handler
            # threads: a second request's body then arrives while the first is scored,
            # rather than a second thread fighting the first for the GIL (measured: 1.6x
            # slower for a CPU-bound model).
            instance.concurrency = plan.concurrency
        variant = VariantRoute(
            VARIANT,
            weight=1.0,
            policy=LeastOutstandingRequests(max_in_flight=plan.concurrency),
            instances=instances,
            metrics=self.metrics.for_variant(self.job.name, VARIANT),
        )
        return EndpointRoute(self.job.name, [variant])

    # -- objects ----------------------------------------------------------------------

    async def _objects(
        self,
        invocations: Invocations,
        route: EndpointRoute,
        plan: Plan,
        todo: list[tuple[str, str]],
        total: int,
        done: dict[str, int],
    ) -> None:
        """Every object of ``todo`` through the model, each recorded finished once its
        output is written.

        Objects overlap: the next one starts as soon as the one before has handed its
        last payload to the router, and they share one window of payloads in flight
        (MaxConcurrentTransforms per instance). A job of many small objects (SplitType
        None, one request each) thus keeps every instance busy, where one object at a
        time left all but one request slot idle; and a job of large objects has the next
        object's first payload packed and waiting when the instance answers the last one,
        instead of writing and recording that output, opening the next object and packing
        first (a gap of 45-200 ms at each boundary, against 10-15 ms between payloads,
        measured with 6 MB payloads).
        """
        slots = max(len(route.instances()), 1) * plan.concurrency
        window = asyncio.Semaphore(slots)
        # The one sending, and those whose answers are still coming or being written: no
        # more, so that objects whose output store is slower than the model do not pile
        # up, each with its files open and its threads' work queued.
        at_once = min(_OBJECTS_AT_ONCE, slots + 1)
        running: dict[asyncio.Task[int], str] = {}
        finished = [len(done), sum(done.values())]  # objects, records

        async def record(tasks: set[asyncio.Task[int]]) -> None:
            for task in tasks:
                key = running.pop(task)
                count = task.result()  # an object's failure fails the job
                await asyncio.to_thread(self.store.finish_object, self.job.name, key, count)
                finished[0] += 1
                finished[1] += count
                self._export(total, *finished)
                self._on_progress()

        try:
            for uri, key in todo:
                while len(running) >= at_once:
                    over, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                    await record(over)
                sent = asyncio.Event()
                task = asyncio.create_task(
                    self._object(invocations, route, plan, uri, key, window, sent)
                )
                running[task] = key
                handed = asyncio.ensure_future(sent.wait())
                try:
                    while not sent.is_set():
                        over, _ = await asyncio.wait(
                            {handed, *running}, return_when=asyncio.FIRST_COMPLETED
                        )
                        await record(over & running.keys())
                finally:
                    handed.cancel()
            while running:
                over, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                await record(over)
        finally:
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)

    async def _object(
        self,
        invocations: Invocations,
        route: EndpointRoute,
        plan: Plan,
        uri: str,
        key: str,
        window: asyncio.Semaphore,
        sent: asyncio.Event,
    ) -> int:
        """Send one object through the model and write its output; its record count.
        ``window``: a slot per payload in flight, shared by the objects running; ``sent``
        is set once the last payload is handed to the router (or the object ends)."""
        output = self.objects.join(self.job.request["TransformOutput"]["S3OutputPath"], key)
        chunks = decompress(self.objects.read_chunks(uri), plan.compression)
        counted = [0]
        if plan.split_type == "None":
            answers = self._whole(invocations, route, plan, uri, chunks, counted, window, sent)
        else:
            answers = self._records(
                invocations, route, plan, uri, chunks, counted, window, sent
            )  # fmt: skip
        try:
            # Closed whatever ends the write, so that its payloads still in flight are
            # cancelled and their slots given back now, not when it is collected.
            async with contextlib.aclosing(answers):
                await self.objects.write(output + ".out", answers)
        except SplitError as exc:
            raise TransformFailed(f"ClientError: Object {uri}: {exc}") from exc
        finally:
            sent.set()
        return counted[0]

    async def _whole(
        self,
        invocations: Invocations,
        route: EndpointRoute,
        plan: Plan,
        uri: str,
        chunks: AsyncIterator[bytes],
        counted: list[int],
        window: asyncio.Semaphore,
        sent: asyncio.Event,
    ) -> AsyncGenerator[bytes, None]:
        """SplitType None: the object is one record, sent as one request."""
        body = bytearray()
        async for chunk in chunks:
            body += chunk
            if len(body) > plan.max_payload_bytes:
                raise TransformFailed(
                    f"ClientError: Object {uri} is larger than MaxPayloadInMB "
                    f"({plan.max_payload_bytes // _MB} MB); set SplitType to split it into "
                    "records."
                )
        record = bytes(body)
        body_sent = record
        if plan.input_filter is not None:
            body_sent = apply_input_filter(record, plan.input_filter, plan.content_type)
        async with window:  # until its output is taken (written, or gathered to be)
            sent.set()
            answer = await self._send(invocations, route, plan, body_sent, f"Object {uri}")
            counted[0] = 1
            yield self._render(plan, Payload(body_sent, 0, 1), answer, {0: record}, whole=True)

    async def _records(
        self,
        invocations: Invocations,
        route: EndpointRoute,
        plan: Plan,
        uri: str,
        chunks: AsyncIterator[bytes],
        counted: list[int],
        window: asyncio.Semaphore,
        sent: asyncio.Event,
    ) -> AsyncGenerator[bytes, None]:
        """Records packed into payloads, each sent once it has a slot of ``window``
        (shared with the other objects running), answers in order. A payload holds its
        slot until its answer is taken by the output's writer (so the answers held at
        once are bounded by the window, wherever they wait)."""
        originals: dict[int, bytes] = {}

        pending: deque[tuple[Payload, asyncio.Task[bytes]]] = deque()

        async def first_answer() -> tuple[Payload, bytes]:
            """The oldest payload's answer; its slot is the caller's to give back."""
            done, task = pending[0]
            answer = await task
            pending.popleft()
            return done, answer

        try:
            async for payload in payloads(
                _filtered(chunks, plan, originals),
                plan.strategy,
                plan.max_payload_bytes,
                plan.split_type,
            ):
                # Every slot taken: this object's own answers free them first (waiting
                # for a slot while holding them would wait for ever).
                while pending and window.locked():
                    done, answer = await first_answer()
                    try:
                        yield self._render(plan, done, answer, originals)
                    finally:
                        window.release()
                    counted[0] += done.count
                await window.acquire()
                where = _where(uri, payload)
                task = asyncio.create_task(
                    self._send(invocations, route, plan, payload.body, where)
                )
                pending.append((payload, task))
                await _written(route, payload, task)
            sent.set()
            while pending:
                done, answer = await first_answer()
                try:
                    yield self._render(plan, done, answer, originals)
                finally:
                    window.release()
                counted[0] += done.count
        finally:
            sent.set()
            for _, task in pending:
                task.cancel()
            await asyncio.gather(*(task for _, task in pending), return_exceptions=True)
            for _ in pending:
                window.release()
            pending.clear()

    def _render(
        self,
        plan: Plan,
        payload: Payload,
        answer: bytes,
        originals: dict[int, bytes],
        *,
        whole: bool = False,
    ) -> bytes:
        """One payload's answer as it goes into the output: per record joined with its
        input and filtered when DataProcessing says so; one line each with AssembleWith
        Line."""
        line = plan.assemble == "Line"
        if not plan.join and plan.output_filter is None:
            return answer + b"\n" if line and not answer.endswith(b"\n") else answer
        if whole or payload.count == 1:
            outputs = [answer.rstrip(b"\r\n")]
        else:
            try:
                outputs = split_answer(answer, payload.count, plan.split_type)
            except SplitError as exc:
                last = payload.first_record + payload.count
                raise SplitError(f"records {payload.first_record + 1}-{last}: {exc}") from exc
        rendered = []
        for offset, output in enumerate(outputs):
            index = payload.first_record + offset
            try:
                if plan.join:
                    source = originals.pop(index, b"")
                    output = join_input(source, output, plan.content_type, plan.accept)
                if plan.output_filter is not None:
                    output = apply_output_filter(output, plan.output_filter, plan.accept)
            except SplitError as exc:
                raise SplitError(f"record {index + 1}: {exc}") from exc
            rendered.append(output)
        text = b"\n".join(rendered)
        return text + b"\n" if line else text

    async def _send(
        self, invocations: Invocations, route: EndpointRoute, plan: Plan, body: bytes, where: str
    ) -> bytes:
        """One payload to the model, retried up to InvocationsMaxRetries; its answer."""
        headers: list[tuple[bytes, bytes]] = []
        if plan.content_type:
            headers.append((CONTENT_TYPE, plan.content_type.encode("latin-1")))
        if plan.accept:
            headers.append((ACCEPT, plan.accept.encode("latin-1")))
        problem = ""
        for _ in range(plan.retries + 1):
            call = Call(headers=headers, body=body, content_length=len(body))
            call.variant = route.variants[0]
            try:
                answer = await invocations.run(route, call)
            except RuntimeFailure as exc:
                problem = exc.message
                continue
            return answer.body
        raise TransformFailed(f"ClientError: {where}: {problem}")

    def _export(self, total: int, done: int, records_done: int) -> None:
        m = self.metrics
        m.transform_objects.labels(self.job.name, "total").set(total)
        m.transform_objects.labels(self.job.name, "done").set(done)
        m.transform_records.labels(self.job.name).set(records_done)


_OBJECTS_AT_ONCE = 128
"""The most objects a job reads and writes at once, whatever its window: each holds its
input and its output open (two descriptors, or two connections to S3)."""

_WAIT_WRITTEN_BYTES = 1 << 20
"""Payloads above this size are seen out before the next is packed (``_written``);
smaller ones leave in a write or two, and a SingleRecord job of many small records
would pay a turn of the loop for each."""


async def _written(route: EndpointRoute, payload: Payload, sending: asyncio.Task[bytes]) -> None:
    """Once ``payload``, just handed to the router by ``sending``, is out to its instance
    (at once if it waits for one, or is small), or ``sending`` is over.

    The next payload is packed on this loop, in steps of about 20 ms of CPU for 6 MB:
    packed while one is written, it holds back the rest of that body while the instance
    waits for it (the gap from one payload's answer to the next one's parse went from a
    median of 17.5-23.8 ms to 11.7-17.3 ms a payload of 6 MB,
    bench/results/transform_throughput.md)."""
    if len(payload.body) <= _WAIT_WRITTEN_BYTES:
        return
    await asyncio.sleep(0)  # the send's first step: a free instance is written to in it
    out = asyncio.ensure_future(_pools_written(route))
    try:
        # Or until the send ends otherwise (failed, timed out): the runner must see it.
        await asyncio.wait((sending, out), return_when=asyncio.FIRST_COMPLETED)
    finally:
        out.cancel()


async def _pools_written(route: EndpointRoute) -> None:
    for variant in route.variants:
        for instance in variant.instances:
            await instance.pool.written()


async def _filtered(
    chunks: AsyncIterator[bytes], plan: Plan, originals: dict[int, bytes]
) -> AsyncIterator[list[bytes]]:
    """The object's records in batches, after the InputFilter; with JoinSource Input,
    each record as read is kept in ``originals`` by its index."""
    index = 0
    cap = plan.max_payload_bytes
    async for batch in record_batches(chunks, plan.split_type, max_record_bytes=cap):
        if plan.join:
            originals.update(enumerate(batch, start=index))
        if plan.input_filter is not None:
            kept = []
            for record in batch:
                try:
                    kept.append(apply_input_filter(record, plan.input_filter, plan.content_type))
                except SplitError as exc:
                    if kept:
                        yield kept  # the records before it go on, as one by one
                    where = index + len(kept) + 1
                    raise SplitError(f"record {where}: InputFilter: {exc}") from exc
            batch = kept
        index += len(batch)
        yield batch


def _where(uri: str, payload: Payload) -> str:
    last = payload.first_record + payload.count - 1
    records_text = (
        f"record {payload.first_record + 1}"
        if payload.count == 1
        else f"records {payload.first_record + 1}-{last + 1}"
    )
    return f"Object {uri}, {records_text}"


def _filter(expression: str | None) -> Any:
    return None if expression in (None, "$") else compile_filter(expression)


def _strategy_env(strategy: str | None) -> str:
    return "MULTI_RECORD" if strategy == "MultiRecord" else "SINGLE_RECORD"


_ADVERTISED_STRATEGIES = {
    "MULTI_RECORD": "MultiRecord",
    "SINGLE_RECORD": "SingleRecord",
    "MultiRecord": "MultiRecord",
    "SingleRecord": "SingleRecord",
}
"""What a model may answer as BatchStrategy at ``/execution-parameters``: SageMaker's
documented ``MULTI_RECORD`` / ``SINGLE_RECORD``, or the API's own spelling."""


def _advertised(parsed: dict[str, Any]) -> dict[str, Any]:
    """The execution parameters a model answered that can be used; a value of the wrong
    kind is left out (the job's own, or the default, applies), as a model's answer is
    advice, not a request the job can be failed for, and a large one is cut down to
    ``_ADVERTISED_LIMITS``."""
    usable: dict[str, Any] = {}
    strategy = _ADVERTISED_STRATEGIES.get(str(parsed.get("BatchStrategy")))
    if strategy is not None:
        usable["BatchStrategy"] = strategy
    for key, most in _ADVERTISED_LIMITS.items():
        value = parsed.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            usable[key] = min(value, most)
    return usable


def bounded_concurrency(asked: int, payload_mb: int) -> int:
    """MaxConcurrentTransforms as a job runs: at least 1, and within SageMaker's bound on
    the payloads in flight to one instance, which the gateway holds (MAX_PAYLOADS_MB).
    A request that gives both values is held to the bound at CreateTransformJob; a value
    left to the model's execution parameters or to the defaults is cut down here."""
    return min(max(asked, 1), max(MAX_PAYLOADS_MB // max(payload_mb, 1), 1))


_ADVERTISED_LIMITS = {"MaxPayloadInMB": MAX_PAYLOADS_MB, "MaxConcurrentTransforms": MAX_PAYLOADS_MB}
"""The most a model's answer is taken at: SageMaker's limits (the payloads in flight to
an instance are cut down to theirs by ``bounded_concurrency``)."""
