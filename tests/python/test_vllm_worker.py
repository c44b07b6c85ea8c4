"""The vLLM connector's worker side on the tensors an engine has: host tensors everywhere, and
CUDA tensors through a device pool where a GPU is (the GPU validation run has no vLLM: it cannot
be installed there). Where vLLM is not installed, a stand-in of the few vLLM names the connector
imports is put in its place; the connector against vLLM itself, with its scheduler, is
tests/vllm. Here the metadata is built by hand: one step saves a prompt's chunks from some blocks,
a later step loads them into others, and every byte is compared on the tensors' device."""

import importlib
import sys
import types
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import swiftkv  # noqa: E402


def _stand_in_vllm():
    """Modules with the vLLM names swiftkv.integrations.vllm uses, as vLLM 0.33 defines them."""
    import enum
    import logging

    def module(name, **attrs):
        m = types.ModuleType(name)
        m.__dict__.update(attrs)
        sys.modules[name] = m
        return m

    class KVConnectorRole(enum.Enum):
        SCHEDULER = 0
        WORKER = 1

    class KVConnectorMetadata:
        pass

    class KVConnectorWorkerMetadata:
        def aggregate(self, other):
            raise NotImplementedError

    class KVConnectorBase_V1:
        def __init__(self, vllm_config, role, kv_cache_config):
            self._vllm_config = vllm_config
            self._kv_transfer_config = vllm_config.kv_transfer_config
            self._kv_cache_config = kv_cache_config
            self._role = role
            self._connector_metadata = None

        def bind_connector_metadata(self, m):
            self._connector_metadata = m

        def clear_connector_metadata(self):
            self._connector_metadata = None

        def has_connector_metadata(self):
            return self._connector_metadata is not None

        def _get_connector_metadata(self):
            return self._connector_metadata

    class CacheHitSource(str, enum.Enum):
        HOST = "host"
        P2P = "p2p"
        DISK = "disk"
        EXTERNAL_UNSPECIFIED = "external_unspecified"

    class FullAttentionSpec:
        def __init__(self, block_size, num_kv_heads, head_size, dtype):
            self.block_size, self.num_kv_heads = block_size, num_kv_heads
            self.head_size, self.dtype = head_size, dtype

    class KVConnectorKVEvents:
        pass

    class KVConnectorStats:
        def __init__(self, data=None):
            self.data = data if data is not None else {}

    class KVConnectorPromMetrics:
        def __init__(self, vllm_config, metric_types, labelnames, per_engine_labelvalues):
            pass

    module("vllm", __version__="0.33.0")
    module("vllm.distributed.kv_events", KVConnectorKVEvents=KVConnectorKVEvents)
    module("vllm.logger", init_logger=logging.getLogger)
    module("vllm.distributed.kv_transfer.kv_connector.v1.base",
           KVConnectorBase_V1=KVConnectorBase_V1, KVConnectorMetadata=KVConnectorMetadata,
           KVConnectorRole=KVConnectorRole, KVConnectorWorkerMetadata=KVConnectorWorkerMetadata)
    module("vllm.v1.metrics.cache_hit_source", CacheHitSource=CacheHitSource)
    module("vllm.distributed.kv_transfer.kv_connector.v1.metrics",
           KVConnectorStats=KVConnectorStats, KVConnectorPromMetrics=KVConnectorPromMetrics)
    module("vllm.v1.kv_cache_interface", FullAttentionSpec=FullAttentionSpec)
    module("vllm.model_executor.models.utils",
           extract_layer_index=lambda name: int(name.split(".")[2]))


@pytest.fixture(scope="module")
def sv():
    try:
        importlib.import_module("vllm")
    except ImportError:
        _stand_in_vllm()
    return importlib.import_module("swiftkv.integrations.vllm")


LAYERS, HEADS, DIM, BLOCK, CHUNK, BLOCKS = 3, 2, 64, 16, 32, 24
NAMES = [f"model.layers.{i}.self_attn.attn" for i in range(LAYERS)]


def connector(sv, engine_id):
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from vllm.v1.kv_cache_interface import FullAttentionSpec
    config = SimpleNamespace(
        parallel_config=SimpleNamespace(world_size=1, rank=0, distributed_executor_backend="uni"),
        kv_transfer_config=SimpleNamespace(
            engine_id=engine_id,
            kv_connector_extra_config={"host_budget_bytes": 8 << 20, "chunk_tokens": CHUNK}),
        model_config=SimpleNamespace(model="vllm-worker-test", revision=None),
        load_config=SimpleNamespace(load_format="dummy"))
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=HEADS, head_size=DIM,
                             dtype=torch.float16)
    kv_config = SimpleNamespace(
        num_blocks=BLOCKS,
        kv_cache_groups=[SimpleNamespace(kv_cache_spec=spec, layer_names=list(NAMES))])
    return sv.SwiftKVConnector(config, KVConnectorRole.WORKER, kv_config)


def devices():
    out = ["cpu"]
    if torch.cuda.is_available() and swiftkv.device_count() > 0:
        out.append("cuda")
    return out


