# hack/interop-dapl.sh: the uDAPL part of make interop, sourced by
# hack/interop.sh (which provides work, GUEST, TAP, pids, report,
# check_capture and wait_socket). Debian's unmodified dtest and dapltest run
# between softrnic (libdaplsoftrnic.so.2 over softrnicd, kernel and xdp
# datapaths) and Linux siw with Debian's libdaplofa in the QEMU guest, in
# both roles.
#
# Topology: the guest's NIC is a tap in a namespace of ours (run.sh --net
# tap), 10.79.0.2 in the guest, 10.79.0.1 on the tap, and softrnicd serves
# the tap with either datapath: dtest's side channel (TCP 15828) needs each
# side's IA address to be routable from the other, which QEMU's user-mode
# NAT does not give. Each boot has a fresh namespace, so that no boot
# depends on what an earlier one left behind (TIME_WAIT sockets on the
# ports the kernel datapath served: the xdp datapath's port reservation
# refused such ports until 9eb4dc6). The guest learns uDAPL from an initramfs overlay
# (hack/siw-dapl/overlay.sh: libdapl2 and dapl2-utils of the guest's suite,
# a dat.conf naming libdaplofa on eth0 "softrnic0" like our side, and an
# init hook) plus a small cpio holding the boot's job (/dapl/job), appended
# to the guest's initramfs and booted with run.sh --initrd.
#
# One guest boot per datapath and role runs, in order, dtest, two dapltest
# transaction tests (-T T), two performance tests (-T P) and the quit
# command (-T Q); each is a row of the table. Two of the boots (kernel
# datapath with siw as server, xdp with siw as client) also run a large
# transaction test, 65 MiB of 64 KiB Sends each way (dapl_runs). A row passes when both sides'
# output shows no failure marker and has its success markers (neither
# program's exit status means anything), and the MPA stream of the row's
# connections (QEMU's capture of the guest NIC, split at each dtest or
# dapltest control connection) passes check_capture with CRC on: softrnic's
# provider always asks for CRC.
#
# siw's parameters: where siw is the initiator (siw-client) it runs with
# peer_to_peer=1. Our provider asks every EP for MPA peer-to-peer mode, but
# as responder it can only use it if the initiator offers it; a plain RFC
# 5044 initiator must send first, and dapltest's performance server sends
# its first message before its client does, so without peer_to_peer a
# softrnic responder rightly waits for the first FPDU (RFC 5044 §7.1.2) and
# -T P never starts. With it siw sends an RTR (zero-length RDMA Write) at
# once. Where siw is the responder (siw-server) its defaults are kept: siw
# honours the peer-to-peer mode our initiator asks for whatever its own
# parameter says (siw_proc_mpareq).
#
# dtest's own race, seen only with a slow server: its server sends the side
# channel message first and creates its PSP (listens on 45248) afterwards,
# and a fast client that connects in between is refused. Under TCG the siw
# server takes long enough for that every time, so our client reaches the
# side channel through a relay on 127.0.0.1:15828 that holds the server's
# message back until siw listens on 45248 (the guest prints when).

DAPL_IA=softrnic0
DAPL_GIP=10.79.0.2
DAPL_HIP=10.79.0.1
# dtest: 16 KiB buffers, bursts of 100 RDMA Writes each way (the default
# 4 MiB x 1000 would take hours under TCG).
DAPL_DTEST=(dtest -P "$DAPL_IA" -b 16384 -B 100)
DAPL_BASE_RUNS="dtest T1 T2 P1 P2 Q"
# The large Send run (make interop's large rping rows cover RDMA Read and
# Write): 1040 exchanges of 64 KiB Sends each way, 65 MiB each way, every
# message's contents checked by dapltest's transaction test (-V: barrier
# Sends after each iteration, then both sides compare their buffers). One boot per
# datapath runs it, the roles crossed as for rping: kernel with siw as
# server, xdp with siw as client.
dapl_runs() { # DATAPATH ROLE
	case $1-$2 in
	kernel-siw-server | xdp-siw-client) echo "dtest T1 T2 T3 P1 P2 Q" ;;
	*) echo "$DAPL_BASE_RUNS" ;;
	esac
}
declare -A DAPL_ROW=([dtest]=dtest [T1]=dapltest-T-1seg [T2]=dapltest-T-multiseg [T3]=dapltest-T-large-SR-1040x64KiB
	[P1]=dapltest-P-RW [P2]=dapltest-P-RR [Q]=dapltest-Q)

