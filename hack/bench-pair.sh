# Sourced by the bench scripts that measure between two hosts: two network
# namespaces joined by veth (hack/topology.sh), a softrnicd in each
# (DATAPATH=kernel by default, or xdp), torn down on exit. The script sets
# BENCH (its name, for messages) first; this sets ROUNDS (default 3),
# DATAPATH, bin (a temporary directory holding softrnicd and softrnic-perf,
# and the daemons' sockets a.sock and b.sock), name, pids (killed on exit;
# add the script's own), and A and B (the commands that run a program in
# each host).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PATH=$PATH:/usr/local/go/bin
[ "$(id -u)" = 0 ] || { echo "$BENCH: needs root (network namespaces)" >&2; exit 1; }
bash hack/deps.sh test >/dev/null
ROUNDS=${ROUNDS:-3} DATAPATH=${DATAPATH:-kernel}
bin=$(mktemp -d "/tmp/softrnic-$BENCH.XXXXXX")
name=srnb$$
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	hack/topology.sh down --name "$name" >/dev/null 2>&1 || true
	rm -rf "$bin"
}
trap cleanup EXIT

go build -o "$bin/" ./cmd/softrnicd ./cmd/softrnic-perf
hack/topology.sh up --name "$name" >/dev/null
dp_a=() dp_b=()
if [ "$DATAPATH" = xdp ]; then dp_a=(--datapath xdp --cpus 0) dp_b=(--datapath xdp --cpus $(($(nproc) > 1 ? 1 : 0))); fi
ip netns exec "$name-a" "$bin/softrnicd" --iface veth-a --socket "$bin/a.sock" --log-level warn "${dp_a[@]}" &
pids+=($!)
ip netns exec "$name-b" "$bin/softrnicd" --iface veth-b --socket "$bin/b.sock" --log-level warn "${dp_b[@]}" &
pids+=($!)
for s in a b; do
	for _ in $(seq 200); do [ -S "$bin/$s.sock" ] && break; sleep 0.05; done
	[ -S "$bin/$s.sock" ] || { echo "$BENCH: softrnicd in host $s never answered" >&2; exit 1; }
done
A=(ip netns exec "$name-a") B=(ip netns exec "$name-b")
