#!/usr/bin/env bash
# Alternate an old build of softrnicd and softrnic-perf with this tree's on
# one clean veth pair (root): old, new, old, new, ... so that the machine's
# drift over the run falls on both alike; prints each round and the
# medians. For "no regression on a clean link" (issue 18).
#
#   OLD=d439362 ROUNDS=12 SIZES="65536 1048576" DP=xdp D=2 hack/alternate.sh
#
# OLD is a git ref (built in a temporary worktree), DP the datapath, D the
# seconds of each write_bw point.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=$PATH:/usr/local/go/bin
[ "$(id -u)" = 0 ] || { echo "alternate: needs root (network namespaces)" >&2; exit 1; }
old=${OLD:?OLD=<git ref> is the build to compare with}
root=$(mktemp -d /tmp/softrnic-alt.XXXXXX)
name=srnalt$$
pids=()
stop() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
	pids=()
	rm -f "$root/a.sock" "$root/b.sock"
}
cleanup() {
	stop
	hack/topology.sh down --name "$name" >/dev/null 2>&1 || true
	git worktree remove --force "$root/src" >/dev/null 2>&1 || true
	rm -rf "$root"
}
trap cleanup EXIT
git worktree add --detach "$root/src" "$old" >/dev/null
(cd "$root/src" && go build -o "$root/old/" ./cmd/softrnicd ./cmd/softrnic-perf)
go build -o "$root/new/" ./cmd/softrnicd ./cmd/softrnic-perf
hack/topology.sh up --name "$name" >/dev/null
port=7000
for r in $(seq "${ROUNDS:-10}"); do
	for b in old new; do
		bin=$root/$b
		ip netns exec "$name-a" "$bin/softrnicd" --iface veth-a --socket "$root/a.sock" --log-level warn --datapath "${DP:-xdp}" --cpus 0 &
		pids+=($!)
		ip netns exec "$name-b" "$bin/softrnicd" --iface veth-b --socket "$root/b.sock" --log-level warn --datapath "${DP:-xdp}" --cpus 1 &
		pids+=($!)
		for s in a b; do for _ in $(seq 100); do [ -S "$root/$s.sock" ] && break; sleep 0.05; done; done
		for sz in ${SIZES:-65536}; do
			port=$((port + 1))
			ip netns exec "$name-b" timeout 60 "$bin/softrnic-perf" write_bw --socket "$root/b.sock" -p "$port" -s "$sz" -D "${D:-2}" --report_gbits >/dev/null 2>&1 &
			sp=$!
			sleep 0.3
			# The result line: size, iterations, peak and average Gbit/s, Mpps.
			g=$(ip netns exec "$name-a" timeout 60 "$bin/softrnic-perf" write_bw --socket "$root/a.sock" -p "$port" -s "$sz" -D "${D:-2}" --report_gbits 192.0.2.2 | awk '$1 ~ /^[0-9]+$/ && NF >= 5 {v=$4} END {print v}')
			wait "$sp" || true
			echo "round $r $b size $sz: ${g:-failed} Gbit/s"
		done
		stop
	done
done | tee "$root/log"
echo "== medians (${DP:-xdp} datapath, $old = old)"
for sz in ${SIZES:-65536}; do
	for b in old new; do
		grep " $b size $sz: " "$root/log" | awk '{print $6}' | grep -v failed | sort -g |
			awk -v b="$b" -v sz="$sz" '{v[NR]=$1} END {m = NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2; printf "size %s %s: median %.2f Gbit/s of %d rounds\n", sz, b, m, NR}'
	done
done
