"""A vLLM general plugin (entry point ``vllm.general_plugins``: ``swiftkv_cpu_kv_layouts``), which
vLLM runs in each of its processes before it resolves the KV cache layout.

vLLM's CPU build 0.32 declares only ``LBHNC`` for its attention backend (``CPUAttentionBackend.
supported_kv_cache_layouts``), but its kernels read a block-outermost cache (``BLHNC``) through
the tensors' strides: a 4-layer Llama gives the same greedy tokens and log-probabilities either
way (docs/vllm.md, Lending, and tests/vllm_engine check it again). A lending SwiftKVConnector
needs ``BLHNC``, and vLLM asks each worker process for its backends' layouts before it makes any
connector, so the declaration is widened here, in every process, to ``(LBHNC, BLHNC)``: ``LBHNC``
stays first, the layout vLLM chooses unless a connector asks for ``BLHNC``. Only on vLLM's CPU
platform, only for the release checked (0.32), and only while the backend declares exactly
``(LBHNC,)``: anything else is left as it is. GPU backends (FlashAttention, FlashInfer, Triton)
declare ``BLHNC`` themselves.
"""

from __future__ import annotations

CHECKED_RELEASES = ((0, 32),)


def register() -> None:
    try:
        import vllm
        from vllm.platforms import current_platform
    except ImportError:
        return
    release = tuple(int(x) for x in str(vllm.__version__).split(".")[:2] if x.isdigit())
    if release not in CHECKED_RELEASES or not current_platform.is_cpu():
        return
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
    from vllm.v1.kv_cache_interface import KVCacheLayout
    declared = getattr(CPUAttentionBackend, "supported_kv_cache_layouts", None)
    if declared is None or getattr(CPUAttentionBackend, "_swiftkv_widened", False):
        return
    if tuple(declared()) != (KVCacheLayout.LBHNC,):
        return
    widened = (KVCacheLayout.LBHNC, KVCacheLayout.BLHNC)
    CPUAttentionBackend.supported_kv_cache_layouts = classmethod(lambda cls: widened)
    CPUAttentionBackend._swiftkv_widened = True
