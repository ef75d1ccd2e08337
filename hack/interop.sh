#!/usr/bin/env bash
# make interop: softrnic (kernel and xdp datapaths) against Linux's own
# soft-iWARP (siw), in a QEMU guest
# built from Debian packages (../shared/interop/siw-guest). For each scenario
# one guest boots and runs rdma-core's rping against softrnic-ping, in both
# roles, with siw's CRC off and required, ours asked or not, MPA revision 2
# and 1 (siw initiating), peer-to-peer with the Write and the Read RTR; then
# perftest -R in both roles; then rping with 65,535-octet buffers 1040 times
# (65 MiB read and written back, verified), both roles and datapaths. The
# MPA stream of every run is captured and decoded by softrnic-dump and by
# tshark (see check_capture): every FPDU decoded, with CRC every CRC good,
# and the MPA mode (revision, peer-to-peer RTR) the row's name claims. Then
# Debian's own rping, perftest, qperf, fio and librdmacm's examples (ucmatose,
# rdma_server, rdma_xserver, cmtime) over our libibverbs and librdmacm against
# the same binaries over siw, and Debian's dtest and dapltest over our uDAPL
# provider against siw with Debian's libdaplofa, both datapaths and both
# roles (hack/interop-verbs.sh, hack/interop-dapl.sh).
# Ends with a pass/fail table; exit 1 if any failed.
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH=$PATH:/usr/local/go/bin
GUEST=${SIW_GUEST:-$(cd .. && pwd)/shared/interop/siw-guest}
PORT=27174
[ "$(id -u)" = 0 ] || { echo "interop: needs root (the guest build uses debootstrap)" >&2; exit 1; }
[ -x "$GUEST/run.sh" ] || { echo "interop: no siw guest at $GUEST" >&2; exit 1; }
bash hack/deps.sh test >/dev/null

work=$(mktemp -d /tmp/softrnic-interop.XXXXXX)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	[ -n "${KEEP:-}" ] || rm -rf "$work"
}
trap cleanup EXIT

# wait_socket SOCK WHAT LOG: waits for a daemon's socket; if it never
# appears, says WHAT did not start and shows the daemon's LOG.
wait_socket() {
	for _ in $(seq 100); do [ -S "$1" ] && return 0; sleep 0.05; done
	echo "interop: $2 did not start" >&2
	cat "$3" >&2
	return 1
}

echo "== building the siw guest (cached after the first time)"
bash "$GUEST/build.sh" > "$work/build.log" 2>&1 || { tail -20 "$work/build.log"; exit 1; }
echo "== building softrnic"
go build -o "$work/" ./cmd/softrnicd ./cmd/softrnic-ping ./cmd/softrnic-dump || exit 1
"$work/softrnicd" --iface lo --socket "$work/d.sock" --log-level warn 2> "$work/daemon.log" &
pids+=($!)
wait_socket "$work/d.sock" softrnicd "$work/daemon.log" || exit 1

TS=(tshark --enable-heuristic iwarp_mpa_tcp -o tcp.try_heuristic_first:TRUE
	--disable-heuristic rpcrdma_iwarp --disable-heuristic smb_direct_iwarp)

