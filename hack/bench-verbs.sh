#!/usr/bin/env bash
# make bench, issue 22's part: Debian's perftest through softrnic's
# libibverbs.so.1 and librdmacm.so.1 beside the Go client (softrnic-perf) in
# the same run, on two namespaces with a softrnicd each (DATAPATH=kernel by
# default, or xdp), alternated ROUNDS times (default 3); the table gives
# the medians and the libraries' ratio to the Go client. Figures go to
# bench/verbs.json.
#
# What is compared, like with like:
#   bandwidth  ib_write_bw -R -s 65536 (128 Writes in flight, perftest's
#              default; it polls its CQ) against softrnic-perf write_bw
#              --poll -s 65536 -t 128 (polling too, yielding between looks):
#              MB/s.
#   latency    ib_write_lat -R -s 8 (each side spins on the last octet of
#              its buffer, never yielding) against softrnic-perf write_lat
#              -s 8 (the same loop in Go, yielding between looks: spinning
#              without yield starves the daemon on a 2-core host):
#              typical round trip in microseconds. perftest prints half the
#              round trip for Write and Send latency (its rtt_factor), and
#              softrnic-perf the whole one: perftest's figure is doubled
#              here, so that the two compare. softrnic-perf spinning
#              as perftest does (--busy) is shown beside it: on the xdp
#              datapath a program that never yields shares the two cores
#              with the pinned pollers, and that, not the libraries, is
#              what perftest pays there.
#   send       ib_send_lat -R -s 8 (each side waits on its CQ through
#              ibv_poll_cq, so the libraries' own wait is measured: it
#              yields on a CPU the daemon's datapath shares) against
#              softrnic-perf send_lat -s 8: typical round trip in
#              microseconds, perftest's doubled as above.
BENCH=bench-verbs
source "$(dirname "$0")/bench-pair.sh"
BW_N=${BW_N:-5000} LAT_N=${LAT_N:-5000}
go run ./verbs/mklib -o "$bin/lib"
VA=(env LD_LIBRARY_PATH="$bin/lib" SOFTRNIC_SOCKET="$bin/a.sock")
VB=(env LD_LIBRARY_PATH="$bin/lib" SOFTRNIC_SOCKET="$bin/b.sock")

wait_port() {
	for _ in $(seq 200); do "${B[@]}" ss -Hltn "sport = :$1" | grep -q . && return 0; sleep 0.05; done
	echo "bench-verbs: nothing listens on $1" >&2
	exit 1
}

# perftest TOOL COLUMN ARGS...: one perftest pair; prints the client's
# figure in COLUMN (4: BW average MB/s; 5: t_typical us).
perftest() {
	local tool=$1 col=$2
	shift 2
	local port=$((20000 + RANDOM % 20000))
	"${B[@]}" "${VB[@]}" timeout -s KILL 120 "$tool" -R -d softrnic0 -p "$port" "$@" > "$bin/pt-server.log" 2>&1 &
	local srv=$!
	wait_port "$port"
	"${A[@]}" "${VA[@]}" timeout -s KILL 120 "$tool" -R -d softrnic0 -p "$port" "$@" 192.0.2.2 > "$bin/pt-client.log" 2>&1 || {
		echo "bench-verbs: $tool $*:" >&2
		cat "$bin/pt-client.log" >&2
		exit 1
	}
	wait "$srv" || true
	awk -v c="$col" '$1 ~ /^[0-9]+$/ && NF >= 5 && $2 ~ /^[0-9]+$/ {print $c}' "$bin/pt-client.log" | tail -1
}

