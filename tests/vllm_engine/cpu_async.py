"""Async scheduling in vLLM's CPU engine, for spec_engine.py --async-scheduling.

On a GPU vLLM 0.33 schedules asynchronously by default: the engine core schedules step s+1
before step s's sampled tokens are back (AsyncScheduler, a batch queue two deep), so the
scheduler, and the connector's scheduler side with it, sees each request's num_computed_tokens
run ahead of its known tokens, and speculative drafts it learns were rejected a step late. vLLM's
CPU platform turns async scheduling off (nothing to overlap on the CPU), and the runner's async
output path asks torch.cuda for a stream and events.

enable() keeps the engine's async_scheduling as asked, and gives the runner streams and events
that do nothing. That keeps every order the real ones keep: on the CPU each tensor operation,
"non_blocking" copies included, has finished when it returns. vLLM's own async scheduler, batch
queue and runner code then run as on a GPU; only the overlap in time is missing. spec_engine.py
reports the scheduler's class and the runner's flag, and the test requires both, so a vLLM that
ignores the patch fails the test instead of testing the synchronous path again."""

from __future__ import annotations

import contextlib

import torch


class _Event:
    """Recorded work has finished (the CPU ran it when it was issued)."""

    def __init__(self, *args, **kwargs) -> None:
        pass

    def record(self, *args, **kwargs) -> None:
        pass

    def wait(self, *args, **kwargs) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


class _Stream:
    def __init__(self, *args, **kwargs) -> None:
        self.device = torch.device("cpu")

    def wait_stream(self, *args, **kwargs) -> None:
        pass

    def wait_event(self, *args, **kwargs) -> None:
        pass

    def synchronize(self) -> None:
        pass


def enable() -> None:
    """Before the engine is made, in the process that runs its worker (spec_engine.py runs the
    engine core and worker in its own process, VLLM_ENABLE_V1_MULTIPROCESSING=0)."""
    from vllm.platforms import current_platform

    platform = type(current_platform)
    update = platform.check_and_update_config.__func__

    def keep_async(cls, vllm_config) -> None:
        asked = vllm_config.scheduler_config.async_scheduling
        update(cls, vllm_config)
        vllm_config.scheduler_config.async_scheduling = asked

    platform.check_and_update_config = classmethod(keep_async)
    torch.cuda.Stream = _Stream
    torch.cuda.Event = _Event
    torch.Event = _Event
    torch.cuda.current_stream = lambda *args, **kwargs: _Stream()
    torch.cuda.stream = lambda stream: contextlib.nullcontext()