def run_step(w, meta, tensors, write=None):
    """vLLM's model runner for one step: per layer wait, compute (write), save; then the end."""
    w.bind_connector_metadata(meta)
    w.start_load_kv(None)
    for layer, name in enumerate(NAMES):
        w.wait_for_layer_load(name)
        if write is not None:
            write(layer)
        w.save_kv_layer(name, tensors[name], None)
    w.wait_for_save()
    errors = w.get_block_ids_with_load_errors()
    w.clear_connector_metadata()
    return errors


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("layout", ["LBHNC", "LBNHC", "vllm", "hnd"])
def test_worker_saves_then_loads_on_the_tensors_device(sv, device, layout):
    """LBHNC and LBNHC: vLLM 0.33's [pages, H, N, K+V] views (head-major and token-major
    memory); vllm and hnd: 5-dimensional tensors."""
    tensors = {}
    for n in NAMES:
        if layout == "LBHNC":
            tensors[n] = torch.zeros(BLOCKS, HEADS, BLOCK, 2 * DIM, dtype=torch.float16,
                                     device=device)
        elif layout == "LBNHC":
            tensors[n] = torch.zeros(BLOCKS, BLOCK, HEADS, 2 * DIM, dtype=torch.float16,
                                     device=device).permute(0, 2, 1, 3)
        elif layout == "vllm":
            tensors[n] = torch.zeros(2, BLOCKS, BLOCK, HEADS, DIM, dtype=torch.float16,
                                     device=device)
        else:
            tensors[n] = torch.zeros(BLOCKS, 2, HEADS, BLOCK, DIM, dtype=torch.float16,
                                     device=device).permute(0, 1, 3, 2, 4)
    w = connector(sv, f"worker-{device}-{layout}")
    w.register_kv_caches(tensors)
    try:
        assert w.connector_worker.store.desc.device == (
            swiftkv.DEVICE_HOST if device == "cpu" else torch.cuda.current_device())
        tokens = np.arange(3 * CHUNK + 5, dtype=np.uint32) + 7  # 3 chunks and a bit
        blocks = [5, 1, 9, 3, 7, 11, 2]
        gen = torch.Generator(device="cpu").manual_seed(1)
        truth = [torch.randn(len(tokens), 2, HEADS, DIM, generator=gen).half().to(device)
                 for _ in range(LAYERS)]

        def view(layer, block_ids):
            """[tokens, 2, H, D] of the tokens in block_ids, read from the layer's tensor."""
            t = tensors[NAMES[layer]]
            pos = torch.arange(len(tokens), device=device)
            b = torch.tensor(block_ids, device=device)[pos // BLOCK]
            if layout.startswith("LB"):  # [tokens, H, 2, D] -> [tokens, 2, H, D]
                return t.unflatten(3, (2, DIM))[b, :, pos % BLOCK].permute(0, 2, 1, 3)
            return (t[:, b, pos % BLOCK].permute(1, 0, 2, 3) if layout == "vllm"
                    else t[b, :, pos % BLOCK])

        def write(layer):
            t = tensors[NAMES[layer]]
            pos = torch.arange(len(tokens), device=device)
            b = torch.tensor(blocks, device=device)[pos // BLOCK]
            if layout.startswith("LB"):
                t.unflatten(3, (2, DIM))[b, :, pos % BLOCK] = truth[layer].permute(0, 2, 1, 3)
            elif layout == "vllm":
                t[:, b, pos % BLOCK] = truth[layer].permute(1, 0, 2, 3)
            else:
                t[b, :, pos % BLOCK] = truth[layer]

        # The chunks' names, as the scheduler side takes them from vLLM's block hashes.
        names = np.random.default_rng(2).integers(0, 256, (3, 32), dtype=np.uint8)
        save = sv.common.RequestMeta("r1", len(tokens), names, list(blocks))
        assert run_step(w, sv.SwiftKVConnectorMetadata(requests=[save]), tensors, write) == set()
        w.connector_worker.drain("r1")  # its saves run on the connector's thread: wait for them
        assert w.get_finished({"r1"}) == ({"r1"}, None)
        assert w.connector_worker.store.model.lookup_named(names).prefix_tokens == 3 * CHUNK

        # A later request: vLLM holds the first block itself; the rest of the 3 chunks loads.
        for t in tensors.values():
            t.zero_()
        blocks2 = [4, 8, 0, 6, 10, 12, 13]
        load = sv.common.RequestMeta("r2", len(tokens), names, list(blocks2), load_from=BLOCK,
                               load_to=3 * CHUNK)
        assert run_step(w, sv.SwiftKVConnectorMetadata(requests=[load]), tensors) == set()
        if device == "cuda":
            torch.cuda.synchronize()
        for layer in range(LAYERS):
            got = view(layer, blocks2)
            assert torch.equal(got[BLOCK:3 * CHUNK], truth[layer][BLOCK:3 * CHUNK]), layer
            assert not got[:BLOCK].any()  # vLLM's own block: untouched
    finally:
        w.shutdown()
