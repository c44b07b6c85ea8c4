#!/usr/bin/env bash
# ctest test_remote_slow_link: the UCX transport on a slow link. test_remote_transport runs with
# --slow-link in a network namespace of its own whose loopback is shaped by a token bucket (tc's
# tbf) to SWIFTKV_TEST_LINK_BYTES_PER_S; its serving peer, a child, shares the namespace and so
# the link. Needs root for `ip netns` and tc: skipped (77) otherwise.
#   remote_slow_link.sh TEST_REMOTE_TRANSPORT_BINARY
set -euo pipefail
bin=$1
if [ "$(id -u)" != 0 ]; then
  echo "skipped: ip netns needs root"
  exit 77
fi
for tool in ip tc; do
  if ! command -v "$tool" >/dev/null; then
    echo "skipped: no $tool (iproute2)"
    exit 77
  fi
done
ns=swkvslow$(($$ % 100000))
trap 'ip netns del "$ns" 2>/dev/null || true' EXIT
ip netns add "$ns"
ip -n "$ns" link set lo up
# 16 MB/s. The bucket holds more than loopback's 64 KiB packets (a packet larger than the burst
# never passes) and the queue whatever TCP has in flight (a drop would stall on a retransmission).
rate=16000000
if ! ip netns exec "$ns" tc qdisc add dev lo root tbf rate $((rate * 8))bit burst 256kb \
  limit 64mb 2>/dev/null; then
  echo "skipped: this kernel has no tbf queueing discipline"
  exit 77
fi
SWIFTKV_TEST_LINK_BYTES_PER_S=$rate ip netns exec "$ns" "$bin" --slow-link
