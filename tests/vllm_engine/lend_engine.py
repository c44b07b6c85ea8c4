"""The checking connectors test_vllm_lending.py runs in its engines (examples/two_vllm/engine.py
drives each engine in a process of its own): LendingChecker for the lender, which checks at
every step that no block of a unit out of vLLM's hands is in any block table vLLM scheduled or
any running request holds, and notes every preemption with whether a reclaim was in flight then;
BorrowingRecorder for the borrower (recording.RecordingConnector), which compares every page it
loads with the page vLLM wrote and counts the loads that failed. engine.py reports their records
with its state (extra_state)."""

from __future__ import annotations

import recording
from swiftkv.integrations.vllm import SwiftKVConnector

CHECKS = {"steps": 0, "lent_in_table": 0, "preempted": 0, "preempted_while_reclaiming": 0,
          "load_errors": 0}
_SCHEDULER = []  # vLLM's scheduler (attach)


def attach(core) -> None:
    _SCHEDULER[:] = [core.scheduler]


def extra_state() -> dict:
    out = {"checks": dict(CHECKS), "compared": len(recording.COMPARED),
           "equal": sum(1 for c in recording.COMPARED if c[3])}
    recording.COMPARED.clear()
    return out


class LendingChecker(SwiftKVConnector):
    """The lender's connector, checking vLLM's block tables against the units out of its hands."""

    def build_connector_meta(self, scheduler_output):
        meta = super().build_connector_meta(scheduler_output)
        lender = self.connector_scheduler.lender
        if lender is None:
            return meta
        CHECKS["steps"] += 1
        out = {b.block_id for k in range(lender.num_units) for b in lender._fenced[k]}
        tables = [r.block_ids for r in scheduler_output.scheduled_new_reqs]
        tables += [ids for ids in scheduler_output.scheduled_cached_reqs.new_block_ids if ids]
        if _SCHEDULER:  # every running request's whole table, not only this step's new blocks
            sched = _SCHEDULER[0]
            tables += [sched.kv_cache_manager.get_block_ids(r.request_id) for r in sched.running]
        for groups in tables:
            for ids in groups:
                CHECKS["lent_in_table"] += len(out & set(ids))
        for _ in scheduler_output.preempted_req_ids or ():
            CHECKS["preempted"] += 1
            if lender._moving() is not None and lender.has_pending_block_frees():
                CHECKS["preempted_while_reclaiming"] += 1
        return meta


class BorrowingRecorder(recording.RecordingConnector):
    """The borrower's connector: recording.RecordingConnector, counting the blocks whose loads
    failed (vLLM recomputes them)."""

    def get_block_ids_with_load_errors(self) -> set:
        failed = super().get_block_ids_with_load_errors()
        CHECKS["load_errors"] += len(failed)
        return failed
