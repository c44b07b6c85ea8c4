"""The connector's KV events inside a real vLLM engine on the CPU, as KV-aware routers read them:
a subscriber on vLLM's own event socket (its ZMQ publisher, `kv_events_config`) sees a
BlockStored with medium CPU for every block of every chunk the library stored in host memory,
a BlockRemoved for every block of each chunk it evicted, and BlockRemoved for all of them when
the connector's cache is reset. Blocks are named by vLLM's own block hashes, as vLLM's events
of its GPU prefix cache name them."""

from __future__ import annotations

import os
import socket
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine core in this process
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache

import msgspec  # noqa: E402
import pytest  # noqa: E402
import recording  # noqa: E402
import zmq  # noqa: E402
from vllm import LLM, SamplingParams  # noqa: E402
from vllm.config import KVEventsConfig, KVTransferConfig  # noqa: E402
from vllm.distributed.kv_events import BlockRemoved, BlockStored, KVEventBatch  # noqa: E402
from vllm.inputs import TokensPrompt  # noqa: E402

LAYERS, BLOCK, CHUNK = 4, 32, 64
CHUNK_BYTES = LAYERS * 2 * CHUNK * 2 * 64 * 2  # bfloat16, 2 KV heads of 64


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    d = tmp_path_factory.mktemp("model")
    recording.write_llama(d)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # Host memory for 12 chunks (half of it for the saves of open requests: a prompt's 4).
    config = KVTransferConfig(
        kv_connector="RecordingConnector", kv_connector_module_path="recording",
        kv_role="kv_both", kv_load_failure_policy="recompute",
        kv_connector_extra_config={"host_budget_bytes": 12 * CHUNK_BYTES, "chunk_tokens": CHUNK})
    events = KVEventsConfig(enable_kv_cache_events=True, publisher="zmq",
                            endpoint=f"tcp://*:{port}", topic="kv")  # it binds
    llm = LLM(model=str(d), load_format="dummy", skip_tokenizer_init=True, dtype="bfloat16",
              max_model_len=2048, enforce_eager=True, block_size=BLOCK, seed=0, max_num_seqs=8,
              kv_transfer_config=config, kv_events_config=events, enable_prefix_caching=True)
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.connect(f"tcp://127.0.0.1:{port}")
    sub.setsockopt(zmq.SUBSCRIBE, b"kv")
    time.sleep(0.5)  # the subscription reaches the publisher
    yield llm, sub
    sub.close()
    del llm


def step(llm, prompt, n=1):
    sp = SamplingParams(max_tokens=n, temperature=0, detokenize=False)
    llm.generate([TokensPrompt(prompt_token_ids=prompt)], sp, use_tqdm=False)


def settle(llm):
    """A few steps: a request's saves end on the connector's thread, the next step takes their
    events, the one after publishes them."""
    for i in range(3):
        step(llm, [7, 8, 9 + i])
    time.sleep(0.2)


def library_events(sub):
    """(kind, block hashes) of every event published so far with the library's media."""
    decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
    out = []
    while sub.poll(500):
        _, _, payload = sub.recv_multipart()
        for e in decoder.decode(payload).events:
            if isinstance(e, (BlockStored, BlockRemoved)) and e.medium in ("CPU", "STORAGE"):
                out.append((type(e).__name__, e.medium, list(e.block_hashes)))
    return out


def block_hashes(tokens):
    """vLLM's block hashes of tokens' full blocks, as its events carry them."""
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, maybe_convert_block_hash
    from vllm.v1.request import Request
    r = Request(request_id="hashes", prompt_token_ids=list(tokens),
                sampling_params=SamplingParams(max_tokens=1), pooling_params=None,
                block_hasher=get_request_block_hasher(BLOCK, sha256))
    return [maybe_convert_block_hash(h) for h in r.block_hashes]


def test_stores_evictions_and_resets_are_published(engine):
    llm, sub = engine
    prompts = [[(13 * i + 101 * p) % 997 + 1 for i in range(299)] for p in range(4)]
    settle(llm)
    library_events(sub)  # whatever came before
    step(llm, prompts[0])
    settle(llm)
    got = library_events(sub)
    first = block_hashes(prompts[0])[:8]  # 4 whole chunks of 2 blocks
    assert [k for k, _, _ in got] == ["BlockStored"] * 4, got
    assert [h for _, _, hs in got for h in hs] == first
    assert {m for _, m, _ in got} == {"CPU"}

    # Three more prompts of 4 chunks into host memory for 12: 4 chunks evicted, the first
    # prompt's (the oldest and idle longest), each block of them removed once.
    for p in prompts[1:]:
        step(llm, p)
        settle(llm)
    got = library_events(sub)
    stored = [h for k, _, hs in got if k == "BlockStored" for h in hs]
    removed = [h for k, _, hs in got if k == "BlockRemoved" for h in hs]
    assert sorted(stored) == sorted(h for p in prompts[1:] for h in block_hashes(p)[:8])
    assert sorted(removed) == sorted(first), got

    # A reset of the connector's cache: every block still stored is removed.
    assert llm.reset_prefix_cache(reset_connector=True)
    settle(llm)
    removed = [h for k, _, hs in library_events(sub) if k == "BlockRemoved" for h in hs]
    assert sorted(removed) == sorted(stored)
