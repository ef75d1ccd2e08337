#!/usr/bin/env bash
# The README's main command: two hosts (network namespaces joined by veth),
# a softrnicd in each, and the example application pair between them:
# connect, Send, RDMA Write (verified by the server), RDMA Read (verified by
# the client), latency, disconnect; then the same pair again, negotiating
# over its own TCP connection first and switching that connection to RDMA. Without root it says so and runs both
# daemons on loopback instead (DEMO_LOOPBACK=1 asks for that as root too).
# Everything it starts it stops, by PID.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=$PATH:/usr/local/go/bin
SIZE=${SIZE:-268435456}
DATAPATH=${DATAPATH:-kernel}
bin=$(mktemp -d /tmp/softrnic-demo.XXXXXX)
pids=()
name=srndemo$$

cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	if [ -e "/run/netns/$name-a" ]; then hack/topology.sh down --name "$name" >/dev/null 2>&1 || true; fi
	rm -rf "$bin"
}
trap cleanup EXIT

echo "== building"
go build -o "$bin/" ./cmd/softrnicd ./cmd/softrnic-example ./cmd/softrnic-sdp-example

wait_socket() {
	for _ in $(seq 100); do [ -S "$1" ] && return 0; sleep 0.05; done
	echo "demo: daemon socket $1 never appeared" >&2
	return 1
}

if [ "$(id -u)" = 0 ] && [ -z "${DEMO_LOOPBACK:-}" ]; then
	bash hack/deps.sh test >/dev/null
	echo "== two hosts: $name-a (192.0.2.1) and $name-b (192.0.2.2), veth, MTU 1500"
	hack/topology.sh up --name "$name" >/dev/null
	run_a=(ip netns exec "$name-a")
	run_b=(ip netns exec "$name-b")
	iface_a=veth-a iface_b=veth-b server=192.0.2.2
else
	if [ "$(id -u)" != 0 ]; then
		echo "== not root: no network namespaces; both daemons on loopback instead"
	else
		echo "== DEMO_LOOPBACK set: both daemons on loopback"
	fi
	run_a=() run_b=()
	iface_a=lo iface_b=lo server=127.0.0.1
fi
sock_a=$bin/a.sock sock_b=$bin/b.sock
port=$((20000 + RANDOM % 20000))

dp_a=() dp_b=()
if [ "$DATAPATH" = xdp ]; then
	[ ${#run_a[@]} -gt 0 ] || { echo "demo: DATAPATH=xdp needs root (namespaces, XDP)" >&2; exit 1; }
	# Both hosts share this machine: each host's poller gets a CPU of its
	# own (see softrnic-bench).
	dp_a=(--datapath xdp --cpus 0) dp_b=(--datapath xdp --cpus $(($(nproc) > 1 ? 1 : 0)))
fi
echo "== softrnicd in each host ($DATAPATH datapath)"
"${run_a[@]}" "$bin/softrnicd" --iface "$iface_a" --socket "$sock_a" --log-level warn "${dp_a[@]}" &
pids+=($!)
"${run_b[@]}" "$bin/softrnicd" --iface "$iface_b" --socket "$sock_b" --log-level warn "${dp_b[@]}" &
pids+=($!)
wait_socket "$sock_a"
wait_socket "$sock_b"

echo "== example server on host b, client on host a ($((SIZE >> 20)) MiB each way)"
"${run_b[@]}" timeout 120 "$bin/softrnic-example" server --socket "$sock_b" --port "$port" --size "$SIZE" &
spid=$!
pids+=($spid)
sleep 0.3
"${run_a[@]}" timeout 120 "$bin/softrnic-example" client --socket "$sock_a" --server "$server:$port" --size "$SIZE"
wait "$spid"

echo "== stream → RDMA: the pair talks over its own TCP connection first, then switches that connection to RDMA"
echo "   (a Socket Service Point on the server, SocketConnect on the client$([ "$DATAPATH" = xdp ] && echo '; each daemon takes the connection over from its kernel'))"
port=$((port + 1))
"${run_b[@]}" timeout 120 "$bin/softrnic-example" server --stream --socket "$sock_b" --port "$port" --size "$SIZE" &
spid=$!
pids+=($spid)
sleep 0.3
"${run_a[@]}" timeout 120 "$bin/softrnic-example" client --stream --socket "$sock_a" --server "$server:$port" --size "$SIZE"
wait "$spid"

echo "== sockets over RDMA: a TCP echo server and client switched to SDP by one import (softrnic-sdp-example)"
port=$((port + 1))
"${run_b[@]}" timeout 60 "$bin/softrnic-sdp-example" server --socket "$sock_b" "$server:$port" &
spid=$!
pids+=($spid)
sleep 0.3
"${run_a[@]}" timeout 60 "$bin/softrnic-sdp-example" client --socket "$sock_a" --size "$SIZE" "$server:$port"
echo "   and with offload turned off (SOFTRNIC_SDP=off), the same programs speak plain TCP:"
"${run_a[@]}" env SOFTRNIC_SDP=off timeout 60 "$bin/softrnic-sdp-example" client --socket "$sock_a" --size "$SIZE" "$server:$port"
kill "$spid" 2>/dev/null || true
wait "$spid" 2>/dev/null || true
echo "== unmodified verbs programs: Debian's ib_write_bw -R and rping through softrnic's libibverbs and librdmacm"
if command -v ib_write_bw >/dev/null && command -v rping >/dev/null && [ -e /usr/include/infiniband/verbs.h ]; then
	go run ./verbs/mklib -o "$bin/lib"
	verbs_a=(env LD_LIBRARY_PATH="$bin/lib" SOFTRNIC_SOCKET="$sock_a")
	verbs_b=(env LD_LIBRARY_PATH="$bin/lib" SOFTRNIC_SOCKET="$sock_b")
	port=$((port + 1))
	"${run_b[@]}" "${verbs_b[@]}" timeout 60 ib_write_bw -R -d softrnic0 -p "$port" -s 65536 -n 5000 >/dev/null &
	spid=$!
	pids+=($spid)
	sleep 0.5
	"${run_a[@]}" "${verbs_a[@]}" timeout 60 ib_write_bw -R -d softrnic0 -p "$port" -s 65536 -n 5000 "$server" | grep -E 'Device|Transport|rdma_cm|#bytes|^ *65536'
	wait "$spid"
	port=$((port + 1))
	"${run_b[@]}" "${verbs_b[@]}" timeout 60 rping -s -a "$server" -p "$port" -C 100 -S 4096 -V &
	spid=$!
	pids+=($spid)
	sleep 0.5
	"${run_a[@]}" "${verbs_a[@]}" timeout 60 rping -c -a "$server" -p "$port" -C 100 -S 4096 -V -v | tail -1 | cut -c1-60
	wait "$spid"
	echo "   rping: 100 pings of 4 KiB, each RDMA-Read, RDMA-Written back and compared (-V)"
else
	echo "   skipped: needs perftest, rdmacm-utils and libibverbs-dev (as root, make demo installs them)"
fi
echo "== demo passed"