# check_capture FILE CRC [MODE...]: decodes the capture with two independent
# decoders. softrnic-dump reassembles each TCP stream and frames, CRC-checks
# and validates every FPDU with our own code (any problem, a CRC setting
# other than CRC, or an MPA mode other than MODE, its --rev and --p2p flags,
# fails), then writes the same octets again one startup frame or
# FPDU per TCP segment. tshark dissects that file: every TCP payload must be
# a dissected MPA PDU, it must find as many FPDUs as softrnic-dump, and with
# CRC every CRC must be good (without, none checked). The rewrite is needed
# because QEMU's user-mode network re-chunks siw's stream and Wireshark's MPA
# dissector cannot reassemble FPDUs spread over segments: how many segments
# of the raw capture it leaves undissected is shown as "raw".
check_capture() {
	local pcap=$1 crc=$2 norm=${1%.pcap}.norm.pcap dump=${1%.pcap}.dump
	shift 2
	local ours fpdus undissected bad good raw
	if ! "$work/softrnic-dump" --crc "$crc" "$@" -w "$norm" "$pcap" > "$dump" 2>&1; then
		echo "softrnic-dump: $(grep -m1 PROBLEM "$dump" || tail -1 "$dump")"
		return 1
	fi
	ours=$(tail -1 "$dump" | sed -n 's/.* \([0-9]*\) FPDUs, .*/\1/p')
	fpdus=$("${TS[@]}" -r "$norm" -Y iwarp_mpa.fpdu 2>/dev/null | wc -l)
	undissected=$("${TS[@]}" -r "$norm" -Y 'tcp.len > 0 && !iwarp_mpa' 2>/dev/null | wc -l)
	"${TS[@]}" -r "$norm" -V > "${norm%.pcap}.txt" 2>/dev/null
	good=$(grep -c '(Good CRC32' "${norm%.pcap}.txt")
	bad=$(grep -c '(Bad CRC32' "${norm%.pcap}.txt")
	raw=$("${TS[@]}" -r "$pcap" -Y 'tcp.len > 0 && !iwarp_mpa && !tcp.reassembled_in' 2>/dev/null | wc -l)
	echo "ours $ours FPDUs ok; tshark $fpdus FPDUs, $undissected undissected, CRC good $good bad $bad (raw $raw)"
	[ "$fpdus" -gt 0 ] && [ "$fpdus" = "$ours" ] && [ "$undissected" = 0 ] && [ "$bad" = 0 ] || return 1
	if [ "$crc" = on ]; then [ "$good" = "$fpdus" ] || return 1; else [ "$good" = 0 ] || return 1; fi
}

# siw_server_verdict LOG RC: the rping server in the guest (LOG: run.sh's
# output, RC: its exit code) printed all five pings, and exited 0 or lost
# only rping's own teardown race: after a clean DISCONNECT its CM thread
# reads a destroyed event channel and exits 255. The pings all completed,
# so that is not held against the peer; the log says it was tolerated.
siw_server_verdict() {
	local log=$1 rc=$2 console
	console=$(grep -o '/tmp/siw-guest-[^ ]*\.log' "$log" | head -1)
	[ "$(grep -c 'server ping data: rdma-ping-' "$console")" -ge 5 ] || return 1
	[ "$rc" = 0 ] && return 0
	grep -q "server DISCONNECT EVENT" "$console" && grep -q "rdma_get_cm_event: Bad file descriptor" "$console" || return 1
	sed -i 's/rping rc=255/rping rc=0 (teardown race tolerated)/' "$log"
}

# check_large FILE CRC MODE...: check_capture for a capture of many
# megabytes: softrnic-dump decodes and checks every FPDU and the mode, and
# tshark, whose verbose passes would take minutes, dissects the first 20,000
# frames of the re-cut capture: every payload an MPA PDU, CRCs good.
check_large() {
	local pcap=$1 crc=$2 norm=${1%.pcap}.norm.pcap dump=${1%.pcap}.dump head=${1%.pcap}.head.pcap
	shift 2
	local ours undissected bad good
	if ! "$work/softrnic-dump" --crc "$crc" "$@" -w "$norm" "$pcap" > "$dump" 2>&1; then
		echo "softrnic-dump: $(grep -m1 PROBLEM "$dump" || tail -1 "$dump")"
		return 1
	fi
	ours=$(tail -1 "$dump" | sed -n 's/.* \([0-9]*\) FPDUs, .*/\1/p')
	"${TS[@]}" -r "$norm" -c 20000 -w "$head" 2>/dev/null
	undissected=$("${TS[@]}" -r "$head" -Y 'tcp.len > 0 && !iwarp_mpa' 2>/dev/null | wc -l)
	"${TS[@]}" -r "$head" -V > "${head%.pcap}.txt" 2>/dev/null
	good=$(grep -c '(Good CRC32' "${head%.pcap}.txt")
	bad=$(grep -c '(Bad CRC32' "${head%.pcap}.txt")
	rm -f "$norm" "$head" "${head%.pcap}.txt"
	echo "ours $ours FPDUs ok, $(($(stat -c %s "$pcap") >> 20)) MiB; tshark on the first 20000 frames: $undissected undissected, CRC good $good bad $bad"
	[ "${ours:-0}" -gt 0 ] && [ "$undissected" = 0 ] && [ "$bad" = 0 ] || return 1
	if [ "$crc" = on ]; then [ "$good" -gt 0 ] || return 1; else [ "$good" = 0 ] || return 1; fi
}

