"""The vLLM connector against vLLM itself, on the CPU: vLLM's real V1 scheduler (its requests, its
block allocator and prefix cache, its handling of load failures) drives the connector's
scheduler side, and a small stand-in for vLLM's model runner (kvsim.py) drives the worker side
with the call order vLLM's attention layers use (per layer: wait_for_layer_load, compute,
save_kv_layer), over CPU tensors shaped as vLLM allocates them, checking every loaded byte.

An engine runs its worker in the test's process (vLLM's single-process executor) or, for
tensor parallelism, one worker process per rank (tp_worker.py), as vLLM's multiprocess executor
does: each with its shard of the KV heads, their outputs combined by vLLM's own aggregator.
"""

from __future__ import annotations

import collections
import json
import os
import time

import numpy as np
import pytest
import torch
from vllm import SamplingParams
from vllm.config import (CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig, ParallelConfig,
                         SchedulerConfig, SpeculativeConfig, VllmConfig)
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import DraftTokenIds, KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus
from vllm.v1.structured_output import StructuredOutputManager

import swiftkv
from kvsim import (BLOCK, CHUNK, DIM, DRAFTER, HEADS, LAYERS, NAMES, KVTensors, names_of,
                   prefix_hashes, worker_step)
from swiftkv.integrations import vllm as sv
from swiftkv.integrations.vllm import worker as svw  # noqa: E402
from swiftkv.integrations.vllm import common as svc  # noqa: E402
from swiftkv.integrations.vllm import lookup as svl  # noqa: E402

EOS = 999