# dapl_args RUN ROLE: dapltest's arguments after -s HOST -D NAME. siw's RDMA
# Read takes one sink segment only (siw_post_send: num_sge != 1 is EINVAL;
# libdaplofa says max_iov_segments_per_rdma_read = 1), so the multi-segment
# Read is posted by whichever side is softrnic.
dapl_args() {
	local rr
	case $1 in
	T1) echo "-i 200 -t 1 -w 1 client SR 256 server SR 256 client RW 4096 1 server RW 4096 1 client RR 4096 1 server RR 4096 1" ;;
	T2)
		if [ "$2" = siw-server ]; then rr="client RR 2048 4 server RR 1024 1"; else rr="server RR 2048 4 client RR 1024 1"; fi
		echo "-i 100 -t 1 -w 2 client SR 1024 3 server SR 256 4 client RW 4096 2 server RW 2048 4 $rr" ;;
	T3) echo "-i 1040 -t 1 -w 1 -V client SR 65536 1 server SR 65536 1" ;;
	P1) echo "-i 512 -m b RW 4096 2" ;;
	P2) echo "-i 512 -m b RR 8192 1" ;;
	Q) echo "" ;;
	esac
}
dapl_type() { case $1 in T*) echo T ;; P*) echo P ;; Q) echo Q ;; esac; }

# dapl_setup: the overlay, the provider and our side's dat.conf, once.
dapl_setup() {
	local t
	for t in dtest dapltest stdbuf socat tcpdump; do
		command -v "$t" >/dev/null || { echo "interop: dapl scenarios need $t" >&2; return 1; }
	done
	DAPL_OVERLAY=$(bash hack/siw-dapl/overlay.sh "$GUEST") || return 1
	go build -buildmode=c-shared -o "$work/libdaplsoftrnic.so.2" ./dapl || return 1
	printf '%s u2.0 nonthreadsafe default %s dapl.2.0 "%s %s" ""\n' \
		"$DAPL_IA" "$work/libdaplsoftrnic.so.2" "$TAP" "$work/dapl.sock" > "$work/dapl.conf"
}

# dapl_ours SECONDS COMMAND...: a DAT program on our side, in the boot's
# namespace with our dat.conf, line-buffered and bounded. Started in the
# background, its pid is timeout's (ip netns exec and env exec), so that
# killing it ends the program.
dapl_ours() {
	local s=$1
	shift
	exec ip netns exec "$DAPL_NS" env DAT_OVERRIDE="$work/dapl.conf" timeout "$s" stdbuf -oL -eL "$@"
}

# dapl_job ROLE FILE: the guest's job for a boot.
dapl_job() {
	local role=$1 file=$2 r
	{
		echo "# dapl interop, siw is the $role"
		echo ". /dapl/lib.sh"
		if [ "$role" = siw-server ]; then
			echo "dapl_server dtest 15828 150 ${DAPL_DTEST[*]} -s"
			echo "dapl_listening dtest-psp 45248 150 &"
			echo "dapl_server dapltest 62000 200 dapltest -T S -D $DAPL_IA"
		else
			# Our servers are up before the guest has booted.
			echo "wait_peer"
			echo "dapl_run dtest 90 client ${DAPL_DTEST[*]} -h $DAPL_HIP"
			for r in $DAPL_RUNS; do
				[ "$r" = dtest ] && continue
				# a pause: the host notes where our server's output for the run ends
				echo "sleep 2"
				echo "dapl_run $r 90 client dapltest -T $(dapl_type "$r") -s $DAPL_HIP -D $DAPL_IA $(dapl_args "$r" "$role")"
			done
		fi
		echo "dapl_wait"
		# what siw said (it warns, for one, when a message of ours intersects another)
		echo "dmesg | grep -i siw | grep -vi -e taint -e 'loading out-of-tree' -e 'command line' | sed 's/^/IWGUEST: out kernel: /'"
	} > "$file"
}