results=()
# report LABEL CRC GUESTLINES OURLINES: the end of every scenario function,
# which calls it with its locals ok, role, pcap, log (the guest's), plog
# (ours) and, on the xdp datapath, dlog (the daemon's) set, and optionally
# note (why the scenario failed), mode (the softrnic-dump flags of the MPA
# mode its name claims, as an array) and check (check_large for a large
# capture). Checks the capture, adds the result row (noting rping's
# tolerated teardown race) and prints it; on failure shows the logs' last
# lines.
report() {
	local label=$1 crc=$2 detail
	local -a want=()
	[ -n "${mode:-}" ] && read -ra want <<< "$mode"
	detail=$("${check:-check_capture}" "$pcap" "$crc" "${want[@]}") || ok=FAIL
	[ -n "${note:-}" ] && detail="$note; $detail"
	grep -q "teardown race tolerated" "$log" && detail+=" (rping teardown race tolerated)"
	results+=("$(printf '%-4s  %-34s %-10s %-4s %s' "$ok" "$label" "$role" "$crc" "$detail")")
	echo "${results[-1]}"
	[ "$ok" = PASS ] && return
	echo "---- $log"; grep IWGUEST "$log" | tail -"$3"
	echo "---- $plog"; tail -"$4" "$plog"
	if [ -n "${dlog:-}" ]; then echo "---- $dlog"; tail -5 "$dlog"; fi
}

scenario() {
	local name=$1 role=$2 siwopts=$3 ours=$4 crc=$5 mode=$6
	if [ -n "${ONLY:-}" ] && [[ "$name" != *$ONLY* ]]; then return; fi
	local pcap="$work/$name.pcap" log="$work/$name.guest" plog="$work/$name.ping" ok=PASS
	tcpdump -i lo -B 32768 -w "$pcap" -U --immediate-mode -s 0 "tcp port $PORT" 2> "$work/$name.tcpdump" &
	local tpid=$!
	for _ in $(seq 100); do grep -q listening "$work/$name.tcpdump" && break; sleep 0.05; done
	local opts=()
	[ -n "$siwopts" ] && opts=(--siwopts "$siwopts")
	if [ "$role" = siw-server ]; then
		bash "$GUEST/run.sh" --mode rping-server --hostfwd "$PORT:7174" --timeout 120 "${opts[@]}" > "$log" 2>&1 &
		local gpid=$!
		for _ in $(seq 120); do grep -q "rping listening" "$log" && break; sleep 0.5; done
		timeout 60 "$work/softrnic-ping" -c -a 127.0.0.1 -p "$PORT" -C 5 -S 64 -v -V $ours --socket "$work/d.sock" > "$plog" 2>&1 || ok=FAIL
		wait "$gpid"
		siw_server_verdict "$log" $? || ok=FAIL
	else
		timeout 150 "$work/softrnic-ping" -s -p "$PORT" -v $ours --socket "$work/d.sock" > "$plog" 2>&1 &
		local spid=$!
		sleep 0.3
		bash "$GUEST/run.sh" --mode rping-client --guestfwd "10.0.2.100:7174-$PORT" --peer 10.0.2.100 --timeout 120 "${opts[@]}" > "$log" 2>&1 || ok=FAIL
		wait "$spid" || ok=FAIL
	fi
	grep -q "rping rc=0" "$log" || ok=FAIL
	[ "$(grep -c 'ping data: rdma-ping-' "$plog")" -ge 5 ] || ok=FAIL
	sleep 0.5
	kill -INT "$tpid" 2>/dev/null; wait "$tpid" 2>/dev/null
	report "$name" "$crc" 8 5
}

