"""The batcher: packs batch-tier lines into provider batches and follows them to their end
(core/tiers.py, store/tier_records.py). Run by the maintenance leader, so one process per
ledger does it.

Each round:

1. Queued lines whose task must leave the batch tier now to meet its deadline on the sync
   tier (:meth:`~floodway.kinds.TierPlan.leave_by`) are withdrawn: their tasks are sent on a
   faster tier.
2. The queued lines of a kind and model are packed into a provider batch once they fill one
   (``batch_max_lines``) or the oldest has waited ``batch_max_age``, as many as the kind's
   ``batch_queue_limit`` leaves room for beside its batches not ended yet (the rest wait
   for a later round). The batch's row and its lines are written before the provider is
   asked (its id is the batch's tag), then the batch created and its provider id recorded.
3. A batch whose row was written but whose provider id was not (a crash, or a create whose
   answer was lost) is looked for at the provider (:meth:`~floodway.kinds.BatchApi.find`),
   and created only if it is not there: never two provider batches of the same lines. While
   such a row waits, no other batch is created (a failed create ends the round's packing
   too), so it is the ledger's only row without a provider id and the batch it made, if
   any, the only unrecorded one created since it was packed: the first candidate no row
   recorded is it, whether or not the provider keeps its tag (Anthropic's does not).
4. Each sent batch is polled (after a tenth of its age, from 1 s to 1 min). Once it ended,
   its output and error files are read and each line recorded (answered, or failed retryably
   or for good); lines the batch ended without are withdrawn. Its tasks are then due for
   their poll. A batch still running when one of its lines must leave for its deadline is
   cancelled: what it answered until then is kept (and billed), the rest goes on a faster
   tier. A batch cancelling is looked at every round until it ended (its lines' deadlines
   are near).
"""

from __future__ import annotations

import logging
from collections import Counter

from floodway.core.tiers import CANCELLING, CREATING, SoughtBatch, UpstreamView
from floodway.kinds import BatchApi, KindSpec
from floodway.runtime import Runtime
from floodway.store.tier_records import UpstreamBatch

log = logging.getLogger("floodway.tier_batches")

#: a provider batch in progress is looked at after a tenth of its age (the lag of its end's
#: detection is a tenth of its duration), within these bounds
POLL_SHARE, POLL_MIN_S, POLL_MAX_S = 0.1, 1.0, 60.0


class Batcher:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self._looked: dict[str, float] = {}
        #: provider batches created and lines sent by this process (for stats and tests)
        self.created = 0
        self.lines_sent = 0

    def _specs(self) -> dict[str, KindSpec]:
        return {s.name: s for s in self.runtime.kinds.specs() if s.tiers.batch is not None}

    async def run_once(self) -> None:
        specs = self._specs()
        if not specs:
            return
        await self._withdraw_late(specs)
        if not await self._mending(specs):
            await self._flush(specs)
        for batch in await self.runtime.tier_records.open_batches():
            spec = specs.get(batch.kind)
            if spec is None:
                continue
            try:
                if batch.state == CREATING:
                    await self._send(spec, batch, reconcile=True)
                else:
                    await self._follow(spec, batch)
            except Exception as exc:  # one provider's failure must not stop the others
                log.warning("provider batch %s of %s: %s", batch.id, batch.kind, exc)

    async def _withdraw_late(self, specs: dict[str, KindSpec]) -> None:
        records, now = self.runtime.tier_records, self.runtime.clock.now()
        for spec in specs.values():
            # leave_by(deadline) <= now  <=>  deadline <= now + (deadline - leave_by)
            room = spec.tiers.leave_by(0.0)
            late = await records.queued_due(spec.name, now - room)
            await records.withdraw_queued([line.task_id for line in late], now)

    async def _mending(self, specs: dict[str, KindSpec]) -> bool:
        """A batch's row waits to be mended (its provider id unrecorded): no other batch is
        created until it is, so that it is the only unrecorded one (see step 3)."""
        batches = await self.runtime.tier_records.open_batches()
        return any(b.state == CREATING and b.kind in specs for b in batches)

    async def _flush(self, specs: dict[str, KindSpec]) -> None:
        records = self.runtime.tier_records
        enqueued: Counter[str] = Counter()  # lines in provider batches not ended, per kind
        for open_batch in await records.open_batches():
            enqueued[open_batch.kind] += open_batch.lines
        for pool in await records.pools():
            spec = specs.get(pool.kind)
            if spec is None:
                continue
            plan = spec.tiers
            now = self.runtime.clock.now()
            if pool.lines < plan.max_lines and now - pool.oldest < plan.max_age_s:
                continue
            left = plan.room(enqueued[pool.kind], pool.lines)  # the rest waits for room
            while left > 0:
                batch = await records.pack(pool.kind, pool.model, min(plan.max_lines, left), now)
                if batch is None:
                    break
                left -= batch.lines
                enqueued[pool.kind] += batch.lines
                try:
                    await self._send(spec, batch, reconcile=False)
                except Exception as exc:  # its row stays "creating": mended next round
                    log.warning("provider batch %s of %s not sent: %s", batch.id, pool.kind, exc)
                    return

    async def _send(self, spec: KindSpec, batch: UpstreamBatch, *, reconcile: bool) -> None:
        api = _api(spec)
        records = self.runtime.tier_records
        view = await self._find(api, batch) if reconcile else None
        if view is None:
            lines = await records.batch_lines(batch.id)
            view = await api.create([api.line(line.task_id, line.body) for line in lines], batch.id)
            self.created += 1
            self.lines_sent += len(lines)
        await records.sent(batch.id, view.ref, self.runtime.clock.now())

    async def _find(self, api: BatchApi, batch: UpstreamBatch) -> UpstreamView | None:
        found = await api.find(SoughtBatch(batch.id, batch.lines, batch.created_at))
        taken = await self.runtime.tier_records.recorded([view.ref for view in found])
        return next((view for view in found if view.ref not in taken), None)

    async def _follow(self, spec: KindSpec, batch: UpstreamBatch) -> None:
        now = self.runtime.clock.now()
        age = now - (batch.sent_at or batch.created_at)
        gap = min(POLL_MAX_S, max(POLL_MIN_S, POLL_SHARE * age))
        if now - self._looked.get(batch.id, float("-inf")) < gap:
            return
        self._looked[batch.id] = now
        api = _api(spec)
        assert batch.provider_id is not None  # a sent batch has one
        view = await api.retrieve(batch.provider_id)
        if not view.ended and view.status != CANCELLING:
            lines = await self.runtime.tier_records.batch_lines(batch.id)
            deadlines = [line.deadline_at for line in lines if line.deadline_at is not None]
            if not deadlines or now < spec.tiers.leave_by(min(deadlines)):
                return
            log.info("provider batch %s would miss a deadline: cancelled", batch.id)
            view = await api.cancel(batch.provider_id)
        if not view.ended:  # cancelling: looked at every round, its end brings its lines
            self._looked.pop(batch.id, None)
            return
        results = await api.results(view)
        # A completed batch's turnaround is learned, and kept with it for the next start-up.
        took = now - batch.created_at if view.status == "completed" else None
        await self.runtime.tier_records.end_batch(batch.id, results, self.runtime.clock.now(), took)
        self._looked.pop(batch.id, None)
        if took is not None:
            spec.tiers.times.observe("batch", took)


def _api(spec: KindSpec) -> BatchApi:
    assert spec.tiers.batch is not None  # only kinds with the batch tier are batched
    return spec.tiers.batch
