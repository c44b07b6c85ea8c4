"""A vLLM engine lends: two real vLLM engines on the CPU in two processes (the example's
engine.py, with the checking connectors of lend_engine.py), a small Llama with random weights.
A lends the idle tail of its KV cache (the connector's lend option block); B borrows it
(lenders: [A]) and serves multi-turn conversations from A's memory; then A gets a burst and takes
its memory back, and later, idle again, lends again. A plain engine with the same weights and no
lending gives the reference of A's outputs.

Checked: A's greedy tokens and log-probabilities equal the reference before, during and after a
reclaim, so A never read what B wrote into the memory A lent; no block of a unit out of A's hands
is in any of its block tables, at every step; A is never preempted while a reclaim can serve it;
B's loads from A's memory are byte for byte what vLLM wrote, and after the reclaim come from host
memory or disk; a killed borrower costs A nothing (every unit comes back), and a killed lender
costs B its chunks in A's memory only (recomputed, its outputs an engine's that computes all).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

import recording

HERE = os.path.dirname(os.path.abspath(__file__))
BLOCK, CHUNK = 32, 64
A_BLOCKS = 512  # A's KV cache: 512 blocks of 32 tokens
# B's geometry as A lends for it: the same small Llama (4 layers, 2 KV heads of 64, bf16).
BORROWER = {"num_layers": 4, "num_kv_heads": 2, "head_dim": 64, "dtype": "bfloat16",
            "chunk_tokens": CHUNK}
PEER, HOST, DISK, DROPPED = 0, 1, 2, 3  # swiftkv.Tier


ENGINE = os.path.join(HERE, "..", "..", "examples", "two_vllm", "engine.py")
CONNECTORS = {"lender": "lend_engine:LendingChecker", "borrower": "lend_engine:BorrowingRecorder",
              "plain": "swiftkv.integrations.vllm:SwiftKVConnector"}


class Engine:
    """A vLLM engine in a process of its own (examples/two_vllm/engine.py), with the checking
    connector of its role (lend_engine.py)."""

    def __init__(self, role, model_dir, extra, **engine):
        path = os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")])
        self.proc = subprocess.Popen(
            [sys.executable, ENGINE, model_dir, json.dumps(extra),
             json.dumps({**engine, "connector": CONNECTORS[role]})],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=HERE,
            env={**os.environ, "PYTHONPATH": path, "VLLM_CPU_KVCACHE_SPACE": "1",
                 "VLLM_CPU_OMP_THREADS_BIND": "nobind"})
        assert self.read().get("ready")

    def read(self):
        for line in self.proc.stdout:
            if line.startswith("{"):
                return json.loads(line)
        raise RuntimeError(f"the engine ended (exit {self.proc.wait()})")

    def send(self, **cmd):
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def ask(self, **cmd):
        self.send(**cmd)
        return self.read()

    def gen(self, prompts, max_tokens=8):
        """The greedy tokens and their log-probabilities."""
        out = self.ask(op="gen", prompts=prompts, max_tokens=max_tokens)
        return {"tokens": out["tokens"], "logprobs": out["logprobs"]}

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def close(self):
        if self.proc.poll() is None:
            try:
                self.send(op="quit")
                self.proc.wait(timeout=60)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self.kill()


def prompt(seed, n):
    return [(seed * 131 + 7 * i) % 997 + 1 for i in range(n)]


SMALL = [prompt(s, 200 + 30 * s) for s in range(4)]     # A's load while it lends
BURST = [prompt(50 + s, 1600) for s in range(8)]       # more than A keeps free: a reclaim
CONVERSATIONS = [prompt(100 + s, 640) for s in range(4)]  # B's first turns: 10 chunks each


def follow_up(conv, answer, s):
    return conv + answer + prompt(200 + s, 70)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("model")
    recording.write_llama(d)
    recording.write_weights(d, seed=5)
    return str(d)


@pytest.fixture(scope="module")
def reference(model_dir):
    """A's outputs without lending: the same engine and weights, no lend block."""
    e = Engine("plain", model_dir, {"host_budget_bytes": 8 << 20, "chunk_tokens": CHUNK},
               blocks=A_BLOCKS)
    try:
        out = {"small": e.gen(SMALL), "burst": e.gen(BURST, max_tokens=4)}
    finally:
        e.close()
    return out