# The MPA variants, each row's capture held to the mode its name claims
# (softrnic-dump --rev, --p2p). siw applies its mpa_version and
# peer_to_peer parameters only as initiator (siw-client); as responder it
# answers what the Request asks. So revision 1 runs only with siw
# initiating: softrnic-ping --mpa-rev 1 against siw as responder meets a
# siw bug (docs/interop.md), and a "v1" row with siw as server would run
# revision 2. Peer-to-peer with each RTR a Linux peer takes, Write and
# Read, in both roles: softrnic-ping offers (client) or accepts (server)
# only that RTR, and siw as initiator (peer_to_peer=1) offers both.
rping_rows() { # ROLE: the rping rows of one role; $1 is scenario or xdp_scenario
	local run=$1 role=$2 p2psiw=""
	[ "$role" = siw-client ] && p2psiw="peer_to_peer=1"
	for rtr in write read; do
		"$run" "p2p-$rtr-rtr-$role" "$role" "$p2psiw" "--p2p --rtr $rtr" on "--rev 2 --p2p $rtr"
	done
}
echo "== rping: softrnic-ping against Linux siw"
for role in siw-server siw-client; do
	scenario "v2-crc-off-$role" "$role" "" "--no-crc" off "--rev 2 --p2p off"
	# siw enforces mpa_crc_required only as initiator: as responder it
	# turns CRC on only when the Request asks (siw_proc_mpareq).
	required=on
	[ "$role" = siw-server ] && required=off
	scenario "v2-crc-required-by-siw-$role" "$role" "mpa_crc_required=1" "--no-crc" "$required" "--rev 2 --p2p off"
	scenario "v2-crc-asked-by-softrnic-$role" "$role" "" "" on "--rev 2 --p2p off"
	if [ "$role" = siw-client ]; then
		scenario "v1-crc-off-$role" "$role" "mpa_version=1" "--no-crc" off "--rev 1"
		scenario "v1-crc-asked-by-softrnic-$role" "$role" "mpa_version=1" "" on "--rev 1"
	fi
	rping_rows scenario "$role"
done

# perftest -R against softrnic-perf --perftest, both roles: the guest runs
# ib_write_bw, ib_send_bw, ib_read_bw, ib_read_lat and ib_write_lat one after
# the other (4096 B, 50 iterations). softrnic-perf speaks write_bw, send_bw
# (with perftest's iWARP credits), read_bw and read_lat; for ib_write_lat it
# leaves at once (as client) or does not listen (as server): its server
# writes first, which RFC 5044 forbids an MPA responder.
PT_TESTS="write_bw send_bw read_bw read_lat write_lat"
PT_SPOKEN="write_bw send_bw read_bw read_lat"
perftest_scenario() {
	local role=$1 name="perftest-$1" ok=PASS mode="--rev 2 --p2p off"
	if [ -n "${ONLY:-}" ] && [[ "$name" != *$ONLY* ]]; then return; fi
	local pcap="$work/$name.pcap" log="$work/$name.guest" plog="$work/$name.perf"
	tcpdump -i lo -B 32768 -w "$pcap" -U --immediate-mode -s 0 "tcp portrange 28515-28519" 2> "$work/$name.tcpdump" &
	local tpid=$!
	for _ in $(seq 100); do grep -q listening "$work/$name.tcpdump" && break; sleep 0.05; done
	: > "$plog"
	local i=0 t
	if [ "$role" = siw-server ]; then
		local fwd=()
		for p in 18515 18516 18517 18518 18519; do fwd+=(--hostfwd "$((p + 10000)):$p"); done
		bash "$GUEST/run.sh" --mode perf-server "${fwd[@]}" --size 4096 --iters 50 --timeout 170 > "$log" 2>&1 &
		local gpid=$!
		for t in $PT_TESTS; do
			for _ in $(seq 120); do grep -q "ib_$t listening" "$log" && break; sleep 0.5; done
			if timeout 60 "$work/softrnic-perf" "$t" --perftest -s 4096 -n 50 --socket "$work/d.sock" "127.0.0.1:$((28515 + i))" >> "$plog" 2>&1; then
				[[ " $PT_SPOKEN " == *" $t "* ]] || ok=FAIL
			else
				[[ " $PT_SPOKEN " != *" $t "* ]] || ok=FAIL
			fi
			i=$((i + 1))
		done
		wait "$gpid"
	else
		local spids=() fwd=()
		for t in $PT_TESTS; do
			if [[ " $PT_SPOKEN " == *" $t "* ]]; then
				timeout 170 "$work/softrnic-perf" "$t" --perftest -s 4096 -n 50 -p "$((28515 + i))" --socket "$work/d.sock" >> "$plog" 2>&1 &
				spids+=($!)
				fwd+=(--guestfwd "10.0.2.100:$((18515 + i))-$((28515 + i))")
			fi
			i=$((i + 1))
		done
		sleep 0.5
		bash "$GUEST/run.sh" --mode perf-client "${fwd[@]}" --peer 10.0.2.100 --size 4096 --iters 50 --timeout 170 > "$log" 2>&1
		for p in "${spids[@]}"; do wait "$p" || ok=FAIL; done
	fi
	for t in $PT_SPOKEN; do grep -q "ib_$t rc=0" "$log" || ok=FAIL; done
	sleep 0.5
	kill -INT "$tpid" 2>/dev/null; wait "$tpid" 2>/dev/null
	report "$name wbw+sbw+rbw+rlat" on 12 12
}
echo "== perftest -R: softrnic-perf against Linux siw"
go build -o "$work/" ./cmd/softrnic-perf || exit 1
perftest_scenario siw-server
perftest_scenario siw-client

