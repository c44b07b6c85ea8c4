"""KV events of the library's chunks for vLLM's event publisher (BlockStored and BlockRemoved,
which KV-aware routers read): what a worker publishes, and how the scheduler keeps what every
worker reported."""

from __future__ import annotations

import collections
import threading

from vllm.distributed.kv_events import KVConnectorKVEvents

import swiftkv

from .common import RequestMeta

# The medium a KV event names for each tier: vLLM's own for host memory and disk; lent GPU
# memory is a GPU's (another model's, reached over NVLink); another host's lent memory is REMOTE.
MEDIUM = {swiftkv.Tier.PEER: "GPU", swiftkv.Tier.HOST: "CPU", swiftkv.Tier.DISK: "STORAGE",
          swiftkv.Tier.REMOTE: "REMOTE"}


class KVEvents(KVConnectorKVEvents):
    """A worker's KV events of one step, as vLLM carries them to the scheduler. vLLM's
    aggregator starts from the first worker's and adds each other worker's (add_events, then
    increment_workers); aggregate() keeps the events every worker reported, in the first
    worker's order: a chunk counts as stored where every shard of it is."""

    def __init__(self, events=None):
        self._lists = [list(events or [])]

    def add_events(self, events) -> None:
        self._lists.append(list(events))

    def increment_workers(self, count: int = 1) -> None:
        pass  # each add_events call is one worker's list

    def aggregate(self) -> "KVEvents":
        first, rest = self._lists[0], self._lists[1:]
        counts = [collections.Counter(events) for events in rest]
        common = []
        for e in first:
            if all(c[e] > 0 for c in counts):
                for c in counts:
                    c[e] -= 1
                common.append(e)
        self._lists = [common]
        return self

    def get_all_events(self) -> list:
        return [e for events in self._lists for e in events]

    def get_number_of_workers(self) -> int:
        return len(self._lists)

    def clear_events(self) -> None:
        self._lists = [[]]


class ChunkEvents:
    """The KV events a worker publishes (vLLM's BlockStored and BlockRemoved, which KV-aware
    routers read): a chunk the library made visible, and a chunk it demoted or dropped on its
    own (its chunk event callback, on a library thread). A chunk is published as its blocks:
    vLLM's block hashes, tokens and block size, with the medium of its tier. Thread-safe: one
    lock over the events not yet taken and the chunks published (key -> what to say of it)."""

    def __init__(self, model, block_tokens: int, chunk_tokens: int):
        from vllm.distributed.kv_events import BlockRemoved, BlockStored
        from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash
        self._stored, self._removed, self._convert = BlockStored, BlockRemoved, \
            maybe_convert_block_hash
        self._model = model
        self._block = block_tokens
        self._per = chunk_tokens // block_tokens
        self._chunk = chunk_tokens
        self._lock = threading.Lock()
        self._events: list = []
        self._chunks: dict = {}  # key -> (hashes, parent, tokens, lora_id, lora_name, tier)

    def _stored_event(self, c, tier):
        hashes, parent, tokens, lora_id, lora_name, _ = c
        return self._stored(block_hashes=[self._convert(h) for h in hashes],
                            parent_block_hash=None if parent is None else self._convert(parent),
                            token_ids=[int(t) for t in tokens], block_size=self._block,
                            lora_id=lora_id, medium=MEDIUM.get(swiftkv.Tier(tier)),
                            lora_name=lora_name)

    def _removed_event(self, c, tier):
        return self._removed(block_hashes=[self._convert(h) for h in c[0]],
                             medium=MEDIUM.get(swiftkv.Tier(tier)))

    def saved(self, r: "RequestMeta") -> None:
        """After r's saves ended: its chunks that are cached now, published as stored."""
        info = r.events
        if info is None or info.first_chunk >= len(r.names):
            return
        names = r.names[info.first_chunk:]
        tiers = [int(i.tier) for i in self._model.chunk_info_named(names)]  # no activity
        keys = self._model.chunk_keys_named(names)
        out = []
        with self._lock:
            for i, (key, tier) in enumerate(zip(keys, tiers)):
                if tier == int(swiftkv.Tier.DROPPED) or key in self._chunks:
                    continue
                first = i * self._per
                c = (tuple(info.block_hashes[first:first + self._per]),
                     info.parent if i == 0 else info.block_hashes[first - 1],
                     info.token_ids[i * self._chunk:(i + 1) * self._chunk],
                     info.lora_id, info.lora_name, int(tier))
                self._chunks[key] = c
                out.append(self._stored_event(c, tier))
            self._events.extend(out)

    def on_chunk_event(self, e: dict) -> None:
        """The library moved or dropped a chunk on its own: removed from its tier, and stored
        in the one it went to."""
        with self._lock:
            c = self._chunks.get(e["key"])
            if c is None:
                return  # not one this worker published
            self._events.append(self._removed_event(c, e["from_tier"]))
            if e["to_tier"] == swiftkv.Tier.DROPPED:
                del self._chunks[e["key"]]
            else:
                c = c[:5] + (int(e["to_tier"]),)
                self._chunks[e["key"]] = c
                self._events.append(self._stored_event(c, e["to_tier"]))

    def reset(self) -> None:
        """Every chunk published is gone (a cache reset)."""
        with self._lock:
            self._events.extend(self._removed_event(c, c[5]) for c in self._chunks.values())
            self._chunks.clear()

    def take(self) -> list:
        with self._lock:
            events, self._events = self._events, []
        return events
