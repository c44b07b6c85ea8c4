"""The lender: another model's process that keeps its KV cache in an elastic region and lends
the idle tail to the tiny engine through the coordinator. It answers one command per stdin line:
"scale TOKENS" (a request of that many tokens arrives: Algorithm 1 ScaleUp, which asks lent
memory back), "settle" (wait until the borrower gave it back), "stats", "quit"."""

import sys
import time

import swiftkv


def main(endpoint: str) -> int:
    # 2 layers, 4 KV heads of 64 dims, f32, 16-token blocks: 64 KiB a block, so one tiny-engine
    # chunk (128 KiB) is 2 blocks.
    me = swiftkv.ModelDesc("tiny-lender", num_layers=2, num_kv_heads=4, head_dim=64,
                           dtype=swiftkv.DType.F32)
    from engine import model_desc

    with swiftkv.Context(host_budget_bytes=16 << 20, coord_endpoint=endpoint,
                         coord_heartbeat_ms=20) as ctx:
        region = ctx.elastic(me, model_desc(), capacity_blocks=32, owned_blocks=8)
        region.offer("tiny-lender")
        print("ready", flush=True)
        for line in sys.stdin:
            cmd = line.split()
            if not cmd:
                continue
            if cmd[0] == "scale":
                st, blocks, chunks = region.scale_for_request(int(cmd[1]))
                print(int(st), blocks, chunks, flush=True)
            elif cmd[0] == "settle":
                for _ in range(10000):
                    if region.stats()["reclaiming_blocks"] == 0:
                        break
                    time.sleep(0.001)
                print(region.stats()["reclaiming_blocks"], flush=True)
            elif cmd[0] == "stats":
                s, c = region.stats(), ctx.coord_stats()
                print(s["owned_blocks"], s["lent_blocks"], s["leases"], c["reclaims_acked"],
                      c["reclaim_ns_max"], flush=True)
            else:
                break
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