# dapl_guest_out LOG TAG: what the guest's TAG printed (console lines
# "IWGUEST: out TAG: ...", without the prefix and the serial line's CR).
dapl_guest_out() { sed -n "s/^IWGUEST: out $2: //p" "$1" | tr -d '\r'; }

DAPL_FAILURE='error|fail|warning|mismatch|cannot|bad (connection|disconnect)|bogus|flushed'
# dapl_judge WHAT FILE WANT...: FILE shows no failure marker and every WANT;
# else prints why and returns 1.
dapl_judge() {
	local what=$1 f=$2 m w
	shift 2
	if m=$(grep -m1 -oiE "$DAPL_FAILURE" "$f"); then
		echo "$what printed '$(grep -m1 -iE "$DAPL_FAILURE" "$f" | cut -c1-90)'"
		return 1
	fi
	for w in "$@"; do
		grep -qF -- "$w" "$f" || { echo "$what did not print '$w'"; return 1; }
	done
}

# dapl_siw_flushed SERVER_OUT PCAP: siw (the server) failed only because it
# flushed its last Send when our side closed: its output's first error is
# that Send's completion (LOC_LEN_ERR, status 2) or its QP's fatal event
# (libdaplofa's async event 1), while the run's capture
# holds no reset and our FIN acknowledges every octet siw sent on each
# connection. siw under TCG completes a Send well after its octets are on
# the wire; dtest's and dapltest's clients close at once after the last
# message, and siw then fails the Send it had already delivered (its QP
# goes fatal: async event 1). Our side has seen everything arrive.
dapl_siw_flushed() {
	local out=$1 pcap=$2
	local first
	first=$(grep -m1 -E 'Error|ERR|async_event QP' "$out") || return 1
	[[ $first == *"DTO completion ERR: status 2, op OP_SEND"* || $first == *"async_event QP"*"Event 1"* ]] || return 1
	tcpdump -S -nr "$pcap" 2>/dev/null | awk -v siw="$DAPL_GIP" '
		/Flags \[R/ { bad = 1 }
		{
			split($3, s, "."); src = s[1] "." s[2] "." s[3] "." s[4]
			d = $5; sub(/:$/, "", d)
			flow = ($3 < d) ? $3 " " d : d " " $3
		}
		src == siw && match($0, /seq [0-9]+:[0-9]+/) {
			split(substr($0, RSTART + 4, RLENGTH - 4), q, ":"); if (q[2] + 0 > last[flow]) last[flow] = q[2] + 0
		}
		src != siw && /Flags \[F/ && match($0, /ack [0-9]+/) { fin[flow] = substr($0, RSTART + 4, RLENGTH - 4) + 0 }
		END {
			if (bad) exit 1
			for (f in last) if (!(f in fin) || fin[f] < last[f]) exit 1
			exit 0
		}'
}

# dapl_split PCAP PREFIX: writes PREFIX.N.pcap for each run N, a run being
# the connections from one SYN to 45248 (dtest) or 62000 (a dapltest
# control connection) up to the next, in time and by ports; dtest's side
# channel (15828) is left out. Prints the number of runs.
dapl_split() {
	local pcap=$1 prefix=$2 n=0 ts src dst sp dp key seen=" " i rest
	local -a filt=() start=()
	while read -r ts _ src _ dst rest; do
		sp=${src##*.} dst=${dst%:} dp=${dst##*.}
		# A retransmitted SYN has its first's sequence number; a new
		# connection may reuse a port (the xdp datapath's port table
		# gives a free 4-tuple's port again), so runs are cut in time too.
		rest=${rest#*seq } key="$sp-$dp-${rest%%,*}"
		[[ $seen == *" $key "* ]] && continue
		seen+="$key "
		case $dp in
		15828) continue ;;
		45248 | 62000) n=$((n + 1)) filt[n]="(tcp port $sp and tcp port $dp)" start[n]=$ts ;;
		*) [ "$n" -gt 0 ] && filt[n]+=" or (tcp port $sp and tcp port $dp)" ;;
		esac
	done < <(tcpdump -tt -nr "$pcap" 'tcp[tcpflags] & (tcp-syn|tcp-ack) == tcp-syn' 2>/dev/null)
	for ((i = 1; i <= n; i++)); do
		local span=(-A "$(date -u -d "@${start[i]}" '+%Y-%m-%d %H:%M:%S.%N')")
		if [ "$i" -lt "$n" ]; then span+=(-B "$(date -u -d "@${start[i + 1]}" '+%Y-%m-%d %H:%M:%S.%N')"); fi
		TZ=UTC editcap -F pcap "${span[@]}" "$pcap" "$prefix.$i.all.pcap" 2>/dev/null
		tcpdump -r "$prefix.$i.all.pcap" -w "$prefix.$i.pcap" "${filt[i]}" 2>/dev/null
		rm -f "$prefix.$i.all.pcap"
	done
	echo "$n"
}

# dapl_daemon DATAPATH LOG: softrnicd on the tap once run.sh has made it.
dapl_daemon() {
	local dp=$1 log=$2
	for _ in $(seq 300); do ip -n "$DAPL_NS" link show dev "$TAP" >/dev/null 2>&1 && break; sleep 0.1; done
	sleep 0.2 # the address
	rm -f "$work/dapl.sock"
	ip netns exec "$DAPL_NS" "$work/softrnicd" --iface "$TAP" --datapath "$dp" --socket "$work/dapl.sock" --log-level warn 2> "$log" &
	DPID=$!
	pids+=($DPID)
	wait_socket "$work/dapl.sock" "softrnicd --datapath $dp on $TAP" "$log"
}

# dapl_wait_for FILE PATTERN SECONDS [PID]: waits until FILE has a line
# matching PATTERN (extended regexp), for at most SECONDS, or until PID
# (the guest's run.sh) ends.
dapl_wait_for() {
	local i
	for ((i = 0; i < $3 * 5; i++)); do
		grep -qE -- "$2" "$1" 2>/dev/null && return 0
		[ -n "${4:-}" ] && ! kill -0 "$4" 2>/dev/null && { grep -qE -- "$2" "$1" 2>/dev/null; return; }
		sleep 0.2
	done
	return 1
}

# dapl_boot DATAPATH ROLE: one guest boot, one row per run.
dapl_boot() {
	local dp=$1 role=$2 base="dapl-$1-$2"
	if [ -n "${ONLY:-}" ] && [[ "dapl-$dp-$role" != *$ONLY* ]]; then return; fi
	# this boot's runs, for dapl_job too
	local DAPL_RUNS
	DAPL_RUNS=$(dapl_runs "$dp" "$role")
	local d="$work/$base" glog="$work/$base.guest" console="$work/$base.console" dlog="$work/$base.daemon"
	mkdir -p "$d/job/dapl"
	dapl_job "$role" "$d/job/dapl/job"
	(cd "$d/job" && find dapl | cpio -o -H newc -R 0:0 --quiet) > "$d/job.cpio"
	cat "${SIW_GUEST_DIR:-/var/tmp/softrnic-siw-guest}/initramfs.cpio" "$DAPL_OVERLAY" "$d/job.cpio" > "$d/initrd.cpio"
	# A namespace of its own: see the top of this file.
	DAPL_NS=srndapl$$
	ip netns add "$DAPL_NS" || return 1
	ip -n "$DAPL_NS" link set lo up
	local opts=(--peer "$DAPL_HIP")
	[ "$role" = siw-client ] && opts+=(--siwopts peer_to_peer=1)
	local t0=$SECONDS
	bash "$GUEST/run.sh" --mode hold --initrd "$d/initrd.cpio" --net tap --netns "$DAPL_NS" --tap "$TAP" \
		--tap-ip "$DAPL_HIP/24" --ip "$DAPL_GIP/24" "${opts[@]}" \
		--pcap "$d/all.pcap" --log "$console" --timeout 240 > "$glog" 2>&1 &
	local gpid=$! r srvout note=
	# per run: our client's or the guest's client's output (cout), where
	# the server's output for the run ends (cut), why it failed early (rnote)
	local -A cout=() cut=() rnote=()
	dapl_daemon "$dp" "$dlog" || note="softrnicd did not start"
	srvout="$d/server.dapltest"
	if [ "$role" = siw-server ]; then
		# The guest serves; our clients run one after the other.
		if dapl_wait_for "$glog" "^IWGUEST: dtest listening" 120 "$gpid"; then
			cat > "$d/relay.sh" <<-EOF
				#!/bin/bash
				# dtest's side channel, held back until siw listens on 45248
				exec 3<>/dev/tcp/$DAPL_GIP/15828 || exit 1
				head -c 128 <&3 > "$d/side-channel.msg"
				for _ in \$(seq 300); do grep -q '^IWGUEST: dtest-psp listening' "$glog" && break; sleep 0.2; done
				cat "$d/side-channel.msg"
			EOF
			chmod +x "$d/relay.sh"
			ip netns exec "$DAPL_NS" timeout 100 socat TCP-LISTEN:15828,bind=127.0.0.1,reuseaddr EXEC:"$d/relay.sh" 2> "$d/relay.log" &
			local rpid=$!
			for _ in $(seq 50); do ip netns exec "$DAPL_NS" ss -Hltn 'sport = :15828' | grep -q . && break; sleep 0.1; done
			cout[dtest]="$d/dtest.ours"
			(dapl_ours 90 "${DAPL_DTEST[@]}" -h 127.0.0.1) > "${cout[dtest]}" 2>&1
			kill "$rpid" 2>/dev/null
			wait "$rpid" 2>/dev/null
		else
			rnote[dtest]="the guest's dtest server never listened"
		fi
		if dapl_wait_for "$glog" "^IWGUEST: dapltest listening" 60 "$gpid"; then
			for r in $DAPL_RUNS; do
				[ "$r" = dtest ] && continue
				cout[$r]="$d/$r.ours"
				# shellcheck disable=SC2046 # the arguments are words
				(dapl_ours 90 dapltest -T "$(dapl_type "$r")" -s "$DAPL_GIP" -D "$DAPL_IA" $(dapl_args "$r" "$role")) > "${cout[$r]}" 2>&1
				sleep 1
				cut[$r]=$(dapl_guest_out "$console" dapltest | wc -l)
			done
		else
			for r in $DAPL_RUNS; do [ "$r" = dtest ] || rnote[$r]="the guest's dapltest server never listened"; done
		fi
		wait "$gpid"
		dapl_guest_out "$console" dapltest > "$srvout"
		dapl_guest_out "$console" dtest > "$d/dtest.server"
		kill -TERM "$DPID" 2>/dev/null
		wait "$DPID" 2>/dev/null
	else
		# We serve; the guest's clients run one after the other.
		dapl_ours 150 "${DAPL_DTEST[@]}" -s > "$d/dtest.server" 2>&1 &
		local spid=$!
		dapl_ours 200 dapltest -T S -D "$DAPL_IA" > "$srvout" 2>&1 &
		local tpid=$!
		dapl_wait_for "$d/dtest.server" "waiting for client connection" 20 "$spid" || rnote[dtest]="our dtest server did not start"
		if ! dapl_wait_for "$srvout" "Service Point Ready" 20 "$tpid"; then
			for r in $DAPL_RUNS; do [ "$r" = dtest ] || rnote[$r]="our dapltest server did not start"; done
		fi
		for r in $DAPL_RUNS; do
			dapl_wait_for "$glog" "^IWGUEST: $r rc=" 150 "$gpid" || break
			sleep 0.5
			cut[$r]=$(wc -l < "$srvout")
		done
		wait "$gpid"
		# our servers end with their last client; give them a moment
		for _ in $(seq 25); do kill -0 "$spid" 2>/dev/null || kill -0 "$tpid" 2>/dev/null || break; sleep 0.2; done
		kill "$spid" "$tpid" 2>/dev/null
		wait "$spid" "$tpid" 2>/dev/null
		kill -TERM "$DPID" 2>/dev/null
		wait "$DPID" 2>/dev/null
		for r in $DAPL_RUNS; do
			cout[$r]="$d/$r.guest"
			dapl_guest_out "$console" "$r" > "${cout[$r]}"
		done
	fi
	ip netns del "$DAPL_NS"
	DAPL_NS=
	rm -f "$d/initrd.cpio" # 150 MB, the guest's initramfs again
	echo "   guest boot $base: $((SECONDS - t0)) s"

	# One row per run.
	local nruns nsplit i=0 prev=0 ok log plog pcap cw sw why
	nruns=$(wc -w <<< "$DAPL_RUNS")
	nsplit=$(dapl_split "$d/all.pcap" "$d/run")
	for r in $DAPL_RUNS; do
		i=$((i + 1))
		ok=PASS
		local name="dapl-$dp-${DAPL_ROW[$r]}"
		why=${note:-${rnote[$r]:-}}
		[ -n "$why" ] && ok=FAIL
		# our side's output is plog, the guest's is log (IWGUEST lines)
		if [ "$role" = siw-server ]; then plog=${cout[$r]:-/dev/null}; else plog="$d/$r.server-side"; fi
		if [ "$r" = dtest ]; then
			cp "$d/dtest.server" "$d/$r.server-side"
			# Not which string the Read brought back: dtest copies each
			# side's string into its buffer and reads the peer's at once,
			# unordered with the peer's copy (dtest.c
			# do_rdma_read_with_msg); against a guest under TCG our
			# client often reads siw's buffer before its string is in.
			cw=("CONNECTED!" "RDMA write buffer contains: server" "RCV RDMA read buffer contains:" "Message PingPong" "DAPL Test Complete. PASSED")
			# not what the server's Read found: dtest reads the client's
			# buffer without waiting for the client to fill it
			sw=("CONNECTED!" "RDMA write buffer contains: client" "RCV RDMA read buffer contains:" "DAPL Test Complete. PASSED")
		else
			# the server's output from the end of the previous run to the
			# end of this one (the last run: to the end)
			if [ "$r" = Q ]; then sed -n "$((prev + 1)),\$p" "$srvout"; else sed -n "$((prev + 1)),${cut[$r]:-0}p" "$srvout"; fi > "$d/$r.server-side"
			prev=${cut[$r]:-$prev}
			case $r in
			T*) cw=("----- Stats ---- :" "Total WQE" "End of Work -- Client Exiting") sw=("Transaction Test Finished for this client") ;;
			P*) cw=("Operation Throughput" "Latency" "End of Work -- Client Exiting") sw=("Finished performance test.  Exiting.") ;;
			Q) cw=("Quit_Cmd.device_name: $DAPL_IA" "End of Work -- Client Exiting") sw=("DT_cs_Server ($DAPL_IA):  Exiting.") ;;
			esac
		fi
		local cl=ours sv=siw
		[ "$role" = siw-client ] && cl=siw sv=ours
		if [ "$role" = siw-server ]; then
			log="$d/$r.guest-lines"
			sed 's/^/IWGUEST: out server: /' "$d/$r.server-side" > "$log"
		else
			log="$d/$r.guest-lines"
			sed "s/^/IWGUEST: out $r: /" "${cout[$r]}" > "$log"
			grep -E "^IWGUEST: $r rc=" "$glog" >> "$log"
		fi
		dapl_guest_out "$console" kernel | sed 's/^/IWGUEST: siw kernel: /' >> "$log"
		if [ -z "$why" ]; then
			why=$(dapl_judge "client ($cl)" "${cout[$r]:-/dev/null}" "${cw[@]}") || ok=FAIL
			# siw's teardown race, siw as client: see dapl_siw_flushed.
			if [ "$ok" = FAIL ] && [ "$role" = siw-client ] && [ "$nsplit" = "$nruns" ] &&
				dapl_siw_flushed "${cout[$r]:-/dev/null}" "$d/run.$i.pcap" &&
				dapl_judge "server ($sv)" "$d/$r.server-side" "${sw[@]}" > /dev/null; then
				ok=PASS why="siw flushed its last Send at our orderly close, every octet of it acknowledged on the wire (siw's teardown race, tolerated)"
			fi
		fi
		if [ -z "$why" ]; then
			why=$(dapl_judge "server ($sv)" "$d/$r.server-side" "${sw[@]}") || ok=FAIL
			# siw's teardown race, siw as server: see dapl_siw_flushed.
			if [ "$ok" = FAIL ] && [ "$role" = siw-server ] && [ "$nsplit" = "$nruns" ] &&
				dapl_siw_flushed "$d/$r.server-side" "$d/run.$i.pcap"; then
				ok=PASS why="siw flushed its last Send at our orderly close, every octet of it acknowledged on the wire (siw's teardown race, tolerated)"
			fi
		fi
		if [ "$nsplit" = "$nruns" ]; then
			pcap="$d/run.$i.pcap"
		else
			pcap=/dev/null why="${why:+$why; }capture holds $nsplit runs, not $nruns"
			ok=FAIL
		fi
		report_dapl "$name" "$role" "$pcap" "$log" "$plog" "$dlog" "$ok" "$why"
	done
}