# The xdp datapath: the guest's NIC is a tap in a namespace of ours
# (run.sh --net tap), and a softrnicd --datapath xdp attaches to that tap,
# so siw talks to softrnic's own TCP engine over AF_XDP. The tap exists only
# while its guest runs: each scenario starts the guest, waits for the tap,
# then starts the daemon on it, and stops the daemon before the guest ends.
# XDP takes the frames before any packet socket sees them, so the capture is
# QEMU's (--pcap: every frame of the guest's NIC).
NS=srnsiw$$
TAP=siwtap0
ip netns add "$NS" || exit 1
ip -n "$NS" link set lo up
trap 'cleanup; ip netns del "$NS" 2>/dev/null' EXIT
xdp_daemon() { # starts the daemon on the tap once it exists
	local log=$1
	for _ in $(seq 300); do ip -n "$NS" link show dev "$TAP" >/dev/null 2>&1 && break; sleep 0.1; done
	sleep 0.2 # the address
	rm -f "$work/x.sock"
	ip netns exec "$NS" "$work/softrnicd" --iface "$TAP" --datapath xdp --socket "$work/x.sock" --log-level warn 2> "$log" &
	XPID=$!
	pids+=($XPID)
	wait_socket "$work/x.sock" "softrnicd --datapath xdp on $TAP" "$log"
}
xdp_stop() { kill -TERM "$XPID" 2>/dev/null; wait "$XPID" 2>/dev/null; }
tapnet=(--net tap --netns "$NS" --tap "$TAP" --tap-ip 10.79.0.1/24 --ip 10.79.0.2/24)
xdp_scenario() {
	local name=xdp-$1 role=$2 siwopts=$3 ours=$4 crc=$5 mode=$6 ok=PASS
	local opts=()
	[ -n "$siwopts" ] && opts=(--siwopts "$siwopts")
	if [ -n "${ONLY:-}" ] && [[ "$name" != *$ONLY* ]]; then return; fi
	local pcap="$work/$name.pcap" log="$work/$name.guest" plog="$work/$name.ping" dlog="$work/$name.daemon"
	if [ "$role" = siw-server ]; then
		bash "$GUEST/run.sh" --mode rping-server "${tapnet[@]}" "${opts[@]}" --pcap "$pcap" --timeout 120 > "$log" 2>&1 &
		local gpid=$!
		xdp_daemon "$dlog" || ok=FAIL
		for _ in $(seq 120); do grep -q "rping listening" "$log" && break; sleep 0.5; done
		ip netns exec "$NS" timeout 60 "$work/softrnic-ping" -c -a 10.79.0.2 -p 7174 -C 5 -S 64 -v -V $ours --socket "$work/x.sock" > "$plog" 2>&1 || ok=FAIL
		xdp_stop
		wait "$gpid"
		siw_server_verdict "$log" $? || ok=FAIL
	else
		bash "$GUEST/run.sh" --mode rping-client "${tapnet[@]}" "${opts[@]}" --peer 10.79.0.1 --pcap "$pcap" --timeout 120 > "$log" 2>&1 &
		local gpid=$!
		xdp_daemon "$dlog" || ok=FAIL
		ip netns exec "$NS" timeout 150 "$work/softrnic-ping" -s -a 10.79.0.1 -p 7174 -v $ours --socket "$work/x.sock" > "$plog" 2>&1 || ok=FAIL
		xdp_stop
		wait "$gpid" || ok=FAIL
	fi
	grep -q "rping rc=0" "$log" || ok=FAIL
	[ "$(grep -c 'ping data: rdma-ping-' "$plog")" -ge 5 ] || ok=FAIL
	report "$name" "$crc" 8 5
}
xdp_perftest() {
	local role=$1 name="xdp-perftest-$1" ok=PASS mode="--rev 2 --p2p off"
	if [ -n "${ONLY:-}" ] && [[ "$name" != *$ONLY* ]]; then return; fi
	local pcap="$work/$name.pcap" log="$work/$name.guest" plog="$work/$name.perf" dlog="$work/$name.daemon"
	: > "$plog"
	local i=0 t
	if [ "$role" = siw-server ]; then
		bash "$GUEST/run.sh" --mode perf-server "${tapnet[@]}" --pcap "$pcap" --size 4096 --iters 50 --timeout 170 > "$log" 2>&1 &
		local gpid=$!
		xdp_daemon "$dlog" || ok=FAIL
		for t in $PT_TESTS; do
			for _ in $(seq 120); do grep -q "ib_$t listening" "$log" && break; sleep 0.5; done
			if ip netns exec "$NS" timeout 60 "$work/softrnic-perf" "$t" --perftest -s 4096 -n 50 --socket "$work/x.sock" "10.79.0.2:$((18515 + i))" >> "$plog" 2>&1; then
				[[ " $PT_SPOKEN " == *" $t "* ]] || ok=FAIL
			else
				[[ " $PT_SPOKEN " != *" $t "* ]] || ok=FAIL
			fi
			i=$((i + 1))
		done
		xdp_stop
		wait "$gpid"
	else
		bash "$GUEST/run.sh" --mode perf-client "${tapnet[@]}" --peer 10.79.0.1 --pcap "$pcap" --size 4096 --iters 50 --timeout 170 > "$log" 2>&1 &
		local gpid=$!
		xdp_daemon "$dlog" || ok=FAIL
		local spids=()
		for t in $PT_TESTS; do
			if [[ " $PT_SPOKEN " == *" $t "* ]]; then
				ip netns exec "$NS" timeout 170 "$work/softrnic-perf" "$t" --perftest -s 4096 -n 50 -p "$((18515 + i))" --socket "$work/x.sock" >> "$plog" 2>&1 &
				spids+=($!)
			fi
			i=$((i + 1))
		done
		wait "$gpid"
		for p in "${spids[@]}"; do wait "$p" || ok=FAIL; done
		xdp_stop
	fi
	for t in $PT_SPOKEN; do grep -q "ib_$t rc=0" "$log" || ok=FAIL; done
	report "$name wbw+sbw+rbw+rlat" on 12 12
}
echo "== the xdp datapath against Linux siw (guest on a tap in namespace $NS)"
for role in siw-server siw-client; do
	xdp_scenario "v2-crc-asked-by-softrnic-$role" "$role" "" "" on "--rev 2 --p2p off"
	[ "$role" = siw-client ] && xdp_scenario "v1-crc-off-$role" "$role" "mpa_version=1" "--no-crc" off "--rev 1"
	rping_rows xdp_scenario "$role"