# perf FIELD TEST ARGS...: one softrnic-perf pair; prints FIELD of its JSON.
perf() {
	local field=$1
	shift
	local port=$((20000 + RANDOM % 20000))
	"${B[@]}" timeout 120 "$bin/softrnic-perf" "$@" -p "$port" --socket "$bin/b.sock" > "$bin/perf-server.log" 2>&1 &
	local srv=$!
	for _ in $(seq 100); do grep -q "Waiting for client" "$bin/perf-server.log" 2>/dev/null && break; sleep 0.05; done
	"${A[@]}" timeout 120 "$bin/softrnic-perf" "$@" -p "$port" --socket "$bin/a.sock" --json 192.0.2.2 |
		python3 -c 'import json,sys; r=json.load(sys.stdin); r=r[0] if isinstance(r,list) else r; print(r[sys.argv[1]])' "$field"
	wait "$srv" || true
}

bw_v=() bw_g=() lat_v=() lat_g=() lat_y=() snd_v=() snd_g=()
for r in $(seq "$ROUNDS"); do
	bw_v+=("$(perftest ib_write_bw 4 -s 65536 -n "$BW_N")")
	bw_g+=("$(perf bw_avg_MBps write_bw --poll -s 65536 -t 128 -n "$BW_N")")
	lat_v+=("$(perftest ib_write_lat 5 -s 8 -n "$LAT_N" | awk '{print 2 * $1}')")
	lat_g+=("$(perf t_typical_us write_lat -s 8 -n "$LAT_N")")
	lat_y+=("$(perf t_typical_us write_lat -s 8 --busy -n "$LAT_N")")
	snd_v+=("$(perftest ib_send_lat 5 -s 8 -n "$LAT_N" | awk '{print 2 * $1}')")
	snd_g+=("$(perf t_typical_us send_lat -s 8 -n "$LAT_N")")
	printf 'round %d: bandwidth %s / %s MB/s, write latency %s / %s us, Go client spinning %s us, send latency %s / %s us (perftest over the libraries / Go client)\n' "$r" \
		"${bw_v[-1]}" "${bw_g[-1]}" "${lat_v[-1]}" "${lat_g[-1]}" "${lat_y[-1]}" "${snd_v[-1]}" "${snd_g[-1]}"
done

mkdir -p bench
python3 - "$DATAPATH" "${bw_v[*]}" "${bw_g[*]}" "${lat_v[*]}" "${lat_g[*]}" "${lat_y[*]}" "${snd_v[*]}" "${snd_g[*]}" <<'EOF'
import json, statistics, sys
dp = sys.argv[1]
bv, bg, lv, lg, ly, sv, sg = ([float(x) for x in a.split()] for a in sys.argv[2:9])
m = statistics.median
print(f"\n== perftest through libibverbs/librdmacm beside the Go client (softrnic-perf), {dp} datapath, medians of {len(bv)}")
print(f"{'':44} {'libraries':>10} {'Go client':>10} {'ratio':>7}  target")
r = m(bv) / m(bg)
print(f"{'RDMA Write 64 KiB, 128 in flight (MB/s)':44} {m(bv):10.1f} {m(bg):10.1f} {r:7.2f}  >= 0.90 {'met' if r >= 0.9 else 'NOT met'}")
r = m(lv) / m(lg)
print(f"{'RDMA Write 8 B round trip, typical (us)':44} {m(lv):10.2f} {m(lg):10.2f} {r:7.2f}  <= 1.10 {'met' if r <= 1.1 else 'NOT met'}")
print(f"{'  the Go client spinning as perftest (--busy)':44} {'':10} {m(ly):10.2f} {m(lv) / m(ly):7.2f}")
r = m(sv) / m(sg)
print(f"{'Send 8 B round trip, typical (us)':44} {m(sv):10.2f} {m(sg):10.2f} {r:7.2f}  <= 1.10 {'met' if r <= 1.1 else 'NOT met'}")
json.dump({"datapath": dp, "bandwidth_MBps": {"libraries": bv, "go_client": bg},
           "latency_us": {"libraries": lv, "go_client": lg, "go_client_busy": ly},
           "send_latency_us": {"libraries": sv, "go_client": sg}}, open("bench/verbs.json", "w"), indent=1)
EOF