init_none_hash(sha256)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny Llama config (no weights: nothing is downloaded, nothing runs the model)."""
    d = tmp_path_factory.mktemp("model")
    (d / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": HEADS,
        "head_dim": DIM, "num_hidden_layers": LAYERS, "vocab_size": 1000,
        "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "torch_dtype": "float16",
        "tie_word_embeddings": False}))
    return str(d)


class Engine:
    """vLLM's scheduler and its workers with the connector, on the CPU: one worker in this
    process, or (workers=N) N worker processes of a tensor-parallel engine."""

    def __init__(self, model_dir, *, num_blocks=256, layout="LBNHC", extra=None, budget=64,
                 engine_id=None, parallel=None, kv_role="kv_both", workers=1,
                 async_scheduling=False, kernel_block=BLOCK, spec_tokens=0, drafter_dir=None):
        self.num_blocks = num_blocks
        self.layout = layout
        extra = {"host_budget_bytes": 64 << 20, "chunk_tokens": CHUNK, **(extra or {})}
        if workers > 1:
            parallel = ParallelConfig(tensor_parallel_size=workers)
        model = ModelConfig(model=model_dir, dtype="float16", seed=0, skip_tokenizer_init=True)
        speculative = None
        if spec_tokens:
            # vLLM rolls num_computed_tokens back past the drafts a step rejected. Synchronous:
            # the engine core hands the scheduler the runner's drafts after each step. Async: the
            # scheduler schedules placeholders for drafts only the runner knows, counting them
            # computed until the step's output says how many were rejected; the runner, which
            # knows, computes at the true positions (vLLM's GPU runner does the same).
            # With drafter_dir, an EAGLE head's config: its layer (DRAFTER) joins the KV cache
            # and runs once per draft token (the stand-in's drafts stay its own).
            parallel = parallel or ParallelConfig()
            how = dict(method="eagle", model=drafter_dir) if drafter_dir else \
                dict(method="ngram", prompt_lookup_max=3, prompt_lookup_min=1)
            speculative = SpeculativeConfig(num_speculative_tokens=spec_tokens,
                                            target_model_config=model,
                                            target_parallel_config=parallel, **how)
        self.spec_tokens = spec_tokens
        # Drafts proposed and accepted; steps vLLM scheduled past drafts it did not know rejected.
        self.drafts = {"proposed": 0, "accepted": 0, "late": 0}
        self.runner_drafts = {}    # id -> the runner's drafts for its next step (async)
        self.unseen_rejections = {}  # id -> drafts rejected by steps whose output vLLM lacks
        self.step_rejections = {}  # id(model runner output) -> {id: drafts it rejected}
        self.config = VllmConfig(
            model_config=model,
            scheduler_config=SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=budget,
                                             max_model_len=4096, enable_chunked_prefill=True,
                                             is_encoder_decoder=False,
                                             async_scheduling=async_scheduling),
            cache_config=CacheConfig(block_size=BLOCK, gpu_memory_utilization=0.9,
                                     cache_dtype="auto", enable_prefix_caching=True),
            kv_transfer_config=KVTransferConfig(
                kv_connector="SwiftKVConnector",
                kv_connector_module_path="swiftkv.integrations.vllm", kv_role=kv_role,
                kv_connector_extra_config=extra, kv_load_failure_policy="recompute",
                **({"engine_id": engine_id} if engine_id else {})),
            device_config=DeviceConfig("cpu"),
            **({"parallel_config": parallel} if parallel else {}),
            **({"speculative_config": speculative} if speculative else {}))
        # A worker's KV cache spec names its shard of the KV heads; the scheduler gets the same.
        self.drafter_passes = spec_tokens if drafter_dir else 0
        self.kv_config = KVCacheConfig(
            num_blocks=num_blocks, kv_cache_tensors=[],
            kv_cache_groups=[KVCacheGroupSpec(NAMES + [DRAFTER] * bool(drafter_dir),
                                              FullAttentionSpec(
                block_size=BLOCK, num_kv_heads=HEADS // workers, head_size=DIM,
                dtype=torch.float16))])
        self.config.cache_config.num_gpu_blocks = num_blocks
        self.procs = []            # (process, pipe) per rank, when the workers have their own
        self.worker = None
        # vLLM makes the workers (and their KV tensors) before the scheduler.
        if workers == 1:
            self.worker = sv.SwiftKVConnector(self.config, KVConnectorRole.WORKER,
                                              self.kv_config)
            self.kvt = KVTensors(layout, num_blocks, kernel_block=kernel_block)
            self.tensors = self.kvt.tensors
            if drafter_dir:  # vLLM hands the connector the drafter's layer too
                self.tensors[DRAFTER] = torch.zeros_like(self.tensors[NAMES[0]])
            self.worker.register_kv_caches(self.tensors)
        else:
            import multiprocessing
            import tp_worker
            mp = multiprocessing.get_context("spawn")
            for rank in range(workers):
                mine, theirs = mp.Pipe()
                proc = mp.Process(target=tp_worker.main, args=(
                    theirs, self.config, self.kv_config, rank, layout, num_blocks), daemon=True)
                proc.start()
                self.procs.append((proc, mine))
            self.sockets = [self._answer(rank) for rank in range(workers)]
            from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator
            self.aggregator = KVOutputAggregator(workers)
        # With async scheduling (vLLM's default where the executor allows it) the engine core
        # schedules a step before the output of the one before is back: step() does as vLLM's
        # step_with_batch_queue does, with a queue of two steps.
        cls = AsyncScheduler if async_scheduling else Scheduler
        self.scheduler = cls(vllm_config=self.config, kv_cache_config=self.kv_config,
                             log_stats=True,
                             structured_output_manager=StructuredOutputManager(self.config),
                             block_size=BLOCK)
        self.async_scheduling = async_scheduling
        self.in_flight = collections.deque()  # (scheduler output, model runner output)
        self.connector = self.scheduler.connector
        self.matched = []          # (request id, num_computed_tokens, (tokens, async))
        offer = self.connector.get_num_new_matched_tokens

        def spy(request, num_computed_tokens):
            got = offer(request, num_computed_tokens)
            self.matched.append((request.request_id, num_computed_tokens, got))
            return got

        self.connector.get_num_new_matched_tokens = spy
        self.requests = {}         # id -> vllm Request
        self.computed = {}         # id -> tokens the stand-in computed, over all steps
        self.pending = {}          # id -> tokens sampled in steps whose output vLLM has not had
        self.errors = []           # block ids reported, per step
        self.outputs = {}          # id -> generated tokens

    def _answer(self, rank: int):
        proc, pipe = self.procs[rank]
        if not pipe.poll(120):
            raise AssertionError(f"worker {rank} did not answer (alive: {proc.is_alive()})")
        status, got = pipe.recv()
        if status != "ok":
            raise AssertionError(f"worker {rank}:\n{got}")
        return got

    def ask(self, rank: int, cmd: str, arg=None):
        """A command to worker process `rank` (tp_worker.py) and its answer."""
        self.procs[rank][1].send((cmd, arg))
        return self._answer(rank)

    def add(self, rid: str, tokens, max_tokens: int = 4) -> Request:
        sp = SamplingParams(max_tokens=max_tokens)
        sp.update_from_generation_config({}, EOS)
        r = Request(request_id=rid, prompt_token_ids=list(tokens), sampling_params=sp,
                    pooling_params=None, mm_features=None,
                    block_hasher=get_request_block_hasher(BLOCK, sha256))
        self.requests[rid] = r
        self.computed.setdefault(rid, 0)
        self.scheduler.add_request(r)
        return r

    def step(self, before_worker=None):
        """One engine step: the scheduler, then the stand-in model runner and the connector's
        worker side, then the scheduler's update (with async scheduling, of the oldest step in
        flight, once two are). Returns the failed blocks of the step run, if one ran."""
        if not self.async_scheduling:
            out, mro, errors = self._execute(before_worker)
            self._update(out, mro)
            if self.spec_tokens and out.total_num_scheduled_tokens:
                self._propose()
            return errors
        errors = set()
        if self.scheduler.has_requests():
            out, mro, errors = self._execute(before_worker)
            self.in_flight.appendleft((out, mro))
            if len(self.in_flight) < 2 and (out.total_num_scheduled_tokens > 0 or
                                            self.scheduler.has_requests()):
                return errors
        if self.in_flight:
            self._update(*self.in_flight.pop())
        return errors

    def _true_token(self, rid: str, position: int) -> int:
        """What the stand-in model samples at `position` of rid."""
        return (hash(rid) + position) % 900

    def _drafts_from(self, rid: str, n: int) -> list:
        """The drafter's tokens for positions n, n+1, ...: the tokens the model will sample, but
        where a position's hash says otherwise (about two in five), one it will reject."""
        return [self._true_token(rid, p) + (1 if (p * 37 + len(rid)) % 5 < 2 else 0)
                for p in range(n, n + self.spec_tokens)]

    def _propose(self) -> None:
        """Drafts for every decoding request, as vLLM's engine core hands the drafter's to the
        scheduler after a synchronous step."""
        ids, drafts = [], []
        for r in self.scheduler.running:
            n = r.num_tokens
            if r.num_computed_tokens < n - 1:  # still prefilling: vLLM ignores drafts
                continue
            ids.append(r.request_id)
            drafts.append(self._drafts_from(r.request_id, n))
        if ids:
            self.scheduler.update_draft_token_ids(DraftTokenIds(ids, drafts))

    def _known(self, rid: str) -> list:
        """rid's tokens as the model runner knows them: vLLM's, then those it sampled in steps
        whose output vLLM has not had yet (under async scheduling; vLLM's runner keeps them)."""
        return list(self.requests[rid].all_token_ids) + self.pending.get(rid, [])

    def _update(self, out, mro) -> None:
        for rid, sampled in zip(mro.req_ids, mro.sampled_token_ids):
            for _ in sampled:  # vLLM takes them now, or drops them (a failed load, a stop)
                self.pending[rid].pop(0)
        for rid, n in self.step_rejections.pop(id(mro), {}).items():
            self.unseen_rejections[rid] -= n  # vLLM now rolls its count back itself
        self.scheduler.update_from_output(out, mro)

    def _execute(self, before_worker):
        """Schedules a step and runs it: (scheduler output, model runner output, failed
        blocks)."""
        out = self.scheduler.schedule()
        if before_worker is not None:
            before_worker(out)
        # Each scheduled request's first computed token and blocks, from vLLM's own output.
        work = [(r.req_id, r.num_computed_tokens) for r in out.scheduled_new_reqs]
        c = out.scheduled_cached_reqs
        work += list(zip(c.req_ids, c.num_computed_tokens))
        plan, drafts_of = [], {}
        for rid, start in work:
            n = out.num_scheduled_tokens[rid]
            blocks = self.scheduler.kv_cache_manager.get_block_ids(rid)[0]
            # The stand-in's own tokens: under async scheduling the last one sampled is not yet
            # in vLLM's request when the next step is scheduled (vLLM's runner has it). Drafts
            # follow them: the step writes their K/V too, rejected or not.
            drafts = list(out.scheduled_spec_decode_tokens.get(rid, ()))
            if self.async_scheduling and drafts:  # placeholders: the runner has the drafts
                drafts = self.runner_drafts.pop(rid)[:len(drafts)]
                self.drafts["late"] += self.unseen_rejections.get(rid, 0) > 0
                start -= self.unseen_rejections.get(rid, 0)
                n = 1 + len(drafts)
            tokens = (self._known(rid) + drafts)[:start + n]
            assert len(tokens) == start + n
            plan.append((rid, start, start + n, torch.tensor(blocks), prefix_hashes(tokens)))
            drafts_of[rid] = drafts
        runs = bool(out.total_num_scheduled_tokens)
        if self.worker is not None:
            sending, errors = worker_step(self.worker, self.kvt, out.kv_connector_metadata, plan,
                                          out.has_sync_kv_loads, runs, out.finished_req_ids,
                                          drafter_passes=self.drafter_passes)
            outputs = [KVConnectorOutput(finished_sending=sending or None,
                                         invalid_block_ids=errors)]
        else:
            for _, pipe in self.procs:
                pipe.send(("step", (out.kv_connector_metadata, plan, out.has_sync_kv_loads, runs,
                                    out.finished_req_ids)))
            outputs = [KVConnectorOutput(finished_sending=sending or None,
                                         invalid_block_ids=errors)
                       for sending, errors in map(self._answer, range(len(self.procs)))]
            errors = set().union(*(o.invalid_block_ids for o in outputs))
        self.errors.append(errors)
        sampled, rejections = [], {}
        for rid, start, end, _, _ in plan:
            drafts = drafts_of[rid]
            self.computed[rid] += end - start
            known = len(self._known(rid))
            # The step computed every known token: it samples the next, and each draft the
            # model agrees with (vLLM's rejection sampler), then one more after those.
            done = end - len(drafts) >= known
            toks = []
            if done:
                toks.append(self._true_token(rid, known))
                for d in drafts:
                    if d != toks[-1]:
                        break
                    toks.append(self._true_token(rid, known + len(toks)))
                self.drafts["proposed"] += len(drafts)
                self.drafts["accepted"] += len(toks) - 1
                rejections[rid] = len(drafts) - (len(toks) - 1)
                self.unseen_rejections[rid] = self.unseen_rejections.get(rid, 0) + rejections[rid]
                if self.async_scheduling and self.spec_tokens:  # vLLM's runner drafts at once
                    self.runner_drafts[rid] = self._drafts_from(rid, known + len(toks))
            sampled.append(toks)
            self.pending.setdefault(rid, []).extend(toks)
            self.outputs.setdefault(rid, []).extend(toks)
        ids = [p[0] for p in plan]
        mros = [ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                  sampled_token_ids=sampled, logprobs=None,
                                  prompt_logprobs_dict={}, pooler_output=None,
                                  kv_connector_output=o) for o in outputs]
        # vLLM's multiprocess executor combines its workers' outputs with its aggregator.
        mro = mros[0] if self.worker is not None else self.aggregator.aggregate(mros)
        self.step_rejections[id(mro)] = rejections
        return out, mro, errors

    def run(self, limit=10000):
        """Steps until vLLM holds nothing: every request finished and its blocks freed (those
        the connector held for saves in flight, once it reported them)."""
        for _ in range(limit):
            if not self.scheduler.has_requests() and not self.in_flight:
                assert self.scheduler.requests == {}
                pool = self.scheduler.kv_cache_manager.block_pool
                assert pool.get_num_free_blocks() == self.num_blocks - 1  # block 0 is vLLM's null
                return
            self.step()
        raise AssertionError("requests did not finish")

    def offered(self, rid):
        """(num_computed_tokens, external tokens) of the last offer for rid."""
        return [(n, got[0]) for r, n, got in self.matched if r == rid][-1]

    def forget_local(self):
        assert self.scheduler.reset_prefix_cache()

    def close(self):
        if self.worker is not None:
            self.worker.shutdown()
        for rank, (proc, _) in enumerate(self.procs):
            if proc.is_alive():
                self.ask(rank, "stop")
            proc.join(30)
        self.procs = []
        self.scheduler.shutdown()