done
xdp_perftest siw-server
xdp_perftest siw-client

# Large transfers: rping at its largest
# buffer, 65,535 octets, LARGE_PINGS times with -V, so that the server RDMA
# Reads 65 MiB from the client and RDMA Writes them back, and the client
# checks every ping (siw's rping -V, or softrnic-ping's -V). The guest's
# modes run rping with -C 5 and its default 64-octet buffer, so these rows
# boot it in shell mode and type the command into its console (siw_shell).
LARGE_PINGS=${LARGE_PINGS:-1040}
LARGE_SIZE=65535

# siw_shell_start LOG RUNARGS...: boots a guest in run.sh's shell mode with
# RUNARGS, its console in LOG; returns once its shell is up, with the
# guest's pid in SHPID and its console's input on descriptor SHFD.
siw_shell_start() {
	local log=$1 fifo="$work/shell.fifo"
	shift
	rm -f "$fifo"
	mkfifo "$fifo" || return 1
	bash "$GUEST/run.sh" --mode shell "$@" < "$fifo" > "$log" 2>&1 &
	SHPID=$!
	pids+=("$SHPID")
	exec {SHFD}> "$fifo"
	rm -f "$fifo"
	for _ in $(seq 900); do
		grep -q 'IWGUEST: shell on ttyS0' "$log" && return 0
		kill -0 "$SHPID" 2>/dev/null || return 1
		sleep 0.2
	done
	return 1
}
# siw_shell_run CMD: types CMD, then the line that reports its exit status
# and leaves the shell (the guest powers off). The console echoes what is
# typed, so every marker CMD prints is written as two words: the echo
# shows them quoted apart and never matches.
siw_shell_run() {
	# in a subshell that ignores SIGPIPE: a guest gone meanwhile fails
	# the row, not this script
	(
		trap '' PIPE
		printf '%s\necho "IWGUEST: cmd" "rc=$?"; exit\n' "$1" >&"$SHFD"
	) 2> /dev/null || true
}
# siw_shell_end waits for the guest to power off.
siw_shell_end() {
	wait "$SHPID"
	exec {SHFD}>&-
}
# wait_line FILE TEXT SECS: waits for TEXT in FILE.
wait_line() {
	for _ in $(seq $(($3 * 5))); do grep -q "$2" "$1" && return 0; sleep 0.2; done
	return 1
}