# report_dapl NAME ROLE PCAP LOG PLOG DLOG OK WHY: report() with its locals.
report_dapl() {
	local name=$1 role=$2 pcap=$3 log=$4 plog=$5 dlog=$6 ok=$7 note=$8 check=check_capture
	[[ $name == *-large-* ]] && check=check_large # tshark's passes over 130 MiB would take minutes
	report "$name" on 12 12
}

DAPL_NS=
trap 'cleanup; ip netns del "$NS" 2>/dev/null; [ -z "$DAPL_NS" ] || ip netns del "$DAPL_NS" 2>/dev/null' EXIT
echo "== uDAPL: Debian's dtest and dapltest, softrnic (libdaplsoftrnic) against siw (libdaplofa) in the guest"
dapl_selected=
for b in dapl-kernel-siw-server dapl-kernel-siw-client dapl-xdp-siw-server dapl-xdp-siw-client; do
	if [ -z "${ONLY:-}" ] || [[ "$b" == *$ONLY* ]]; then dapl_selected=1; fi
done
if [ -n "$dapl_selected" ]; then
	if dapl_setup; then
		for dp in kernel xdp; do
			dapl_boot "$dp" siw-server
			dapl_boot "$dp" siw-client
		done
	else
		results+=("$(printf '%-4s  %-34s %-10s %-4s %s' FAIL "dapl (setup)" - - "the overlay or the provider did not build")")
	fi
fi
