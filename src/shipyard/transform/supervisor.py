"""TransformSupervisor: runs every active transform job, and ends it in the store.

Desired state is the job's status: an InProgress job gets a run (transform/runner.py) if
it has none, which is how a job survives a gateway restart (its finished objects are
skipped); a Stopping job's run is cancelled, its instances stopped, and the job recorded
Stopped. A run that returns makes the job Completed; one that fails, Failed with the
reason. Each of these changes is written with its event in one transaction.

Runs live in the gateway (they stream objects through it); stopping the gateway cancels
them and stops their instances, leaving the jobs InProgress for the next start. Gateways
sharing the store each run only the jobs whose lease they hold (leases.py); a
run whose lease runs out is cancelled the same way, for the next holder to resume.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from shipyard.background import Wakeup
from shipyard.errors import ShipyardError, TransformFailed
from shipyard.events.kinds import Announcer
from shipyard.jobs.supervisor import Claim
from shipyard.metrics import Metrics
from shipyard.provisioning.fleet import Provisioner
from shipyard.records import JobStatus, TransformJob
from shipyard.storage.metadata import MetadataStore, now
from shipyard.storage.objects import ObjectStore
from shipyard.storage.transform_jobs import TransformStore
from shipyard.transform.runner import TransformRun

log = logging.getLogger(__name__)


class TransformSupervisor:
    """Starts, stops and ends transform runs so they match the store."""

    def __init__(
        self,
        *,
        store: TransformStore,
        models: MetadataStore,
        provisioner: Provisioner,
        objects: ObjectStore,
        metrics: Metrics,
        announcer: Announcer[TransformJob],
        on_event: Callable[[], None],
        poll_period_s: float = 1.0,
        claim: Claim | None = None,
    ) -> None:
        self.store = store
        self.claim = claim
        """Takes the leases of the jobs named and says which this gateway holds, so it
        runs only those; None: every job (the store is its alone). Two gateways running
        one job would start two fleets for it and score it twice."""
        self.models = models
        self.provisioner = provisioner
        self.objects = objects
        self.metrics = metrics
        self.announcer = announcer
        self._on_event = on_event
        self.poll_period_s = poll_period_s
        self._wake = Wakeup()
        self._runs: dict[str, asyncio.Task[None]] = {}
        self._stopping: set[asyncio.Task[None]] = set()
        """Ended runs stopping their instances: no longer the job's (its lease may go),
        so no pass cancels them; the supervisor's end waits for them."""

    def __repr__(self) -> str:
        return f"TransformSupervisor(running={sorted(self._runs)})"

    def wake(self) -> None:
        """Look at the jobs now; safe from any thread."""
        self._wake.set()

    async def run(self) -> None:
        self._wake.bind()
        try:
            while True:
                try:
                    await self.step()
                except Exception:  # one bad pass must not stop the jobs
                    log.exception("transform supervisor pass failed")
                await self._wake.wait(self.poll_period_s)
        finally:
            runs = list(self._runs.values())
            for task in runs:
                task.cancel()
            # Their instances stop as they unwind; the jobs stay InProgress and resume.
            await asyncio.gather(*runs, return_exceptions=True)
            await asyncio.gather(*self._stopping, return_exceptions=True)

    async def step(self) -> None:
        jobs = await asyncio.to_thread(self.store.list, active_only=True)
        if self.claim is not None:
            held = await self.claim([j.name for j in jobs])
            for name in set(self._runs) - held:
                self._runs[name].cancel()  # another gateway may take it: it resumes there
            jobs = [j for j in jobs if j.name in held]
        for job in jobs:
            task = self._runs.get(job.name)
            if job.status is JobStatus.IN_PROGRESS and task is None:
                self._start(job)
            elif job.status is JobStatus.STOPPING:
                if task is not None:
                    task.cancel()
                else:
                    await self._end(job.name, JobStatus.STOPPED, None)

    def _start(self, job: TransformJob) -> None:
        run = TransformRun(
            job,
            store=self.store,
            models=self.models,
            provisioner=self.provisioner,
            objects=self.objects,
            metrics=self.metrics,
        )
        task = asyncio.create_task(self._drive(job, run), name=f"transform-{job.name}")
        self._runs[job.name] = task
        task.add_done_callback(lambda _: self._runs.pop(job.name, None))

    async def _drive(self, job: TransformJob, run: TransformRun) -> None:
        if job.started is None:
            await self._change(job.name, started=now())
        try:
            await run.run()
        except TransformFailed as exc:
            log.info("transform job %s failed: %s", job.name, exc)
            await self._end(job.name, JobStatus.FAILED, str(exc)[:1024])
        except asyncio.CancelledError:
            current = await asyncio.to_thread(self.store.get, job.name)
            if current.status is JobStatus.STOPPING:
                await asyncio.shield(self._end(job.name, JobStatus.STOPPED, None))
            raise
        except Exception as exc:
            log.exception("transform job %s failed", job.name)
            await self._end(job.name, JobStatus.FAILED, f"InternalServerError: {exc}"[:1024])
        else:
            await self._end(job.name, JobStatus.COMPLETED, None)
        finally:
            self._stop_instances(run)
            self.wake()

    def _stop_instances(self, run: TransformRun) -> None:
        """Stop ``run``'s instances once its end is recorded (as SageMaker's
        TransformEndTime: what the job made is whole; their exit is no part of it), in a
        task of its own: the ended job is no longer active, so the next pass lets its
        lease go and would cancel its run mid-stop, leaving an instance that is slow to
        exit running."""
        task = asyncio.create_task(_stop(run), name=f"transform-stop-{run.job.name}")
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    async def _end(self, name: str, status: JobStatus, reason: str | None) -> None:
        await self._change(
            name,
            status=status,
            failure_reason=reason,
            ended=now(),
            event_for=self.announcer,
            expect=[JobStatus.IN_PROGRESS, JobStatus.STOPPING],
        )
        self._on_event()

    async def _change(self, name: str, **changes: object) -> None:
        try:
            await asyncio.to_thread(self.store.change, name, **changes)  # type: ignore[arg-type]
        except ShipyardError as exc:
            log.info("transform job %s changed meanwhile: %s", name, exc)


async def _stop(run: TransformRun) -> None:
    try:
        await run.stop()
    except Exception:
        log.exception("stopping the instances of transform job %s failed", run.job.name)
