#!/usr/bin/env bash
# ctest test_remote_netns: lending across "nodes" on one machine. Two network namespaces joined
# by a veth pair stand for two hosts: test_coord runs in one (the borrower's side), its children
# (lenders, and the borrower that is killed) in the other. The library sees another network
# namespace as another host and takes UCX (tcp over the veth). Needs root for `ip netns`: skipped
# (77) otherwise, or when this build has no UCX.
#   remote_netns.sh TEST_COORD_BINARY
set -euo pipefail
bin=$1
if [ "$(id -u)" != 0 ]; then
  echo "skipped: ip netns needs root"
  exit 77
fi
if ! command -v ip >/dev/null; then
  echo "skipped: no ip (iproute2)"
  exit 77
fi
tag=swkv$(($$ % 100000))
a=${tag}a b=${tag}b
net=10.$((100 + $$ % 100)).$(($$ / 100 % 250)).
cleanup() {
  ip netns del "$a" 2>/dev/null || true
  ip netns del "$b" 2>/dev/null || true
}
trap cleanup EXIT
ip netns add "$a"
ip netns add "$b"
ip link add "${tag}va" type veth peer name "${tag}vb"
ip link set "${tag}va" netns "$a"
ip link set "${tag}vb" netns "$b"
ip -n "$a" addr add "${net}1/24" dev "${tag}va"
ip -n "$b" addr add "${net}2/24" dev "${tag}vb"
for ns in "$a" "$b"; do
  ip -n "$ns" link set lo up
done
ip -n "$a" link set "${tag}va" up
ip -n "$b" link set "${tag}vb" up
SWIFTKV_TEST_COORD_UCX=1 SWIFTKV_TEST_COORD_NETNS=$a SWIFTKV_TEST_LENDER_ADDR=${net}1 \
  SWIFTKV_TEST_BORROWER_ADDR=${net}2 SWIFTKV_TEST_NETNS_LINK=${tag}vb \
  ip netns exec "$b" "$bin"