def lender(model_dir, path, tp=1, **lend):
    endpoint = f"ipc://{path}/a.sock" if tp == 1 else f"ipc://{path}/a.{{rank}}.sock"
    extra = {"host_budget_bytes": 8 << 20, "chunk_tokens": CHUNK,
             "lend": {"endpoint": endpoint, "name": "A", "borrower": BORROWER,
                      "high_free_blocks": 0.5, "low_free_blocks": 0.25, **lend}}
    return Engine("lender", model_dir, extra, blocks=A_BLOCKS, tp=tp)


def borrower(model_dir, path, disk, units=40, lender_tp=1, lends=False):
    """B, borrowing from A (from each of A's tensor parallel workers, which offer their shards
    on endpoints of their own); with `lends`, lending its own idle blocks at the same time."""
    os.makedirs(disk, exist_ok=True)
    lenders = [{"endpoint": f"ipc://{path}/a.sock", "name": "A", "units": units}] \
        if lender_tp == 1 else \
        [{"endpoint": f"ipc://{path}/a.{r}.sock", "name": f"A.tp{r}", "units": units // 2}
         for r in range(lender_tp)]
    extra = {"host_budget_bytes": 16 << 20, "chunk_tokens": CHUNK, "disk_path": disk,
             "disk_budget_bytes": 64 << 20, "lenders": lenders}
    if lends:  # (above this many free blocks: none of B's while the test runs)
        extra["lend"] = {"endpoint": f"ipc://{path}/b.sock", "name": "B", "borrower": BORROWER,
                         "high_free_blocks": 4096, "low_free_blocks": 0}
    return Engine("borrower", model_dir, extra, blocks=1024)


def lend_until(a, units, tries=20):
    """A's state once it lent at least `units` units (each takes steps: A serves SMALL)."""
    for _ in range(tries):
        s = a.ask(op="state")
        if len(s["lent"]) >= units:
            return s
        a.gen(SMALL[:1], max_tokens=16)
    raise AssertionError(f"A lent {len(s['lent'])} units, not {units}: {s}")


def test_a_vllm_engine_lends_its_idle_tail_and_takes_it_back(model_dir, reference, tmp_path):
    a = lender(model_dir, tmp_path)
    b = None
    try:
        s = a.ask(op="state")
        assert s["layout"] == "BLHNC" and s["unit_blocks"] == 2  # 128 KiB: 2 blocks, 1 chunk
        assert a.gen(SMALL) == reference["small"]  # lending as it serves
        s = lend_until(a, 40)
        lent_before = s["stats"]["units_lent"]
        # Lent from the tail down, never past the high watermark: 256 blocks stay free.
        assert s["lent"] == list(range(len(s["lent"])))
        assert s["free_blocks"] >= A_BLOCKS // 2 - 2

        # B borrows from A and is a lender at once: its KV cache is a region of its own too
        # (lending nothing: vLLM's prefix-cache reset, which the test uses, refuses while a
        # unit is out, vLLM counting its blocks used), its loads as exact.
        b = borrower(model_dir, tmp_path, str(tmp_path / "disk"), lends=True)
        assert b.ask(op="state")["layout"] == "BLHNC"
        first = b.gen(CONVERSATIONS, max_tokens=8)
        assert b.ask(op="forget")["reset"]  # B's next turns load from the library
        tiers = [b.ask(op="tiers", prompt=c)["tiers"] for c in CONVERSATIONS]
        # Every chunk is cached, the first ones in A's memory (the borrower demotes ahead to
        # host memory to keep a share of its lent memory free).
        assert all(t in (PEER, HOST) for row in tiers for t in row), tiers
        assert sum(row.count(PEER) for row in tiers) >= 10, tiers
        seconds = [follow_up(c, t, s) for s, (c, t) in
                   enumerate(zip(CONVERSATIONS, first["tokens"]))]
        b.gen(seconds, max_tokens=4)
        s_b = b.ask(op="state")
        assert s_b["compared"] > 0 and s_b["equal"] == s_b["compared"]

        # B wrote its K/V into A's lent memory: A serves on, its outputs the reference's.
        assert a.gen(SMALL) == reference["small"]
        # The burst needs more blocks than A keeps free: it takes units back, vLLM waiting for
        # them rather than preempting; the outputs are the reference's.
        assert a.gen(BURST, max_tokens=4) == reference["burst"]
        s = a.ask(op="state")
        assert s["stats"]["units_reclaimed"] >= 1, s
        assert s["checks"]["preempted"] == 0, s
        assert s["checks"]["preempted_while_reclaiming"] == 0, s
        assert s["checks"]["lent_in_table"] == 0, s

        # B's chunks that were in the reclaimed units were evacuated: its next turn loads them
        # from host memory or disk, byte for byte.
        thirds = [follow_up(c, [5, 6], s) for s, c in enumerate(seconds)]
        tiers = [b.ask(op="tiers", prompt=c)["tiers"] for c in seconds]
        assert any(t in (HOST, DISK) for row in tiers for t in row), tiers
        assert b.ask(op="forget")["reset"]
        b.gen(thirds, max_tokens=4)
        s_b = b.ask(op="state")
        assert s_b["compared"] > 0 and s_b["equal"] == s_b["compared"]

        # Idle again, A lends again; B, which lost leases to the reclaim, borrows again.
        held_after_burst = b.ask(op="state")["peer_bytes"]
        s = lend_until(a, len(s["lent"]) + 4)
        assert s["stats"]["units_lent"] > lent_before
        assert s["checks"]["lent_in_table"] == 0 and s["checks"]["steps"] > 50
        assert a.gen(SMALL) == reference["small"]
        deadline = time.monotonic() + 20
        while b.ask(op="state")["peer_bytes"] <= held_after_burst:
            assert time.monotonic() < deadline, b.ask(op="state")
            a.gen(SMALL[:1], max_tokens=8)  # A lends as it steps
            time.sleep(0.5)
        assert b.ask(op="state")["borrowed_again"] > 0
    finally:
        a.close()
        if b is not None:
            b.close()


def test_a_killed_borrower_costs_the_lender_nothing(model_dir, reference, tmp_path):
    # A reclaim is timed to the step at which A's workers have the unit back, so its time holds
    # A's own steps too: under `ctest -j` beside a compile on a 2-core machine, the burst's steps
    # outlasted the default deadline (2 s) and every unit counted late, the borrower's 1 s leases
    # notwithstanding. With a deadline ten times the lease, a late reclaim is one that the dead
    # borrower held, not a slow step.
    a = lender(model_dir, tmp_path, reclaim_deadline_s=10.0)
    b = None
    try:
        lend_until(a, 40)
        b = borrower(model_dir, tmp_path, str(tmp_path / "disk"))
        b.gen(CONVERSATIONS, max_tokens=4)
        b.send(op="gen", prompts=CONVERSATIONS, max_tokens=64)
        time.sleep(1.0)  # mid-step
        b.kill()
        # Its leases expire (lease_ms, 1 s) and the reclaim finishes; A serves on unharmed.
        assert a.gen(BURST, max_tokens=4) == reference["burst"]
        deadline = time.monotonic() + 30
        while True:  # (the reclaim may end after the burst: A's next steps see it)
            s = a.ask(op="state")
            if s["stats"]["units_reclaimed"] >= 1 and not s["moving"]:
                break
            assert time.monotonic() < deadline, s
            assert a.gen(SMALL[:1], max_tokens=4)["tokens"]
        assert s["checks"]["preempted_while_reclaiming"] == 0
        assert s["stats"]["reclaims_late"] == 0, s  # the dead borrower's leases ran out
        assert a.gen(SMALL) == reference["small"]
    finally:
        a.close()
        if b is not None:
            b.close()


def test_a_killed_lender_costs_the_borrower_its_leases_only(model_dir, tmp_path):
    a = lender(model_dir, tmp_path)
    b = None
    try:
        lend_until(a, 40)
        b = borrower(model_dir, tmp_path, str(tmp_path / "disk"), units=60)
        first = b.gen(CONVERSATIONS, max_tokens=8)
        assert b.ask(op="forget")["reset"]
        seconds = [follow_up(c, t, s) for s, (c, t) in
                   enumerate(zip(CONVERSATIONS, first["tokens"]))]
        tiers = [b.ask(op="tiers", prompt=c)["tiers"] for c in CONVERSATIONS]
        assert sum(row.count(PEER) for row in tiers) >= 10, tiers
        a.kill()
        # B finds A gone (its fd channel hangs up) and drops the chunks it held there; a load
        # that raced with that fails into vLLM's recompute. Either way they are recomputed.
        deadline = time.monotonic() + 10
        while any(PEER in b.ask(op="tiers", prompt=c)["tiers"] for c in CONVERSATIONS):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        after = b.gen(seconds, max_tokens=8)
        # The same turns served by an engine that computes everything.
        plain = Engine("plain", model_dir, {"host_budget_bytes": 8 << 20, "chunk_tokens": CHUNK},
                       blocks=1024)
        try:
            want = plain.gen(seconds, max_tokens=8)
        finally:
            plain.close()
        # The same tokens; log-probabilities within bf16's noise (B computed part of each prompt
        # in other batch shapes than the plain engine, which computed it whole).
        assert after["tokens"] == want["tokens"]
        for got, ref in zip(after["logprobs"], want["logprobs"]):
            assert max(abs(x - y) for x, y in zip(got, ref)) < 0.05
        s_b = b.ask(op="state")
        assert s_b["equal"] == s_b["compared"]  # what loaded (from host or disk) was exact
    finally:
        a.close()
        if b is not None:
            b.close()


def test_a_tensor_parallel_engine_lends_from_every_worker(model_dir, tmp_path):
    """A with two tensor parallel workers (vLLM's multiprocess executor), each lending its shard
    of one KV head on an endpoint of its own: a unit is 4 blocks there (a block of one head is
    32 KiB, B's chunk 128 KiB), lent only once both workers gave it up. B borrows from both; A's
    burst takes units back from both, its outputs those of the same engine not lending."""
    ref = Engine("plain", model_dir, {"host_budget_bytes": 8 << 20, "chunk_tokens": CHUNK},
                 blocks=A_BLOCKS, tp=2)
    try:
        want = {"small": ref.gen(SMALL), "burst": ref.gen(BURST, max_tokens=4)}
    finally:
        ref.close()
    a = lender(model_dir, tmp_path, tp=2)
    b = None
    try:
        s = a.ask(op="state")
        assert s["layout"] == "BLHNC" and s["unit_blocks"] == 4
        assert a.gen(SMALL) == want["small"]
        lend_until(a, 20)
        b = borrower(model_dir, tmp_path, str(tmp_path / "disk"), units=20, lender_tp=2)
        b.gen(CONVERSATIONS, max_tokens=8)
        assert b.ask(op="forget")["reset"]
        tiers = [b.ask(op="tiers", prompt=c)["tiers"] for c in CONVERSATIONS]
        assert sum(row.count(PEER) for row in tiers) >= 5, tiers
        assert a.gen(BURST, max_tokens=4) == want["burst"]
        s = a.ask(op="state")
        assert s["stats"]["units_reclaimed"] >= 1, s
        assert s["checks"]["preempted_while_reclaiming"] == 0, s
        assert s["checks"]["lent_in_table"] == 0, s
        assert a.gen(SMALL) == want["small"]
    finally:
        a.close()
        if b is not None:
            b.close()
