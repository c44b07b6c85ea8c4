"""The lightly loaded model's process: it keeps its own KV cache in an elastic region, offers
the idle tail to borrowers on a coordinator endpoint, and runs a synthetic load of its own that
grows and shrinks its owned part. Driven by one command per stdin line, so that a run (and its
test) is the same every time:

    load TOKENS   a request of TOKENS tokens arrives: Algorithm 1 ScaleUp (asks lent memory back)
    settle        waits until every lease asked back was given back
    idle          the load went: ScaleDown over the last window (the tail is lendable again)
    stats         owned, lent and leased blocks, reclaims asked and answered
    quit

Each answer is one line of JSON on stdout; events are also described on stderr.

    python lender.py ENDPOINT BORROWER_DESC_JSON [DEVICE]

DEVICE: the GPU whose memory the region is (VMM), or -1 (the default) for host memory.
"""

import json
import sys
import time

import swiftkv

# The lender's own model: 4 layers of 2 KV heads of 16 dims, f32, 16-token blocks (1 KiB a
# block per layer side). What matters to the borrower is only the region's bytes.
LENDER = dict(name="worker-model", num_layers=4, num_kv_heads=2, head_dim=16)
NAME = "worker"


def say(**what):
    print(json.dumps(what), flush=True)


def main(endpoint: str, borrower_json: str, device: int = swiftkv.DEVICE_HOST) -> int:
    me = swiftkv.ModelDesc(dtype=swiftkv.DType.F32, device=device, **LENDER)
    fields = json.loads(borrower_json)
    fields["dtype"] = swiftkv.DType(fields["dtype"])
    borrower = swiftkv.ModelDesc(**fields)
    _, unit_blocks = swiftkv.lend_unit(borrower, me)
    capacity = unit_blocks * 12  # 12 lending units: its own part plus what it can lend
    region_bytes = capacity * me.block_tokens * me.bytes_per_token
    mask = 0 if device < 0 else 1 << device
    with swiftkv.Context(host_budget_bytes=region_bytes + (4 << 20), coord_endpoint=endpoint,
                         coord_heartbeat_ms=20, device_mask=mask) as ctx:
        region = ctx.elastic(me, borrower, capacity_blocks=capacity, owned_blocks=unit_blocks,
                             window_ms=50)
        region.offer(NAME)
        say(event="ready", capacity_blocks=capacity, unit_blocks=unit_blocks,
            region_bytes=region_bytes)
        for line in sys.stdin:
            cmd = line.split()
            if not cmd:
                continue
            if cmd[0] == "load":
                try:
                    st, blocks, chunks = region.scale_for_request(int(cmd[1]))
                except swiftkv.Error as e:
                    say(event="load", status=str(e), blocks=0, borrower_chunks=0)
                    continue
                print(f"lender: a request of {cmd[1]} tokens: owned part +{blocks} blocks, "
                      f"borrowers lose {chunks} chunks ({st.name})", file=sys.stderr)
                say(event="load", status=st.name, blocks=blocks, borrower_chunks=chunks)
            elif cmd[0] == "settle":
                for _ in range(5000):
                    if region.stats()["reclaiming_blocks"] == 0:
                        break
                    time.sleep(0.001)
                say(event="settle", reclaiming_blocks=region.stats()["reclaiming_blocks"])
            elif cmd[0] == "idle":
                time.sleep(0.06)  # past the window: the big request is no longer in it
                st, blocks, chunks = region.tick(0)
                print(f"lender: idle: owned part -{blocks} blocks, lendable +{chunks} chunks",
                      file=sys.stderr)
                say(event="idle", status=st.name, blocks=blocks, borrower_chunks=chunks)
            elif cmd[0] == "stats":
                s, c = region.stats(), ctx.coord_stats()
                say(event="stats", owned_blocks=s["owned_blocks"], lent_blocks=s["lent_blocks"],
                    leases=s["leases"], reclaims_sent=c["reclaims_sent"],
                    reclaims_acked=c["reclaims_acked"])
            else:
                break
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else -1))