large_scenario() { # DATAPATH ROLE
	local dp=$1 role=$2 name="large-rping-$LARGE_PINGS-x-$LARGE_SIZE-$2" ok=PASS
	local mode="--rev 2 --p2p off" check=check_large
	[ "$dp" = xdp ] && name="xdp-$name"
	if [ -n "${ONLY:-}" ] && [[ "$name" != *$ONLY* ]]; then return; fi
	local pcap="$work/$name.pcap" log="$work/$name.guest" plog="$work/$name.ping" dlog="" tpid="" spid=""
	local net=() sock="$work/d.sock" gaddr=127.0.0.1 gport=$PORT peer=10.0.2.100 inns=()
	local ping=("$work/softrnic-ping" -S "$LARGE_SIZE" -V --timeout 600s)
	if [ "$dp" = xdp ]; then
		dlog="$work/$name.daemon" sock="$work/x.sock" gaddr=10.79.0.2 gport=7174 peer=10.79.0.1
		net=("${tapnet[@]}" --pcap "$pcap") inns=(ip netns exec "$NS")
	else
		tcpdump -i lo -B 65536 -w "$pcap" -U -s 0 "tcp port $PORT" 2> "$work/$name.tcpdump" &
		tpid=$!
		wait_line "$work/$name.tcpdump" listening 10
		if [ "$role" = siw-server ]; then net=(--hostfwd "$PORT:7174"); else net=(--guestfwd "10.0.2.100:7174-$PORT"); fi
	fi
	local t0=$SECONDS up=1
	siw_shell_start "$log" "${net[@]}" --timeout 900 || { ok=FAIL up=0 note="the guest's shell did not start"; }
	[ "$dp" = xdp ] && { xdp_daemon "$dlog" || ok=FAIL; }
	if [ "$up" = 0 ]; then
		# nothing reads the console: typing into it would kill this
		# script with SIGPIPE
		kill "$SHPID" 2>/dev/null
		wait "$SHPID" 2>/dev/null
		exec {SHFD}>&-
	elif [ "$role" = siw-server ]; then
		siw_shell_run "rping -s -a 0.0.0.0 -p 7174 -V -C $LARGE_PINGS -S $LARGE_SIZE & p=\$!; until ss -Hltn 'sport = :7174' | grep -q .; do sleep 0.2; done; echo 'IWGUEST: rping' listening; wait \$p"
		wait_line "$log" 'IWGUEST: rping listening' 120 || ok=FAIL
		"${inns[@]}" timeout 700 "${ping[@]}" -c -a "$gaddr" -p "$gport" -C "$LARGE_PINGS" --socket "$sock" > "$plog" 2>&1 || ok=FAIL
	else
		"${inns[@]}" timeout 700 "${ping[@]}" -s -a "${peer/10.0.2.100/127.0.0.1}" -p "$gport" --socket "$sock" > "$plog" 2>&1 &
		spid=$!
		sleep 0.5
		siw_shell_run "for i in \$(seq 60); do ping -c1 -W1 $peer >/dev/null 2>&1 && break; ip neigh show $peer | grep -q lladdr && break; sleep 1; done; rping -c -a $peer -p 7174 -V -C $LARGE_PINGS -S $LARGE_SIZE"
	fi
	[ "$up" = 1 ] && siw_shell_end
	[ -n "$spid" ] && { wait "$spid" || ok=FAIL; }
	[ "$dp" = xdp ] && xdp_stop
	if ! grep -q 'IWGUEST: cmd rc=0' "$log"; then
		# rping's own teardown race, as siw_server_verdict tolerates it.
		if [ "$role" = siw-server ] && grep -q 'IWGUEST: cmd rc=255' "$log" && grep -q "server DISCONNECT EVENT" "$log" &&
			grep -q "rdma_get_cm_event: Bad file descriptor" "$log"; then
			note="rping teardown race tolerated"
		else
			ok=FAIL
		fi
	fi
	[ -n "$tpid" ] && { sleep 0.5; kill -INT "$tpid" 2>/dev/null; wait "$tpid" 2>/dev/null; }
	note="${note:+$note; }$((SECONDS - t0)) s"
	report "$name" on 12 8
	unset note
}
# One row per datapath, the roles crossed: the kernel datapath with siw as
# server (24 s here), the xdp datapath with siw as client (24 s). The other
# two pass as well (LARGE_ALL=1 runs all four): 16 s on xdp, but 111 s on
# the kernel datapath with siw as client, about 107 ms a ping against 15 to
# 23 ms in the others; only there does the guest's connection go through
# QEMU's guestfwd relay (a socat), which is where we suspect it goes.
echo "== large transfers: rping -S $LARGE_SIZE -C $LARGE_PINGS -V against Linux siw, both datapaths"
large_scenario kernel siw-server
large_scenario xdp siw-client
if [ -n "${LARGE_ALL:-}" ]; then
	large_scenario kernel siw-client
	large_scenario xdp siw-server
fi

# Debian's rping, perftest, qperf, fio and librdmacm's examples over our
# libibverbs and librdmacm against the same over siw, both roles, one guest
# boot per datapath.
# shellcheck source=hack/interop-verbs.sh
. hack/interop-verbs.sh

# uDAPL: dtest and dapltest against libdaplofa on siw, both datapaths (the
# guest on a tap, each boot in a namespace of its own).
# shellcheck source=hack/interop-dapl.sh
. hack/interop-dapl.sh

echo
echo "== interop results (softrnic kernel and xdp datapaths vs Linux siw; rping -C 5 -S 64 -V; perftest -R -s 4096 -n 50; verbs: Debian's rping, perftest, qperf -cm1 rc_lat, fio --ioengine=rdma, ucmatose, rdma_server, rdma_xserver, cmtime over our libibverbs, librdmacm; dapl: dtest, dapltest over libdaplsoftrnic vs libdaplofa)"
printf '%-4s  %-34s %-10s %-4s %s\n' result scenario peer crc capture
failed=0
for r in "${results[@]}"; do
	echo "$r"
	case "$r" in FAIL*) failed=$((failed + 1)) ;; esac
done
echo "$((${#results[@]} - failed)) passed, $failed failed"
[ "$failed" = 0 ]
