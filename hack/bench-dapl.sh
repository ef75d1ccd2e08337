#!/usr/bin/env bash
# make bench, issue 17's part: RDMA Write through the uDAPL provider
# (Debian's dapltest -T P over libdaplsoftrnic.so.2) beside the Go client
# (softrnic-perf) in the same run, on two namespaces with a softrnicd each
# (DATAPATH=kernel by default, or xdp), alternated ROUNDS times (default 3);
# the table gives each round's figures, the medians and the provider's
# distance from the Go client. Figures go to bench/dapl.json.
#
# What is compared, like with like:
#   throughput  dapltest -T P -m b -p 16 RW 65536 1 (16 Writes of 64 KiB in
#               flight, completions taken by dat_evd_wait) against
#               softrnic-perf write_bw -s 65536 -t 16 (EVD Wait).
#   latency     dapltest's latency phase (-p 1 RW 8 1: post one 8-octet
#               Write, poll dat_evd_dequeue with sched_yield until it
#               completes) against softrnic-perf write_bw --poll -t 1 -s 8
#               (the same loop in Go): microseconds per Write.
BENCH=bench-dapl
source "$(dirname "$0")/bench-pair.sh"
BW_N=${BW_N:-20000} LAT_N=${LAT_N:-5000}
go build -buildmode=c-shared -o "$bin/libdaplsoftrnic.so.2" ./dapl
for s in a b; do
	printf 'softrnic0 u2.0 nonthreadsafe default %s dapl.2.0 "veth-%s %s" ""\n' "$bin/libdaplsoftrnic.so.2" "$s" "$bin/$s.sock" > "$bin/$s.conf"
done
export DAT_OVERRIDE
DAT_OVERRIDE=$bin/b.conf "${B[@]}" timeout 1800 stdbuf -oL dapltest -T S -D softrnic0 > "$bin/dapltest-server.log" 2>&1 &
pids+=($!)
sleep 1

# perf TEST ARGS...: one softrnic-perf pair; prints its message rate (ops/s).
perf() {
	local port=$((20000 + RANDOM % 20000))
	"${B[@]}" timeout 120 "$bin/softrnic-perf" "$@" -p "$port" --socket "$bin/b.sock" > "$bin/perf-server.log" 2>&1 &
	local srv=$!
	for _ in $(seq 100); do grep -q "Waiting for client" "$bin/perf-server.log" 2>/dev/null && break; sleep 0.05; done
	"${A[@]}" timeout 120 "$bin/softrnic-perf" "$@" -p "$port" --socket "$bin/a.sock" --json 192.0.2.2 |
		python3 -c 'import json,sys; r=json.load(sys.stdin); r=r[0] if isinstance(r,list) else r; print(r["msg_rate_Mpps"]*1e6)'
	wait "$srv" || true
}

# dapl ARGS...: one dapltest -T P client; prints its raw line's fields.
dapl() {
	DAT_OVERRIDE=$bin/a.conf "${A[@]}" timeout 120 dapltest -T P -s 192.0.2.2 -D softrnic0 "$@" > "$bin/dapltest.log" 2>&1 || true
	if grep -qiE "error|fail|warning" "$bin/dapltest.log"; then
		echo "bench-dapl: dapltest $*:" >&2
		cat "$bin/dapltest.log" >&2
		exit 1
	fi
	grep '^raw:' "$bin/dapltest.log"
}

bw_p=() bw_g=() lat_p=() lat_g=()
for r in $(seq "$ROUNDS"); do
	# raw: RW, ops, size, segs, pipeline, cpu, ops/s, MB/s, latency us, post us, reap us
	line=$(dapl -i "$BW_N" -p 16 -m b RW 65536 1)
	bw_p+=("$(echo "$line" | awk -F', *' '{print $7}')")
	bw_g+=("$(perf write_bw -s 65536 -t 16 -n "$BW_N")")
	line=$(dapl -i "$LAT_N" -p 1 -m b RW 8 1)
	lat_p+=("$(echo "$line" | awk -F', *' '{print $9}')")
	rate=$(perf write_bw --poll -s 8 -t 1 -n "$LAT_N")
	lat_g+=("$(python3 -c "print(1e6/$rate)")")
	printf 'round %d: throughput %s / %s ops/s, latency %s / %s us (provider / Go client)\n' "$r" \
		"${bw_p[-1]}" "${bw_g[-1]}" "${lat_p[-1]}" "${lat_g[-1]}"
done
DAT_OVERRIDE=$bin/a.conf "${A[@]}" timeout 30 dapltest -T Q -s 192.0.2.2 -D softrnic0 > /dev/null 2>&1 || true

mkdir -p bench
python3 - "$DATAPATH" "${bw_p[*]}" "${bw_g[*]}" "${lat_p[*]}" "${lat_g[*]}" <<'EOF'
import json, statistics, sys
dp = sys.argv[1]
bp, bg, lp, lg = ([float(x) for x in a.split()] for a in sys.argv[2:6])
m = lambda v: statistics.median(v)
rows = [("RDMA Write 64 KiB, 16 in flight (ops/s)", m(bp), m(bg), m(bp) / m(bg) - 1),
        ("RDMA Write 8 B, post to completion (us)", m(lp), m(lg), m(lp) / m(lg) - 1)]
print(f"\n== uDAPL provider (dapltest -T P) beside the Go client (softrnic-perf), {dp} datapath, medians of {len(bp)}")
print(f"{'':44} {'provider':>10} {'Go client':>10} {'distance':>9}  within 10%")
for name, p, g, d in rows:
    print(f"{name:44} {p:10.1f} {g:10.1f} {d*100:+8.1f}%  {'yes' if abs(d) <= 0.10 else 'NO'}")
json.dump({"datapath": dp, "throughput_ops": {"provider": bp, "go_client": bg},
           "latency_us": {"provider": lp, "go_client": lg}}, open("bench/dapl.json", "w"), indent=1)
EOF
