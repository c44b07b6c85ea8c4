"""libswiftkv as a KV connector of vLLM's V1 engine: conversation prefixes cached in pinned host
memory and on disk, found by the scheduler and loaded into vLLM's paged KV cache layer by layer
while the model computes; what the model computes is saved layer by layer as it goes.

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "SwiftKVConnector",
        "kv_connector_module_path": "swiftkv.integrations.vllm", "kv_role": "kv_both",
        "kv_connector_extra_config": {"host_budget_bytes": 17179869184}}'

docs/vllm.md has the options (``kv_connector_extra_config``), what is supported and what is not.

Which chunk is which: a chunk is named by vLLM's own hash of its last block
(``request.block_hashes``), which vLLM chains over every token before it and over everything
else it keys its prefix cache by: the LoRA adapter (name and path), multimodal inputs with their
positions, the cache salt and prompt embeddings. The library adds the model's identity (by
default a digest of the weight files vLLM loaded, common.weights_identity). So a request never loads
what another adapter, tenant, image, embedding or set of weights computed. A request vLLM gave
no block hashes to key by is neither offered nor saved (counted in ``unkeyed_requests``).

How vLLM's calls map onto the library:

- Scheduler side. ``get_num_new_matched_tokens`` looks the request's chunks up by name
  (``swiftkv_lookup_named``) and offers the cached run that follows vLLM's own prefix-cache hit,
  in whole blocks, at most up to the last block before the final token (vLLM computes at least
  one token). ``update_state_after_alloc`` records the load vLLM accepted;
  ``build_connector_meta`` gives the workers, per scheduled request, how many of its tokens have
  K/V after the step and its full chunks' names, its block ids, the tokens to load and whether a
  chunk completes this step (then it is saved).
- Worker side. ``register_kv_caches`` registers vLLM's per-layer KV tensors as one pool (their
  layout read from the tensors: vLLM's [2, blocks, B, H, D] or [blocks, 2, B, H, D], NHD or HND
  strides). Each step begins one library request per scheduled request that loads or saves
  (load and save, or save only), ``start_load_kv`` starts the loads, ``wait_for_layer_load`` and
  ``save_kv_layer`` are the library's per-layer hooks for the whole batch, and ``wait_for_save``
  hands the step's saves to a thread of the connector's: a step does not wait for them. A request
  a step had work for keeps its blocks when vLLM finishes it (``request_finished`` returns True)
  until ``get_finished`` reports its saves done; ``handle_preemptions`` waits for a preempted
  request's saves before vLLM reuses its blocks. A load that fails (a
  chunk lost or corrupt) is reported by ``get_block_ids_with_load_errors``: exactly the blocks
  from the first one not loaded intact to the end of the load, so that vLLM's
  ``kv_load_failure_policy="recompute"`` recomputes from there.
- Resets. ``reset_cache`` (vLLM's reset of the connector's cache, as around a weight update)
  has every worker drop the model's chunks, after the saves it was finishing.

Under vLLM's single-process executor the scheduler and the worker share one library context.
Under its multiprocess executor (tensor parallelism, or data parallel engines) each worker keeps
its shard of the KV heads in a library context of its own (its own host memory, disk directory
and leases) and answers its scheduler's lookups over a Unix socket; the scheduler offers a chunk
only when every worker holds it. Calls out of the order vLLM makes them raise HookOrderError.

The package is shaped as vLLM's own offloading connector: ``connector`` (SwiftKVConnector, the
front vLLM loads), ``scheduler`` and ``worker`` (each half), ``lookup`` (the scheduler's lookups
across worker processes), ``events`` (KV events), ``lending`` (which tail units a lending engine
lends), ``common`` (options, geometry, metadata).
"""

from __future__ import annotations

import vllm

from .common import OPTIONS, SUPPORTED_VLLM, HookOrderError, SwiftKVConnectorMetadata
from .common import check_vllm_version as _check_vllm_version

_check_vllm_version(vllm.__version__)

from .connector import SwiftKVConnector  # noqa: E402  (after the version check)

__all__ = ["SwiftKVConnector", "SwiftKVConnectorMetadata", "HookOrderError", "SUPPORTED_VLLM",
           "OPTIONS"]
