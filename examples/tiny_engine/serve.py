"""Serves a multi-turn conversation with the tiny engine, its KV history spread over memory lent
by another process (the lender), pinned host memory and disk, and checks every turn's logits
against a from-scratch recomputation, before and after the lender takes its memory back.

    PYTHONPATH=build/bindings/python python3 examples/tiny_engine/serve.py --check
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import swiftkv  # noqa: E402
from engine import BLOCK, CHUNK, Engine, Weights, model_desc, reference_logits  # noqa: E402

TOLERANCE = 2e-3  # float32 logits of magnitude ~1-10, summed in other orders


def start_lender(endpoint: str) -> subprocess.Popen:
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ)
    package_dir = os.path.dirname(os.path.dirname(os.path.abspath(swiftkv.__file__)))
    env["PYTHONPATH"] = os.pathsep.join([package_dir, env.get("PYTHONPATH", "")])
    p = subprocess.Popen([sys.executable, os.path.join(here, "lender.py"), endpoint],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=here,
                         env=env)
    line = p.stdout.readline()
    if line.strip() != "ready":
        raise RuntimeError(f"the lender did not start: {line!r}")
    return p


def ask(p: subprocess.Popen, cmd: str) -> str:
    p.stdin.write(cmd + "\n")
    p.stdin.flush()
    return p.stdout.readline().strip()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--reclaim-after", type=int, default=3, help="the lender scales up after "
                    "this turn and takes its lent memory back")
    ap.add_argument("--check", action="store_true", help="exit 1 unless every check holds")
    args = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="swiftkv-tiny-")
    endpoint = f"ipc://{tmp}/lender"
    lender = start_lender(endpoint)
    failures = []
    tiers_seen = set()
    rng = np.random.default_rng(42)
    weights = Weights()
    chunk_bytes = model_desc().chunk_bytes
    try:
        with swiftkv.Context(host_budget_bytes=4 * chunk_bytes, disk_path=tmp,
                             disk_budget_bytes=64 << 20, coord_heartbeat_ms=20) as ctx:
            engine = Engine(ctx, weights)
            lease = engine.model.borrow_remote(endpoint, "tiny-lender", 6)
            print(f"borrowed lease {lease} from the lender: "
                  f"{ctx.stats()['capacity_bytes'][swiftkv.Tier.PEER] // chunk_bytes} chunks")
            history = np.zeros(0, np.uint32)
            print(f"{'turn':>4} {'tokens':>6} {'prefix':>6} {'loaded':>6} {'streamed':>8} "
                  f"{'computed':>8} {'saved':>5} {'peer/host/disk':>14} {'max |diff|':>10}")
            for turn in range(1, args.turns + 1):
                user = rng.integers(0, 512, int(rng.integers(40, 70)), dtype=np.uint32)
                tokens = np.concatenate([history, user])
                logits, what = engine.turn(tokens, len(history))
                # A short greedy reply, decoded token by token over the pages.
                seq = tokens
                served = [logits]
                for _ in range(6):
                    nxt = np.array([np.argmax(served[-1][-1])], np.uint32)
                    seq = np.concatenate([seq, nxt])
                    served.append(engine.decode(seq))
                # One recomputation from scratch covers the prompt and every decode step.
                want = reference_logits(weights, seq, len(history))
                diff = float(np.abs(np.concatenate(served) - want).max())
                history = seq
                res = engine.model.lookup(history)["chunks_per_tier"]
                tiers_seen.update(t for t in range(3) if res[t])
                print(f"{turn:>4} {len(tokens):>6} {what['prefix']:>6} {what['loaded']:>6} "
                      f"{what['streamed']:>8} {len(tokens) - what['computed_from']:>8} "
                      f"{what['saved']:>5} "
                      f"{res[0]:>4}/{res[1]}/{res[2]:<5} {diff:>10.2e}")
                if not diff < TOLERANCE:
                    failures.append(f"turn {turn}: logits differ by {diff:.3e}")
                if turn > 1 and what["loaded"] < CHUNK:
                    failures.append(f"turn {turn}: nothing was loaded from the cache")
                if what["loaded"] != what["prefix"]:
                    failures.append(f"turn {turn}: loaded {what['loaded']} of the "
                                    f"{what['prefix']} cached tokens lookup reported")
                if turn == args.reclaim_after:
                    st = ask(lender, f"scale {32 * BLOCK}")
                    settled = ask(lender, "settle")
                    owned, lent, leases, acked, ns = map(int, ask(lender, "stats").split())
                    peer = ctx.stats()["chunks"][swiftkv.Tier.PEER]
                    print(f"     the lender scaled up (status {st.split()[0]}): {acked} reclaim "
                          f"acked in {ns / 1e6:.2f} ms; lent now {lent} blocks, chunks in peer "
                          f"memory {peer}")
                    if settled != "0" or lent != 0 or leases != 0 or acked != 1 or peer != 0:
                        failures.append("the reclaim did not complete: "
                                        f"settled={settled} lent={lent} peer={peer}")
            stats = ctx.stats()
            print(f"cache: {stats['stores']} chunks stored, hits peer/host/disk "
                  f"{stats['hits']}, {stats['demotions']} demotions, "
                  f"{stats['revocations']} revocations, {stats['load_failures']} load failures")
        if tiers_seen != {0, 1, 2}:
            failures.append(f"the history never used every tier: {sorted(tiers_seen)}")
    finally:
        try:
            ask(lender, "quit")
        except (BrokenPipeError, OSError):
            pass
        lender.wait(timeout=10)
    for f in failures:
        print("FAILED:", f)
    if not failures:
        print("every turn's logits match a from-scratch recomputation")
    return 1 if (failures and args.check) else 0


if __name__ == "__main__":
    sys.exit(main())
