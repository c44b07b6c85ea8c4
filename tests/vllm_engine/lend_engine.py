"""One vLLM engine on the CPU in a process of its own, for test_vllm_lending.py: a lender (A),
a borrower (B), or a plain engine (A's reference), driven by one JSON command a line on stdin and
answering one JSON line on stdout.

    python lend_engine.py ROLE MODEL_DIR EXTRA_JSON [ENGINE_JSON]

ENGINE_JSON: {"blocks": vLLM's KV blocks, "tp": tensor parallel workers (vLLM's multiprocess
executor), ...}.

ROLE lender runs LendingChecker, which checks at every step that no block of a unit out of vLLM's
hands is in any block table vLLM scheduled, and notes every preemption with whether a reclaim
was in flight then; ROLE borrower runs BorrowingRecorder (recording.RecordingConnector), which
compares every page it loads with the page vLLM wrote and counts the loads that failed. Commands:

    {"op": "gen", "prompts": [[token, ...], ...], "max_tokens": N}
        -> {"tokens": [[...], ...], "logprobs": [[...], ...]}
    {"op": "forget"} -> vLLM's own prefix cache emptied, once the saves are reported
    {"op": "tiers", "prompt": [...]} -> {"tiers": [...]}: where each of its whole chunks is
    {"op": "state"} -> what the connector knows (lender: units lent, its stats, the checks; all:
        the KV cache layout; borrower: the loads compared, the tiers its lookups found)
    {"op": "quit"}
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine core in this process

import recording  # noqa: E402
from swiftkv.integrations.vllm import SwiftKVConnector  # noqa: E402

CHECKS = {"steps": 0, "lent_in_table": 0, "preempted": 0, "preempted_while_reclaiming": 0}


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
        for groups in tables:
            for ids in groups:
                CHECKS["lent_in_table"] += len(out & set(ids))
        # The requests' whole tables, not only this step's new blocks.
        sched = self._vllm_scheduler
        if sched is not None:
            for rid in sched.running:
                blocks = sched.kv_cache_manager.get_block_ids(rid.request_id)
                for ids in blocks:
                    CHECKS["lent_in_table"] += len(out & set(ids))
        for _ in scheduler_output.preempted_req_ids or ():
            CHECKS["preempted"] += 1
            if lender._moving() is not None and lender.has_pending_block_frees():
                CHECKS["preempted_while_reclaiming"] += 1
        return meta

    _vllm_scheduler = None


class BorrowingRecorder(recording.RecordingConnector):
    """The borrower's connector: recording.RecordingConnector, counting the blocks whose loads
    failed (vLLM recomputes them)."""

    def get_block_ids_with_load_errors(self) -> set:
        failed = super().get_block_ids_with_load_errors()
        CHECKS["load_errors"] = CHECKS.get("load_errors", 0) + len(failed)
        return failed


def main() -> int:
    role, model_dir, extra = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    engine = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.inputs import TokensPrompt

    module, cls = {"lender": ("lend_engine", "LendingChecker"),
                   "borrower": ("lend_engine", "BorrowingRecorder"),
                   "plain": ("lend_engine", "SwiftKVConnector")}[role]
    config = KVTransferConfig(kv_connector=cls, kv_connector_module_path=module,
                              kv_role="kv_both", kv_load_failure_policy="recompute",
                              kv_connector_extra_config=extra)
    tp = engine.get("tp", 1)  # tensor parallel workers, in processes of their own
    more = {"tensor_parallel_size": tp, "distributed_executor_backend": "mp"} if tp > 1 else {}
    llm = LLM(model=model_dir, skip_tokenizer_init=True, dtype="bfloat16",
              max_model_len=engine.get("max_model_len", 2048), enforce_eager=True,
              block_size=32, seed=0, max_num_seqs=engine.get("max_num_seqs", 8),
              num_gpu_blocks_override=engine.get("blocks"), kv_transfer_config=config,
              enable_prefix_caching=True, **more)
    core = llm.llm_engine.engine_core.engine_core
    conn = core.scheduler.connector
    # vLLM imported this file as the module lend_engine (kv_connector_module_path): its checks.
    me = sys.modules.get("lend_engine", sys.modules[__name__])
    me.LendingChecker._vllm_scheduler = core.scheduler
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "gen":
            sp = SamplingParams(max_tokens=cmd["max_tokens"], temperature=0, logprobs=1,
                                detokenize=False)
            out = llm.generate([TokensPrompt(prompt_token_ids=p) for p in cmd["prompts"]], sp,
                               use_tqdm=False)
            answer = {"tokens": [list(o.outputs[0].token_ids) for o in out],
                      "logprobs": [[lp[t].logprob for t, lp in zip(o.outputs[0].token_ids,
                                                                   o.outputs[0].logprobs)]
                                   for o in out]}
        elif cmd["op"] == "forget":
            # A step that lets the connector report its saves, then vLLM's own prefix cache
            # emptied: what comes next is loaded from the library.
            llm.generate([TokensPrompt(prompt_token_ids=[7, 8, 9])],
                         SamplingParams(max_tokens=1, detokenize=False), use_tqdm=False)
            answer = {"reset": bool(llm.reset_prefix_cache())}
        elif cmd["op"] == "tiers":
            from swiftkv.integrations.vllm import worker as svw
            (store,) = svw.STORES.values()
            names = recording.names_of(cmd["prompt"], int(extra["chunk_tokens"]), 32)
            answer = {"tiers": [int(t) for t in store.model.lookup_named(names).residency]}
        elif cmd["op"] == "state":
            answer = {"layout": core.vllm_config.cache_config.kv_cache_layout,
                      "free_blocks": core.scheduler.kv_cache_manager.block_pool
                      .get_num_free_blocks()}
            lender = conn.connector_scheduler.lender
            if lender is not None:
                answer.update(units=lender.num_units, unit_blocks=lender.opts.unit_blocks,
                              lent=[k for k, s in enumerate(lender.state)
                                    if s.value == "lent"],
                              stats=vars(lender.stats), checks=dict(me.CHECKS),
                              moving=[(k, lender.state[k].value, len(lender._fenced[k]))
                                      for k in [lender._moving()] if k is not None])
            if role == "borrower":
                answer.update(load_errors=me.CHECKS.get("load_errors", 0),
                              compared=len(recording.COMPARED),
                              equal=sum(1 for c in recording.COMPARED if c[3]),
                              offers=recording.OFFERS[-cmd.get("offers", 0):]
                              if cmd.get("offers") else [])
                recording.COMPARED.clear()
        else:
            break
        print(json.dumps(answer), flush=True)
    del llm
    return 0


if __name__ == "__main__":
    sys.exit(main())
