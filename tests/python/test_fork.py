"""os.fork with a live context. A context belongs to the process that made it: in the child of
a fork it is marked as inherited (os.register_at_fork), its calls raise StateError naming the
fork, and its close releases nothing, so the parent's chunks, on host and on disk, stay right.
Before, a child's stores went into the parent's shared host slabs over its newest chunks, and a
child that only exited hung in the context's finalizer."""

import os
import signal
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import swiftkv

from conftest import chunks_of


def _wait(pid):
    """The child's exit code (a hang is the test's timeout, not an assertion of time)."""
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status), f"the child died of signal {os.WTERMSIG(status)}"
    return os.WEXITSTATUS(status)


def _in_child(check):
    """Runs check() in the child of a fork: 0 if it returned, 1 with the reason on stderr."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            check()
            code = 0
        except BaseException as e:  # noqa: BLE001 - the child must always _exit
            print(f"child: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        finally:
            os._exit(code)
    return _wait(pid)


def test_a_child_cannot_use_the_parents_context(small_model, tmp_path):
    n = 8
    tokens = np.arange(n * 32, dtype=np.uint32)
    kv = chunks_of(7, n, small_model.chunk_bytes)
    (tmp_path / "parent").mkdir()
    ctx = swiftkv.Context(host_budget_bytes=4 << 20, disk_path=str(tmp_path / "parent"),
                          disk_budget_bytes=4 << 20)
    m = ctx.register_model(small_model)
    assert m.store(tokens, kv) == n * 32
    region = ctx.elastic(swiftkv.ModelDesc("lender", num_layers=4, num_kv_heads=2, head_dim=8,
                                           block_tokens=16, chunk_tokens=32),
                         swiftkv.ModelDesc("borrower", num_layers=3, num_kv_heads=1,
                                           head_dim=16, block_tokens=16, chunk_tokens=32),
                         capacity_blocks=12, owned_blocks=6)
    # Another thread keeps calling in, so the binding's locks may be held at the fork.
    stop = threading.Event()

    def busy():
        while not stop.is_set():
            m.lookup(tokens)

    t = threading.Thread(target=busy)
    t.start()

    def child():
        theirs = np.arange(10_000, 10_000 + 64, dtype=np.uint32)
        for call in (lambda: m.store(theirs, chunks_of(8, 2, small_model.chunk_bytes)),
                     lambda: m.lookup(tokens),
                     lambda: m.retrieve(tokens, 0, np.empty_like(kv)),
                     ctx.config,
                     lambda: region.lend(1)):
            with pytest.raises(swiftkv.StateError, match="a fork of it"):
                call()
        region.close()  # release nothing, at once
        ctx.close()
        with pytest.raises(swiftkv.StateError):
            m.lookup(tokens)
        # A context of the child's own serves it.
        with swiftkv.Context(host_budget_bytes=1 << 20) as own:
            mine = own.register_model(small_model)
            assert mine.store(theirs, chunks_of(9, 2, small_model.chunk_bytes)) == 64
            out = np.empty(2 * small_model.chunk_bytes, np.uint8)
            assert mine.retrieve(theirs, 0, out) == 64
            assert np.array_equal(out, chunks_of(9, 2, small_model.chunk_bytes))

    try:
        code = _in_child(child)
    finally:
        stop.set()
        t.join()
    assert code == 0
    # The parent's context is as it was, byte for byte, and none of the child's chunks is in it.
    out = np.empty_like(kv)
    assert m.retrieve(tokens, 0, out) == n * 32 and np.array_equal(out, kv)
    assert m.lookup(np.arange(10_000, 10_000 + 64, dtype=np.uint32)).prefix_tokens == 0
    assert region.lend(1).blocks > 0
    region.close()
    ctx.close()  # writes back to disk
    with swiftkv.Context(host_budget_bytes=4 << 20, disk_path=str(tmp_path / "parent"),
                         disk_budget_bytes=4 << 20) as again:
        m2 = again.register_model(small_model)
        out[:] = 0
        assert m2.retrieve(tokens, 0, out) == n * 32 and np.array_equal(out, kv)


def test_a_child_that_only_exits_ends(small_model):
    """A child of a process with a live context, which does nothing and ends its interpreter
    the ordinary way (its finalizers run): it ends with 0. It hung there before."""
    script = textwrap.dedent(f"""
        import os, sys
        import numpy as np
        import swiftkv
        ctx = swiftkv.Context(host_budget_bytes=1 << 20)
        m = ctx.register_model(swiftkv.ModelDesc("m", num_layers={small_model.num_layers},
            num_kv_heads={small_model.num_kv_heads}, head_dim={small_model.head_dim},
            block_tokens=16, chunk_tokens=32))
        m.store(np.arange(64, dtype=np.uint32), np.ones(2 * m.desc.chunk_bytes, np.uint8))
        pid = os.fork()
        if pid == 0:
            sys.exit(0)  # the interpreter's own end: the context's finalizer runs here
        _, status = os.waitpid(pid, 0)
        sys.exit(os.waitstatus_to_exitcode(status))
    """)
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, err = p.communicate(timeout=120)  # a bound on a hang, not a measure of speed
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)  # the script and its hung child
        p.communicate()
        pytest.fail("the child of the fork never ended")
    assert p.returncode == 0, err