@pytest.fixture
def engine(model_dir):
    made = []

    def make(**kw):
        e = Engine(model_dir, **kw)
        made.append(e)
        return e

    yield make
    for e in made:
        e.close()


def tokens_of(seed: int, n: int) -> list:
    return np.random.default_rng(seed).integers(1, 900, n).tolist()


@pytest.mark.parametrize("layout,kernel_block", [
    ("LBNHC", BLOCK), ("LBHNC", BLOCK), ("BLNHC", BLOCK), ("BLHNC", BLOCK),  # vLLM 0.33's
    ("LBNHC", BLOCK // 2), ("LBHNC", BLOCK // 4),  # vLLM's blocks split into kernel blocks
    ("vllm", BLOCK), ("nhd", BLOCK), ("hnd", BLOCK)])  # 5-dimensional tensors
def test_prefix_saved_in_one_request_is_loaded_by_a_later_one(engine, layout, kernel_block):
    """Through each KV cache layout vLLM allocates (its own allocate_kv_cache), and the
    5-dimensional ones."""
    e = engine(layout=layout, kernel_block=kernel_block)
    prompt = tokens_of(1, 300)
    e.add("a", prompt)
    e.run()
    assert e.computed["a"] == 300 + 3  # the prompt, then 3 decode steps
    # The prompt's 4 full chunks were saved; the fifth (256-320) never filled.
    kv_model = e.worker.connector_worker.store.model
    assert kv_model.lookup_named(names_of(prompt)).prefix_tokens == 256
    e.forget_local()  # vLLM's own prefix cache is empty: only the connector has the prefix
    turn2 = prompt + e.outputs["a"][:-1] + tokens_of(2, 100)
    e.add("b", turn2)
    e.run()
    n = len(turn2)
    # The 4 chunks saved by "a": offered, loaded, not computed again.
    assert e.offered("b") == (0, 256)
    assert e.computed["b"] == n - 256 + 3
    assert not any(e.errors)


def next_turn_loads(e, conversation: list, saved: int, seed: int) -> None:
    """The library holds the conversation's first `saved` tokens; with vLLM's own prefix cache
    emptied, a next turn of 30 more tokens is offered them, loads them byte for byte (the
    stand-in's check) and computes only the rest."""
    kv_model = e.worker.connector_worker.store.model
    assert kv_model.lookup_named(names_of(conversation)).prefix_tokens == saved
    e.forget_local()
    e.add("b", conversation + tokens_of(seed, 30), max_tokens=1)
    e.run()
    assert e.offered("b") == (0, saved)
    assert e.computed["b"] == len(conversation) + 30 - saved
    assert not any(e.errors)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_chunks_completed_by_decoding_are_saved(engine, async_scheduling):
    """A chunk that decoding completes is saved once its last token is known (under async
    scheduling, vLLM's default, the scheduler learns a sampled token a step after it scheduled
    that token's position), and the next turn loads it byte for byte."""
    e = engine(async_scheduling=async_scheduling)
    prompt = tokens_of(190, 300)
    e.add("a", prompt, max_tokens=40)
    e.run()
    out = list(e.requests["a"].output_token_ids)
    assert len(out) == 40
    next_turn_loads(e, prompt + out[:-1], 320, 191)  # the last sampled token has no K/V
    assert e.worker.connector_worker.store.ctx.stats()["requests_open"] == 0


@pytest.mark.parametrize("async_scheduling,eagle", [(False, False), (True, False), (False, True)])
def test_speculative_decoding_saves_only_verified_tokens(engine, tmp_path, async_scheduling,
                                                         eagle):
    """Under speculative decoding vLLM schedules the drafter's tokens after the known ones; the
    step writes their K/V whether the model accepts them or not, and vLLM rolls its count of
    computed tokens back past those it rejects, to compute them again. A chunk is saved only from
    tokens vLLM has verified, once a step wrote their K/V, so the next turn loads at each position
    the bytes of the token it holds there (a rejected draft's K/V would fail the check). Under
    async scheduling (vLLM's default with its GPU drafters) the scheduler learns of rejections a
    step late, and schedules the step between from where it assumed the drafts taken. With an
    EAGLE drafter, whose attention layer vLLM puts in the model's KV cache group and runs once per
    draft token, the connector caches the model's layers and leaves the drafter's alone."""
    drafter_dir = None
    if eagle:
        drafter_dir = str(tmp_path)
        (tmp_path / "config.json").write_text(json.dumps({
            "architectures": ["EagleLlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
            "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": HEADS,
            "head_dim": DIM, "num_hidden_layers": 1, "vocab_size": 1000,
            "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "torch_dtype": "float16",
            "tie_word_embeddings": False}))
    e = engine(spec_tokens=3, async_scheduling=async_scheduling, drafter_dir=drafter_dir)
    assert e.worker.cfg.geometry.layer_names == NAMES
    assert e.worker.cfg.drafter == ({DRAFTER} if eagle else set())
    prompt = tokens_of(192, 100)
    e.add("a", prompt, max_tokens=200)
    e.run()
    out = list(e.requests["a"].output_token_ids)
    assert len(out) == 200
    assert 0 < e.drafts["accepted"] < e.drafts["proposed"]  # drafts both taken and rejected
    assert (e.drafts["late"] > 0) == async_scheduling
    next_turn_loads(e, prompt + out[:-1], 256, 193)  # 299 tokens with verified K/V


def test_a_local_hit_inside_a_chunk_loads_the_rest_of_it(engine):
    """vLLM's own prefix cache keeps the first blocks (its eviction takes a request's last
    blocks first); the connector loads from the end of them, inside a chunk."""
    e = engine(num_blocks=48)
    prompt = tokens_of(3, 320)  # 20 blocks, 5 chunks
    e.add("a", prompt, max_tokens=1)
    e.run()
    # Another prompt evicts most of "a"'s blocks from vLLM's prefix cache, the last first.
    e.add("filler", tokens_of(4, 544), max_tokens=1)
    e.run()
    e.add("b", prompt + tokens_of(5, 40), max_tokens=1)
    e.run()
    local, external = e.offered("b")
    assert local % BLOCK == 0 and local % CHUNK != 0 and 0 < local < 320, local
    assert local + external == 320
    assert e.computed["b"] == 360 - 320
    assert not any(e.errors)


def test_a_chunk_lost_before_the_load_is_reported_and_recomputed(engine):
    e = engine()
    prompt = tokens_of(6, 256)
    e.add("a", prompt, max_tokens=1)
    e.run()
    e.forget_local()
    turn2 = prompt + tokens_of(7, 64)
    model = e.worker.connector_worker.store.model
    key = names_of(prompt)

    def drop_chunk_2(out):
        # After vLLM accepted the load of [0, 256), before the worker loads: chunk 2 goes.
        model.pin_named(key[:2])
        assert model.clear_named(key) == 2  # chunks 2 and 3
        model.unpin_named(key[:2])

    e.add("b", turn2, max_tokens=1)
    errors = e.step(before_worker=drop_chunk_2)
    assert e.offered("b") == (0, 256)
    blocks = e.scheduler.kv_cache_manager.get_block_ids("b")[0]
    assert errors == set(blocks[2 * CHUNK // BLOCK:256 // BLOCK])  # blocks 8-15
    e.run()
    # The step computed [256, 320); vLLM then went back to the first failed block and
    # computed [128, 320) again.
    assert e.computed["b"] == (320 - 256) + (320 - 2 * CHUNK)


def test_preemption_and_abort_free_what_the_connector_holds(engine):
    e = engine(num_blocks=40, budget=512)
    for i in range(4):
        e.add(f"r{i}", tokens_of(10 + i, 200), max_tokens=40)
    e.step()
    e.step()
    e.scheduler.finish_requests("r3", RequestStatus.FINISHED_ABORTED)
    e.run()
    assert e.scheduler.kv_cache_manager.block_pool.get_num_free_blocks() == 40 - 1
    assert any(r.num_preemptions > 0 for r in e.requests.values()), "nothing was preempted"
    sched = e.connector.connector_scheduler
    assert sched.scheduled == {} and sched.matched == {}
    assert e.worker.connector_worker.step is None
    assert e.worker.connector_worker.store.ctx.stats()["requests_open"] == 0


def test_many_concurrent_requests(engine):
    e = engine(num_blocks=1024, budget=256)
    shared = tokens_of(20, 128)
    prompts = {f"c{i}": shared + tokens_of(100 + i, 64 + 16 * (i % 8)) for i in range(32)}
    for rid, p in prompts.items():
        e.add(rid, p, max_tokens=2)
    e.run()
    e.forget_local()
    for rid, p in prompts.items():
        e.add(rid + "-again", p, max_tokens=2)
    e.run()
    for rid, p in prompts.items():
        local, external = e.offered(rid + "-again")
        want = min(len(p) // CHUNK * CHUNK, (len(p) - 1) // BLOCK * BLOCK)
        assert local + external == want, (rid, local, external)
    assert not any(e.errors)
    assert e.worker.connector_worker.store.ctx.stats()["requests_open"] == 0


def test_disk_tier_round_trip_and_hit_sources(engine, tmp_path):
    e = engine(extra={"disk_path": str(tmp_path), "disk_budget_bytes": 64 << 20})
    prompt = tokens_of(30, 256)
    e.add("a", prompt, max_tokens=1)
    e.run()
    model = e.worker.connector_worker.store.model
    assert model.move_named(names_of(prompt), swiftkv.Tier.DISK) == 4
    e.forget_local()
    b = e.add("b", prompt + tokens_of(31, 16), max_tokens=1)
    sources = []
    e.step(before_worker=lambda out: sources.append(
        e.connector.get_external_cache_hit_sources(b, 256)))
    assert sources == [{svc.CacheHitSource.DISK: 256}]
    e.run()
    assert e.computed["b"] == 16 + 0
    assert not any(e.errors)


def test_hooks_out_of_vllm_order_are_refused(engine):
    e = engine()
    prompt = tokens_of(40, 200)
    e.add("a", prompt, max_tokens=1)
    e.run()
    e.forget_local()
    e.add("b", prompt + tokens_of(41, 8), max_tokens=1)
    out = e.scheduler.schedule()
    w = e.worker
    w.bind_connector_metadata(out.kv_connector_metadata)
    with pytest.raises(sv.HookOrderError, match="before start_load_kv"):
        w.wait_for_layer_load(NAMES[0])
    w.start_load_kv(None)
    with pytest.raises(sv.HookOrderError, match="twice"):
        w.start_load_kv(None)
    with pytest.raises(sv.HookOrderError, match="layer 0 is next"):
        w.wait_for_layer_load(NAMES[1])
    with pytest.raises(sv.HookOrderError, match="before its wait_for_layer_load"):
        w.save_kv_layer(NAMES[0], e.tensors[NAMES[0]], None)
    w.wait_for_layer_load(NAMES[0])
    with pytest.raises(ValueError, match="other than the one registered"):
        w.save_kv_layer(NAMES[0], e.tensors[NAMES[1]], None)
    with pytest.raises(ValueError, match="not a layer"):
        w.wait_for_layer_load("model.layers.9.self_attn.attn")
    # vLLM ends the step: the requests are ended, the unfinished load reported as failed.
    w.wait_for_save()
    blocks = e.scheduler.kv_cache_manager.get_block_ids("b")[0]
    assert w.get_block_ids_with_load_errors() == set(blocks[:192 // BLOCK])
    w.clear_connector_metadata()
    assert w.connector_worker.store.ctx.stats()["requests_open"] == 0


def test_bad_configuration_is_refused_clearly(model_dir):
    with pytest.raises(ValueError, match="unknown kv_connector_extra_config keys"):
        Engine(model_dir, extra={"host_budget": 1})
    with pytest.raises(ValueError, match="multiple of vLLM's block size"):
        Engine(model_dir, extra={"chunk_tokens": 24})
    with pytest.raises(ValueError, match="disk_path needs disk_budget_bytes"):
        Engine(model_dir, extra={"disk_path": "/tmp"})
    with pytest.raises(ValueError, match="pipeline_parallel_size is 2"):
        Engine(model_dir, parallel=ParallelConfig(pipeline_parallel_size=2))
    with pytest.raises(ValueError, match="decode_context_parallel_size is 2"):
        Engine(model_dir, parallel=ParallelConfig(tensor_parallel_size=4,
                                                  decode_context_parallel_size=2))
    with pytest.raises(ValueError, match="lookup_timeout_s must be > 0"):
        Engine(model_dir, extra={"lookup_timeout_s": 0})
    # Hybrid models, as vLLM's hybrid allocator groups their layers: refused at startup by both
    # sides, naming the layer kinds found (a garbled answer is what a connector that cached
    # full-attention pages only, or a window's blocks vLLM has freed, would give).
    from vllm.v1.kv_cache_interface import MambaSpec, SlidingWindowSpec
    full = FullAttentionSpec(block_size=BLOCK, num_kv_heads=HEADS, head_size=DIM,
                             dtype=torch.float16)
    window = SlidingWindowSpec(block_size=BLOCK, num_kv_heads=HEADS, head_size=DIM,
                               dtype=torch.float16, sliding_window=128)
    mamba = MambaSpec(block_size=BLOCK, shapes=((4, 16),), dtypes=(torch.float16,))
    ok = Engine(model_dir)
    for other, kind in ((mamba, "MambaSpec"), (window, "SlidingWindowSpec")):
        groups = KVCacheConfig(num_blocks=64, kv_cache_tensors=[], kv_cache_groups=[
            KVCacheGroupSpec(NAMES[:2], full), KVCacheGroupSpec(NAMES[2:], other)])
        for role in (KVConnectorRole.SCHEDULER, KVConnectorRole.WORKER):
            with pytest.raises(ValueError, match=rf"not groups \['FullAttentionSpec', '{kind}'\]"):
                sv.SwiftKVConnector(ok.config, role, groups)
    ok.close()
    # The releases tested: 0.32 (vLLM's CPU build, whole engines) and 0.33 (here).
    for version in ("0.31.2", "0.34.0", "1.0.0", "nightly"):
        with pytest.raises(ImportError, match=f"not vLLM {version}"):
            svc.check_vllm_version(version)
    svc.check_vllm_version("0.32.0")
    svc.check_vllm_version("0.33.0")


def held_saves(monkeypatch):
    """The connector's saver thread holds each request's saves until the returned event is set
    (it is not, at first)."""
    import threading
    gate = threading.Event()
    finish = svw.SwiftKVConnectorWorker.finish_saves

    def slow(req, stream):
        assert gate.wait(30)
        finish(req, stream)

    monkeypatch.setattr(svw.SwiftKVConnectorWorker, "finish_saves", staticmethod(slow))
    return gate


def test_a_scheduler_without_its_worker_says_so(engine, model_dir):
    e = engine()
    cfg = e.config
    cfg.kv_transfer_config.engine_id = "no-worker-here"
    conn = sv.SwiftKVConnector(cfg, KVConnectorRole.SCHEDULER, e.kv_config)
    r = Request(request_id="x", prompt_token_ids=tokens_of(1, 200),
                sampling_params=SamplingParams(max_tokens=1), pooling_params=None,
                mm_features=None, block_hasher=get_request_block_hasher(BLOCK, sha256))
    with pytest.raises(RuntimeError, match="no worker of engine 'no-worker-here'"):
        conn.get_num_new_matched_tokens(r, 0)
    assert conn.reset_cache() is False  # nothing reset, and vLLM is told so


def test_a_request_without_block_hashes_is_neither_offered_nor_saved(engine):
    """The chunks are named by vLLM's block hashes (which carry the request's LoRA adapter,
    multimodal inputs, cache salt and prompt embeddings): a request vLLM gave none, here one made
    without a block hasher, cannot be keyed. Its cached prefix, saved by a request that had
    them, is not offered to it, it saves nothing, and it is counted once."""
    e = engine()
    prompt = tokens_of(90, 200)
    e.add("keyed", prompt, max_tokens=1)
    e.run()
    model = e.worker.connector_worker.store.model
    assert model.lookup_named(names_of(prompt)).prefix_tokens == 192
    e.forget_local()
    sp = SamplingParams(max_tokens=1)
    sp.update_from_generation_config({}, EOS)
    r = Request(request_id="bare", prompt_token_ids=prompt + tokens_of(91, 100),
                sampling_params=sp, pooling_params=None, mm_features=None)
    assert r.block_hashes == []
    e.requests["bare"] = r
    e.computed["bare"] = 0
    e.scheduler.add_request(r)
    stores = e.worker.connector_worker.store.ctx.stats()["stores"]
    e.run()
    assert e.offered("bare") == (0, 0)
    assert e.computed["bare"] == 300  # all of it, vLLM's own cache emptied
    assert e.connector.unkeyed_requests == 1
    assert e.worker.connector_worker.store.ctx.stats()["stores"] == stores  # nothing saved for it


def test_a_cache_reset_drops_every_chunk_after_the_saves_in_flight(engine, monkeypatch):
    """vLLM's reset of the connector's cache (reset_prefix_cache(reset_connector=True), as a
    pause that clears the caches around a weight update makes it): every chunk is dropped, those
    of saves still finishing on the connector's thread when it came included (they land first),
    and a later turn finds nothing to load."""
    import threading
    gate = held_saves(monkeypatch)
    gate.set()
    e = engine()
    model = e.worker.connector_worker.store.model
    first, second = tokens_of(75, 128), tokens_of(76, 128)
    e.add("a", first, max_tokens=1)
    e.run()
    assert model.lookup_named(names_of(first)).prefix_tokens == 128
    gate.clear()
    e.add("c", second, max_tokens=1)
    for _ in range(4):  # two prefill steps, then steps waiting for the saves
        e.step()
    pending = list(e.worker.connector_worker.saving["c"])
    assert pending and not any(f.done() for f in pending)
    result = {}
    reset = threading.Thread(target=lambda: result.setdefault(
        "ok", e.scheduler.reset_prefix_cache(reset_connector=True)))
    reset.start()
    reset.join(0.5)
    assert reset.is_alive()  # waiting for "c"'s saves
    gate.set()
    reset.join(30)
    # vLLM's own reset failed ("c"'s blocks are held for its saves), the connector's did not.
    assert result == {"ok": False}
    assert all(f.done() for f in pending)
    for tokens in (first, second):
        assert model.lookup_named(names_of(tokens)).prefix_tokens == 0
    assert e.worker.connector_worker.store.ctx.stats()["chunks"][int(swiftkv.Tier.HOST)] == 0
    e.run()  # "c" reported, its blocks freed
    assert e.scheduler.reset_prefix_cache(reset_connector=True)
    e.add("b", first + tokens_of(77, 16), max_tokens=1)
    e.run()
    assert e.offered("b") == (0, 0)
    assert e.computed["b"] == 128 + 16


class Lender:
    """examples/two_models/lender.py: another process lending its idle KV memory."""

    def __init__(self, endpoint: str):
        import subprocess
        import sys
        here = os.path.dirname(os.path.abspath(__file__))
        desc = dict(name="vllm-borrower", num_layers=LAYERS, num_kv_heads=HEADS, head_dim=DIM,
                    block_tokens=BLOCK, chunk_tokens=CHUNK, dtype=int(swiftkv.DType.F16))
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(here, "..", "..", "examples", "two_models",
                                          "lender.py"), endpoint, json.dumps(desc)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.ready = self.answer()
        assert self.ready["event"] == "ready", self.ready

    def answer(self) -> dict:
        line = self.proc.stdout.readline()
        assert line, "the lender exited"
        return json.loads(line)

    def ask(self, cmd: str) -> dict:
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        return self.answer()

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.flush()
            self.proc.wait(timeout=30)


def test_borrowed_memory_serves_prefixes_and_is_given_back(engine, tmp_path):
    """A vLLM engine borrows another process's idle KV memory (the peer tier): prefixes go
    there first and load from there; when the lender asks for it back, they move to host
    memory and still load, byte for byte."""
    endpoint = f"ipc://{tmp_path}/lender"
    lender = Lender(endpoint)
    try:
        # 8 units: room for 8 chunks, twice the prompt's, so that keeping some of the tier free
        # (the library's demote_free_percent) moves nothing out of it.
        e = engine(extra={"lenders": [{"endpoint": endpoint, "name": "worker", "units": 8}]})
        assert len(e.worker.connector_worker.store.borrower.leases) == 1
        capacity = e.worker.connector_worker.store.ctx.stats()["capacity_bytes"][swiftkv.Tier.PEER]
        assert capacity == 8 * e.worker.connector_worker.store.desc.chunk_bytes
        prompt = tokens_of(50, 256)
        e.add("a", prompt, max_tokens=1)
        e.run()
        key = names_of(prompt)
        kv_model = e.worker.connector_worker.store.model
        # Peer first: the first chunk's slot is always there. A chunk saved while the open
        # requests hold half of the peer tier already (the library's share for them; saves end
        # off the step, so a slow saver holds slots longer) goes to host memory instead.
        residency = kv_model.lookup_named(key).residency.tolist()
        assert residency[0] == int(swiftkv.Tier.PEER), residency
        assert set(residency) <= {int(swiftkv.Tier.PEER), int(swiftkv.Tier.HOST)}, residency
        peer = residency.count(int(swiftkv.Tier.PEER)) * CHUNK
        e.forget_local()
        b = e.add("b", prompt + tokens_of(51, 16), max_tokens=1)
        sources = []
        e.step(before_worker=lambda out: sources.append(
            e.connector.get_external_cache_hit_sources(b, 256)))
        want = {svc.CacheHitSource.P2P: peer}
        if peer < 256:
            want[svc.CacheHitSource.HOST] = 256 - peer
        assert sources == [want]
        e.run()
        assert e.computed["b"] == 16
        # The lender gets a request of its own as large as its whole region: every lent block
        # goes back.
        capacity = lender.ready["capacity_blocks"]
        load = lender.ask(f"load {capacity * BLOCK}")
        assert load["borrower_chunks"] > 0, load
        assert lender.ask("settle")["reclaiming_blocks"] == 0
        residency = set(kv_model.lookup_named(key).residency.tolist())
        assert residency == {int(swiftkv.Tier.HOST)}, (load, residency)
        e.forget_local()
        e.add("c", prompt + tokens_of(52, 16), max_tokens=1)
        e.run()
        assert e.offered("c") == (0, 256)
        assert e.computed["c"] == 16
        assert not any(e.errors)
    finally:
        lender.close()


def test_an_unreachable_lender_leaves_the_engine_serving(engine, tmp_path):
    e = engine(extra={"lenders": [{"endpoint": f"ipc://{tmp_path}/nobody", "name": "worker",
                                   "units": 4}]})
    assert e.worker.connector_worker.store.borrower.leases == []
    e.add("a", tokens_of(60, 100), max_tokens=1)
    e.run()
    with pytest.raises(ValueError, match="each lender is"):
        Engine(e.config.model_config.model, extra={"lenders": [{"endpoint": "x"}]})


def test_saves_in_flight_hold_their_blocks(engine, monkeypatch):
    """Saves end on the connector's own thread: a step does not wait for them, a finished
    request keeps its blocks until they are done, and a preempted one's are waited for before
    vLLM reuses its blocks."""
    import threading
    gate = held_saves(monkeypatch)
    e = engine()
    e.add("a", tokens_of(70, 128), max_tokens=1)
    for _ in range(4):  # 64 tokens a step: two prefill steps, then steps waiting for the saves
        e.step()
    assert not e.scheduler.has_unfinished_requests()
    assert "a" in e.scheduler.requests  # finished, its blocks held for the saves
    held = e.scheduler.kv_cache_manager.block_pool.get_num_free_blocks()
    assert held < e.num_blocks - 1
    gate.set()
    e.run()  # the next step reports "a" and vLLM frees its blocks
    store = e.worker.connector_worker.store
    assert store.model.lookup_named(names_of(tokens_of(70, 128))).prefix_tokens == 128

    # A preempted request: handle_preemptions returns only once its saves are done.
    gate.clear()
    e.add("b", tokens_of(71, 64), max_tokens=8)
    e.step()
    pending = list(e.worker.connector_worker.saving["b"])
    assert pending and not any(f.done() for f in pending)
    threading.Timer(0.2, gate.set).start()
    e.worker.handle_preemptions(sv.SwiftKVConnectorMetadata(preempted={"b"}))
    assert all(f.done() for f in pending) and "b" not in e.worker.connector_worker.saving
    e.run()


def test_a_corrupt_disk_chunk_is_reported_and_recomputed(engine, tmp_path):
    """A chunk whose disk record fails its checksum ends the load there: the blocks from it to
    the end of the load are reported, vLLM recomputes them, and the blocks before stay."""
    e = engine(extra={"disk_path": str(tmp_path), "disk_budget_bytes": 64 << 20})
    prompt = tokens_of(80, 256)
    e.add("a", prompt, max_tokens=1)
    e.run()
    kv_model = e.worker.connector_worker.store.model
    key = names_of(prompt)
    assert kv_model.move_named(key, swiftkv.Tier.DISK) == 4
    # docs/disk-format.md: a 128-byte segment header, then per chunk a 128-byte record header
    # and the payload rounded up to 64 bytes, in the order they were written (chunks 0-3).
    segments = [p for p in os.listdir(tmp_path) if p.endswith(".kvlog")]
    assert len(segments) == 1
    record = 128 + (e.worker.connector_worker.store.desc.chunk_bytes + 63) // 64 * 64
    with open(tmp_path / segments[0], "r+b") as f:
        f.seek(128 + record + 128 + 1000)  # inside chunk 1's payload
        byte = f.read(1)[0]
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte ^ 0x10]))
    e.forget_local()
    e.add("b", prompt + tokens_of(81, 64), max_tokens=1)
    errors = e.step()
    assert e.offered("b") == (0, 256)
    blocks = e.scheduler.kv_cache_manager.get_block_ids("b")[0]
    assert errors == set(blocks[CHUNK // BLOCK:256 // BLOCK])
    e.run()
    assert e.computed["b"] == 64 + (320 - CHUNK)
    assert e.worker.connector_worker.store.ctx.stats()["load_failures"] >= 1


def test_lent_memory_lost_before_the_load_is_reported(engine, tmp_path):
    """The lender dies after vLLM accepted a load from its memory: the lost chunks are not
    loaded, their blocks are reported, and vLLM recomputes them."""
    endpoint = f"ipc://{tmp_path}/lender"
    lender = Lender(endpoint)
    try:
        e = engine(extra={"lenders": [{"endpoint": endpoint, "name": "worker", "units": 8}]})
        prompt = tokens_of(90, 256)
        e.add("a", prompt, max_tokens=1)
        e.run()
        e.forget_local()
        ctx = e.worker.connector_worker.store.ctx

        def kill_lender(out):
            lender.proc.kill()
            lender.proc.wait(timeout=30)
            for _ in range(3000):
                if ctx.coord_stats()["leases_lost"] > 0:
                    return
                time.sleep(0.01)
            raise AssertionError("the lease was not lost")

        e.add("b", prompt + tokens_of(91, 16), max_tokens=1)
        errors = e.step(before_worker=kill_lender)
        assert e.offered("b") == (0, 256)
        blocks = e.scheduler.kv_cache_manager.get_block_ids("b")[0]
        assert errors == set(blocks[:256 // BLOCK])
        e.run()
        assert e.computed["b"] == 16 + 272
    finally:
        lender.close()


def test_the_hook_benchmark_runs():
    """bench/bench_vllm_connector.py, one step: it runs and its JSON line is whole."""
    import subprocess
    import sys
    here = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run([sys.executable, os.path.join(here, "..", "..", "bench",
                                                       "bench_vllm_connector.py"), "--reps", "1"],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    line = json.loads(out.strip().splitlines()[-1])
    assert line["bench"] == "vllm_connector" and line["vllm"].startswith("vLLM 0.33")
    assert set(line["results"]) == {"connector, 64 saving", "library batch calls, 64 saving",
                                    "connector, nothing to do", "lookup, in process",
                                    "lookup, 1 worker process", "lookup, 2 worker processes"}


def test_a_producer_saves_and_a_consumer_loads(engine, tmp_path):
    """kv_role: an engine that only produces saves and never loads; one that only consumes
    loads (here what the producer left on a shared disk path) and saves nothing."""
    disk = {"disk_path": str(tmp_path), "disk_budget_bytes": 64 << 20}
    p = engine(kv_role="kv_producer", extra=disk)
    prompt = tokens_of(100, 256)
    p.add("a", prompt, max_tokens=1)
    p.run()
    p.forget_local()
    p.add("a2", prompt + tokens_of(101, 16), max_tokens=1)
    p.run()
    assert p.offered("a2") == (0, 0)  # a producer does not load
    assert p.computed["a2"] == 272
    p.close()  # its chunks go down to the disk, where the next context finds them

    c = engine(kv_role="kv_consumer", extra=disk)
    turn = prompt + tokens_of(102, 128)
    c.add("b", turn, max_tokens=1)
    c.run()
    assert c.offered("b") == (0, 256)
    assert c.computed["b"] == 128
    kv_model = c.worker.connector_worker.store.model
    assert kv_model.lookup_named(names_of(turn)).prefix_tokens == 256  # none saved
    assert not any(c.errors)


def test_requests_the_library_cannot_open_are_recomputed(engine):
    """With room for one open request, a step of several loads opens the first and reports the
    others' blocks: vLLM recomputes them, and nothing stays open."""
    e = engine(extra={"max_open_requests": 1}, budget=1024)
    prompts = [tokens_of(110 + i, 128) for i in range(3)]
    for i, p in enumerate(prompts):  # one at a time: each step has room for its save
        e.add(f"a{i}", p, max_tokens=1)
        e.run()
    e.forget_local()
    for i, p in enumerate(prompts):
        e.add(f"b{i}", p + tokens_of(120 + i, 16), max_tokens=1)
    errors = e.step()
    loaded = [i for i in range(3) if e.offered(f"b{i}") == (0, 128)]
    assert len(loaded) == 3
    blocks = [set(e.scheduler.kv_cache_manager.get_block_ids(f"b{i}")[0][:128 // BLOCK])
              for i in range(3)]
    assert errors == blocks[1] | blocks[2]  # the first opened; the two others reported
    e.run()
    assert e.computed["b0"] == 16 and e.computed["b1"] == e.computed["b2"] == 16 + 144
    assert e.worker.connector_worker.store.ctx.stats()["requests_open"] == 0


# ---- tensor parallelism: workers in processes of their own -----------------------------------

@pytest.mark.parametrize("async_scheduling", [False, True])
def test_tensor_parallel_workers_each_keep_their_shard(engine, tmp_path, async_scheduling):
    """vLLM's multiprocess executor with two workers, each holding one of the two KV heads:
    each saves and loads its shard in a library context of its own (its own disk directory,
    half of each budget), the scheduler finds the prefix through both, and every loaded byte of
    both shards is checked."""
    import stat
    sockets = tmp_path / "sockets"
    budget = 64 << 20
    e = engine(workers=2, extra={"disk_path": str(tmp_path / "disk"), "disk_budget_bytes": budget,
                                 "socket_dir": str(sockets)}, async_scheduling=async_scheduling)
    assert not e.connector.cfg.in_process
    assert sorted(os.listdir(tmp_path / "disk")) == ["tp0of2", "tp1of2"]
    assert stat.S_IMODE(os.stat(sockets).st_mode) == 0o700
    assert sorted(os.path.dirname(p) for p in e.sockets) == [str(sockets)] * 2
    # Half of each budget each: as a context given half of them has.
    (tmp_path / "half").mkdir()
    half = swiftkv.Context(host_budget_bytes=(64 << 20) // 2, disk_path=str(tmp_path / "half"),
                           disk_budget_bytes=budget // 2)
    want = list(half.stats()["capacity_bytes"])
    half.close()
    assert [e.ask(rank, "stats")["capacity_bytes"] for rank in range(2)] == [want, want]
    prompt = tokens_of(130, 300)
    e.add("a", prompt)
    e.run()
    assert [e.ask(rank, "prefix", prompt) for rank in range(2)] == [256, 256]
    e.forget_local()
    turn2 = prompt + list(e.requests["a"].output_token_ids)[:-1] + tokens_of(131, 100)
    e.add("b", turn2)
    e.run()
    assert e.offered("b") == (0, 256)
    assert e.computed["b"] == len(turn2) - 256 + 3
    assert not any(e.errors)
    assert [e.ask(rank, "stats")["requests_open"] for rank in range(2)] == [0, 0]


def test_a_chunk_one_worker_lacks_is_not_offered(engine):
    e = engine(workers=2)
    prompt = tokens_of(140, 256)
    e.add("a", prompt, max_tokens=1)
    e.run()
    assert e.ask(1, "clear", (prompt, 2 * CHUNK)) == 2  # worker 1 loses chunks 2 and 3
    assert e.ask(0, "prefix", prompt) == 256
    e.forget_local()
    e.add("b", prompt + tokens_of(141, 16), max_tokens=1)
    e.run()
    assert e.offered("b") == (0, 2 * CHUNK)
    assert e.computed["b"] == 16 + 2 * CHUNK
    assert not any(e.errors)
    assert [e.ask(rank, "prefix", prompt) for rank in range(2)] == [256, 256]  # saved again


def test_a_chunk_one_worker_loses_after_the_offer_is_recomputed(engine):
    """Worker 0 loses chunks after vLLM accepted the load: it reports their blocks, worker 1
    loads them, and vLLM recomputes them on both."""
    e = engine(workers=2)
    prompt = tokens_of(150, 256)
    e.add("a", prompt, max_tokens=1)
    e.run()
    e.forget_local()
    e.add("b", prompt + tokens_of(151, 64), max_tokens=1)
    errors = e.step(before_worker=lambda out: e.ask(0, "clear", (prompt, 2 * CHUNK)))
    assert e.offered("b") == (0, 256)
    blocks = e.scheduler.kv_cache_manager.get_block_ids("b")[0]
    assert errors == set(blocks[2 * CHUNK // BLOCK:256 // BLOCK])
    e.run()
    assert e.computed["b"] == (320 - 256) + (320 - 2 * CHUNK)


def test_a_cache_reset_reaches_every_worker(engine):
    """With the workers in processes of their own, the scheduler's reset goes to each over its
    lookup socket; a worker that died makes the reset fail, and vLLM is told so."""
    e = engine(workers=2)
    prompt = tokens_of(180, 256)
    e.add("a", prompt, max_tokens=1)
    e.run()
    assert [e.ask(rank, "prefix", prompt) for rank in range(2)] == [256, 256]
    assert e.scheduler.reset_prefix_cache(reset_connector=True)
    assert [e.ask(rank, "prefix", prompt) for rank in range(2)] == [0, 0]
    e.add("b", prompt + tokens_of(181, 16), max_tokens=1)
    e.run()
    assert e.offered("b") == (0, 0)
    assert [e.ask(rank, "prefix", prompt) for rank in range(2)] == [256, 256]  # saved again
    proc = e.procs[1][0]
    proc.kill()
    proc.join(30)
    assert e.scheduler.reset_prefix_cache(reset_connector=True) is False
    assert e.ask(0, "prefix", prompt) == 0  # the worker that could be reached was reset


def test_a_dead_worker_fails_the_lookup_clearly(engine):
    e = engine(workers=2, extra={"lookup_timeout_s": 5})
    e.add("a", tokens_of(160, 128), max_tokens=1)
    e.run()
    proc = e.procs[1][0]
    proc.kill()
    proc.join(30)
    e.forget_local()
    e.add("b", tokens_of(160, 128) + tokens_of(161, 16), max_tokens=1)
    with pytest.raises(RuntimeError, match="lookup failed: worker 1"):
        e.scheduler.schedule()


class _Shard:
    """A library context and model of the test's geometry, holding chosen chunks."""

    def __init__(self, tokens, chunks, disk=None):
        config = {"host_budget_bytes": 16 << 20}
        if disk is not None:
            os.makedirs(disk)
            config.update(disk_path=str(disk), disk_budget_bytes=16 << 20)
        self.ctx = swiftkv.Context(**config)
        self.model = self.ctx.register_model(swiftkv.ModelDesc(
            name="lookups", num_layers=LAYERS, num_kv_heads=HEADS, head_dim=DIM,
            block_tokens=BLOCK, chunk_tokens=CHUNK, dtype=swiftkv.DType.F16))
        kv = np.zeros(chunks * self.model.desc.chunk_bytes, dtype=np.uint8)
        assert self.model.store_named(names_of(tokens[:chunks * CHUNK]), kv) == chunks


def test_the_lookup_socket(tmp_path):
    """The workers' lookup service on its own: answers combined across workers (a chunk is held
    where every worker holds it, from the farthest tier), its directory's permissions checked,
    a stale socket replaced, a live one refused, a malformed request dropped without harm."""
    import socket
    import stat
    tokens = tokens_of(170, 3 * CHUNK)
    opts = dict(sv.OPTIONS, socket_dir=str(tmp_path / "s"))
    paths = [svl.socket_path(opts, "engine", rank) for rank in range(2)]
    assert stat.S_IMODE(os.stat(tmp_path / "s").st_mode) == 0o700
    os.chmod(tmp_path / "s", 0o755)
    with pytest.raises(ValueError, match="mode 0700"):
        svl.socket_path(opts, "engine", 0)
    os.chmod(tmp_path / "s", 0o700)
    # A socket file left by a worker that died: replaced.
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(paths[1])
    stale.close()
    a = _Shard(tokens, 2)
    b = _Shard(tokens, 3, disk=tmp_path / "disk")
    assert b.model.move_named(names_of(tokens[:CHUNK]), swiftkv.Tier.DISK) == 1
    servers = [svl.LookupServer(a.model, paths[0]), svl.LookupServer(b.model, paths[1])]
    try:
        with pytest.raises(RuntimeError, match="served by a live engine"):
            svl.LookupServer(a.model, paths[0])
        garbage = socket.socket(socket.AF_UNIX)
        garbage.connect(paths[0])
        garbage.sendall(b"GARBAGE!GARB")  # a header's length, not one
        assert garbage.recv(16) == b""  # dropped
        garbage.close()
        # A lookup of more names than the engine's longest sequence has chunks, or of names
        # longer than the library takes: dropped before a byte of its body is read.
        for names, size in ((1 << 20, 32), (1, 65), (1, 0)):
            big = socket.socket(socket.AF_UNIX)
            big.connect(paths[0])
            big.sendall(svl.HEAD.pack(b"SKVQ", svl.PROTOCOL, size, names))
            assert big.recv(16) == b""
            big.close()
        client = svl.LookupClient(paths, 5.0)
        got = client.lookup(names_of(tokens)).tolist()
        T = swiftkv.Tier
        assert got == [int(T.DISK), int(T.HOST), int(T.DROPPED)]
        assert client.lookup(names_of(tokens[:CHUNK - 1])).tolist() == []
        servers[1].close()
        assert not os.path.exists(paths[1])
        with pytest.raises(RuntimeError, match="lookup failed: worker 1"):
            client.lookup(names_of(tokens))
        with pytest.raises(RuntimeError, match="worker 1 does not answer lookups"):
            svl.LookupClient(paths, 0.2).lookup(names_of(tokens))
    finally:
        for s in servers:
            s.close()
        a.ctx.close()
        b.ctx.close()


def _closed_soon(sock, within_s: float = 10.0) -> bool:
    """Whether the worker closes sock within within_s (a bound on waiting, not a measure)."""
    sock.settimeout(within_s)
    try:
        return sock.recv(16) == b""
    except OSError:
        return False


def test_the_lookup_socket_bounds_what_a_client_can_take(tmp_path):
    """Connections to a worker's lookup socket cannot take its memory or its threads: a header
    announcing a large body allocates nothing before the body comes (8 such connections, as in
    the attack that grew a worker by 1.3-2 GiB, take no memory of the worker), a connection that
    stops mid-message is closed, connections past the bound are closed as they come, and
    connections that stay idle are closed, after which the scheduler's client connects again
    by itself and gets its answers."""
    import socket
    import tracemalloc
    tokens = tokens_of(174, 2 * CHUNK)
    opts = dict(sv.OPTIONS, socket_dir=str(tmp_path / "s"))
    path = svl.socket_path(opts, "engine", 0)
    a = _Shard(tokens, 2)
    server = svl.LookupServer(a.model, path, max_names=1 << 16, max_conns=12, idle_s=1.0,
                              message_s=0.5)
    conns = []
    try:
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        for _ in range(8):  # each announces (1 << 16) - 1 names of 64 bytes: 4 MiB
            c = socket.socket(socket.AF_UNIX)
            c.connect(path)
            c.sendall(svl.HEAD.pack(b"SKVQ", svl.PROTOCOL, 64, (1 << 16) - 1) + b"x" * 64)
            conns.append(c)
        client = svl.LookupClient([path], 5.0)
        host = int(swiftkv.Tier.HOST)
        assert client.lookup(names_of(tokens)).tolist() == [host] * 2  # served meanwhile
        grown = tracemalloc.get_traced_memory()[0] - base
        tracemalloc.stop()
        assert grown < 1 << 20, f"the worker took {grown} bytes for 8 announced bodies"
        # Each stops mid-message: closed.
        assert all(_closed_soon(c) for c in conns)
        for c in conns:
            c.close()
        conns.clear()
        # The bound: 11 idle connections and the client's make 12; the 13th is closed at once.
        for _ in range(11):
            c = socket.socket(socket.AF_UNIX)
            c.connect(path)
            conns.append(c)
        assert client.lookup(names_of(tokens)).tolist() == [host] * 2
        extra = socket.socket(socket.AF_UNIX)
        extra.connect(path)
        assert _closed_soon(extra, 5.0)
        extra.close()
        # Idle ones go (the client's too), and the client connects again at its next lookup.
        assert all(_closed_soon(c) for c in conns)
        for _ in range(1000):
            if svl.closed_by_peer(client._socks[0]):
                break
            time.sleep(0.01)
        assert svl.closed_by_peer(client._socks[0])
        assert client.lookup(names_of(tokens)).tolist() == [host] * 2
        client.close()
    finally:
        for c in conns:
            c.close()
        server.close()
        a.ctx.close()


def test_a_failed_lookup_leaves_the_connections_in_step(tmp_path):
    """Worker 0's lookup fails: the error names it, and worker 1's answer to that lookup is read
    all the same, so the next lookup gets the answers to itself."""

    class FailsOnce:
        def __init__(self, model):
            self.model, self.failed = model, False

        def lookup_named(self, names):
            if not self.failed:
                self.failed = True
                raise swiftkv.Error(swiftkv.Status.ESTATE, "failing once for the test")
            return self.model.lookup_named(names)

    tokens = tokens_of(172, 3 * CHUNK)
    opts = dict(sv.OPTIONS, socket_dir=str(tmp_path / "s"))
    paths = [svl.socket_path(opts, "engine", rank) for rank in range(2)]
    a, b = _Shard(tokens, 3), _Shard(tokens, 3)
    servers = [svl.LookupServer(FailsOnce(a.model), paths[0]), svl.LookupServer(b.model, paths[1])]
    try:
        client = svl.LookupClient(paths, 5.0)
        with pytest.raises(RuntimeError, match="worker 0's lookup failed: .*failing once"):
            client.lookup(names_of(tokens))
        host = int(swiftkv.Tier.HOST)
        assert client.lookup(names_of(tokens[:CHUNK])).tolist() == [host]
        assert client.lookup(names_of(tokens)).tolist() == [host] * 3
    finally:
        for s in servers:
            s.close()
        a.ctx.close()
        b.ctx.close()


def test_the_reset_message(tmp_path):
    """A reset over the lookup socket: each worker's reset runs and says how many chunks it
    dropped; a failed one comes back as the library's message; a server that takes no resets
    drops the connection, and the client says the reset failed."""
    tokens = tokens_of(171, 3 * CHUNK)
    opts = dict(sv.OPTIONS, socket_dir=str(tmp_path / "s"))
    paths = [svl.socket_path(opts, "engine", rank) for rank in range(2)]
    a, b = _Shard(tokens, 2), _Shard(tokens, 3)

    def refuse():
        raise swiftkv.Error(swiftkv.Status.ESTATE, "refused for the test")

    servers = [svl.LookupServer(a.model, paths[0], lambda: a.model.clear()),
               svl.LookupServer(b.model, paths[1], lambda: b.model.clear())]
    try:
        client = svl.LookupClient(paths, 5.0)
        key = names_of(tokens)
        assert client.reset() == 5
        assert client.lookup(key).tolist() == [int(swiftkv.Tier.DROPPED)] * 3
        assert client.reset() == 0
        servers[1].close()
        with pytest.raises(RuntimeError, match="cache reset failed: worker 1"):
            client.reset()  # its connection went with the server
        servers[1] = svl.LookupServer(b.model, paths[1], refuse)
        with pytest.raises(RuntimeError, match="worker 1's cache reset failed: .*refused"):
            client.reset()  # connected again
        servers[1].close()
        servers[1] = svl.LookupServer(b.model, paths[1])  # no resets
        with pytest.raises(RuntimeError, match="cache reset failed"):
            svl.LookupClient(paths, 5.0).reset()
    finally:
        for s in servers:
            s.close()
        a.ctx.close()
        b.ctx.close()


def test_a_reset_finishes_on_the_workers_it_reaches(tmp_path):
    """Worker 1 is gone (its connection closed, so the reset cannot even be sent to it) while
    worker 0 takes a while over its reset: the reset fails naming worker 1, and returns only once
    worker 0's reset is done, so nothing worker 0 held is offered after it."""
    tokens = tokens_of(173, 2 * CHUNK)
    opts = dict(sv.OPTIONS, socket_dir=str(tmp_path / "s"))
    paths = [svl.socket_path(opts, "engine", rank) for rank in range(2)]
    a, b = _Shard(tokens, 2), _Shard(tokens, 2)
    done = []

    def slow_reset():
        time.sleep(0.3)
        dropped = a.model.clear()
        done.append(dropped)
        return dropped

    servers = [svl.LookupServer(a.model, paths[0], slow_reset),
               svl.LookupServer(b.model, paths[1], lambda: b.model.clear())]
    try:
        client = svl.LookupClient(paths, 5.0)
        key = names_of(tokens)
        assert client.lookup(key).tolist() == [int(swiftkv.Tier.HOST)] * 2  # both connected
        servers[1].close()
        with pytest.raises(RuntimeError, match="cache reset failed: worker 1"):
            client.reset()
        assert done == [2]  # worker 0's reset had finished
    finally:
        for s in servers:
            s.close()
        a.ctx.close()
        b.ctx.close()


def test_a_data_parallel_engine_keeps_its_own_disk_directory(engine, tmp_path):
    """Data parallel engines run their workers under the multiprocess executor, one engine per
    rank: each keeps its cache in a disk directory of its own under disk_path."""
    e = engine(parallel=ParallelConfig(data_parallel_size=2, data_parallel_rank=1),
               extra={"disk_path": str(tmp_path), "disk_budget_bytes": 64 << 20,
                      "socket_dir": str(tmp_path / "sockets")},
               engine_id="dp-engine_dp1")
    assert not e.connector.cfg.in_process  # the lookups go through the worker's socket
    assert os.path.exists(tmp_path / "dp1" / ".swiftkv.lock")
    prompt = tokens_of(180, 256)
    e.add("a", prompt, max_tokens=1)
    e.run()
    e.forget_local()
    e.add("b", prompt + tokens_of(181, 16), max_tokens=1)
    e.run()
    assert e.offered("b") == (0, 256)
    assert e.computed["b"] == 16
    assert not any(e.errors)


def test_multimodal_inputs_key_their_chunks(engine):
    """Requests whose tokens are the same image placeholders but whose images differ (vLLM's
    multimodal features, as its processor makes them: an identifier per item and where its
    placeholder tokens are) share only the chunk before the image; the same image shares every
    chunk. The scheduler side's offer, from chunks saved by the first request's names (vLLM's
    block hashes, which carry each image's identifier and offset in every block it covers)."""
    from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
    e = engine()
    tokens = tokens_of(95, 64) + [5] * 128 + tokens_of(96, 108)  # an image at [64, 192)

    def request(rid, image):
        feature = MultiModalFeatureSpec(data=None, modality="image", identifier=image,
                                        mm_position=PlaceholderRange(offset=64, length=128))
        return Request(request_id=rid, prompt_token_ids=tokens,
                       sampling_params=SamplingParams(max_tokens=1), pooling_params=None,
                       mm_features=[feature], block_hasher=get_request_block_hasher(BLOCK, sha256))

    first = request("cat", "image-of-a-cat")
    names = svc.chunk_names(first.block_hashes, CHUNK // BLOCK, len(tokens) // CHUNK)
    model = e.worker.connector_worker.store.model
    kv = np.zeros(len(names) * model.desc.chunk_bytes, np.uint8)
    assert model.store_named(names, kv) == 4
    # The tokens alone (no image) name the first chunk the same, none after it.
    plain = names_of(tokens)
    assert (plain[0] == names[0]).all()
    assert all((plain[i] != names[i]).any() for i in range(1, 4))
    assert e.connector.get_num_new_matched_tokens(request("dog", "image-of-a-dog"), 0) == (64, False)
    assert e.connector.get_num_new_matched_tokens(request("cat2", "image-of-a-cat"), 0) == (256, False)
