# hack/interop-verbs.sh: the verbs part of make interop, sourced by
# hack/interop.sh (which provides work, NS, TAP, pids, results, report,
# wait_socket, siw_shell_start, siw_shell_end and wait_line). Debian's unmodified rping and perftest
# (ib_write_bw, ib_send_bw, ib_read_bw, ib_read_lat, ib_write_lat, all with
# -R) run on the host over softrnic's libibverbs.so.1 and librdmacm.so.1
# (built from this tree into $work/lib) against the same binaries over
# Linux siw in the guest, both datapaths, siw as server and as client for
# all six; and Debian's qperf, rc_lat with -cm1, the same way (the guest
# gets qperf 0.4.11 of its own suite from an initramfs overlay,
# hack/siw-debs.sh); and Debian's fio 3.33, its rdma engine, by RDMA Write
# and by RDMA Read (the client's --verb), the same way (fio and the
# libraries its binary links that the guest lacks, from an overlay of
# their own, checked by ELF load closure: siw-debs.sh --elf); and
# librdmacm's examples from rdmacm-utils (the guest has the package),
# the same way: ucmatose (-c 4 -C 200 -S 4096) and rdma_server with
# rdma_client, and with siw as client only rdma_xserver with rdma_xclient
# (-c r: RC; XRC is not iWARP's) and cmtime (-c 20).
#
# One guest boot per datapath runs the rows of that datapath, in run.sh's
# shell mode: the commands are typed into the guest's console
# (siw_shell_type), first the rows with siw as server, then those with
# siw as client. On both datapaths the guest sits on a tap in a namespace of
# ours that softrnicd serves (the xdp rows' NS for xdp, one of its own for
# the kernel datapath), and the capture is QEMU's. Every row has ports of
# its own, so each row's capture is the boot's cut by port.
#
# Not QEMU's user-mode network, as the other kernel rows: perftest's server
# listens for its test connection only after the exchange that sends the
# client to connect it, so the client's first try often finds nothing
# listening. On a network that is a refused SYN, which softrnic's
# rdma_connect tries again (verbs/rdmacm/cm.c RETRY_REFUSED_US); behind a
# hostfwd QEMU accepts the connection itself and resets it once the guest
# refuses, after our MPA Request: a connection reset, not refused, so the
# REJECTED event goes to perftest, whose own retry then crashes (Debian's
# 4.5-0.17 frees its CM nodes and uses them again; perftest fixed it in
# 3d9d8d0, "Fix crashes and logical flaws in RDMA CM connection retry").
#
# Two races of siw's, neither softrnic's, would fail the perftest rows
# now and then, mostly with siw as client; each is told apart by what
# both sides print and handled, and anything else fails the row.
#
# The close race, seen in 1 of 100 rows with siw as client (xdp
# ib_read_lat; the one failure that made them opt-in looked the same):
# after the test the two perftests exchange a last message each way,
# and the side that receives the last closes at once, as perftest does
# on any RNIC (ours, as server, answers the client's and closes). siw
# completes a Send whose last segment is on the wire with
# IBV_WC_LOC_QP_OP_ERR if the peer's FIN or RST arrives while its tx
# call still holds the socket (siw_qp_tx.c siw_qp_sq_proc_tx: tx_suspend,
# set by siw_cm_llp_state_change on TCP_CLOSE or TCP_CLOSE_WAIT, is
# checked before DDP_FLAG_LAST), a window the emulated guest on a busy
# host makes wide: "Bad wc status 2", "Unable to write to
# socket/rdma_cm", "Failed to close connection between server and
# client", the results already printed. vb_close_race tolerates exactly
# that, and only when our side passed: its last read completed, so the
# Send siw calls failed was received. The row's detail says so.
#
# The listen gap: perftest -R's client makes its first connection (the
# exchange's), tells the server, and connects its test QP at once, while
# the server (ours) destroys its first listener and listens again only
# after the exchange. siw connects the TCP socket within rdma_connect, so
# a SYN that meets no listener fails rdma_connect with ECONNREFUSED
# ("Failed to connect through RDMA CM." "ERRNO: Connection refused."),
# Linux's CM does not try again, and Debian's perftest's retry then
# crashes (a segmentation fault; the same upstream fix). The guest's
# client takes 4 to 50 ms from our exchange message to its SYN, our
# server 0.5 to 3.5 ms from that message to its daemon's listen(2)
# (captures; strace of the daemon, the host busy with a CI run): not
# seen in 100 rows, but siw's servers lose the same race to our clients
# (whose rdma_connect tries again), and VB_LATE_LISTEN_MS forces it
# (vb_late_listen_lib). Such a try (vb_gap_refused: siw's client says
# so; our server still waiting for the test connection, or finished
# cleanly) is run again, at most VB_TRIES times in all, each named in
# the row's detail. A listener that never comes, or comes late every
# time, fails every try. The guest's vcli tries a client again only when
# its first connection was refused (perftest: "Function rdma_connect
# failed"; rping: "rdma_connect: Connection refused"), which leaves the
# server waiting as it was; after that connection it never does, since
# a client started again would connect to the test listener of the
# server still waiting for the first (the old retry on any quick
# failure did, which hid the close race's output under four refusals).
#
# A row passes when both programs exit 0 and print what they print on
# success: rping five pings each side (-v; the client verifies each, -V),
# perftest the results row of its table (4096 octets, 50 iterations; the
# server of ib_read_lat prints no table, only its banner), neither side a
# failure message; and when its capture passes check_capture with CRC on
# (our libraries ask for it) in the MPA mode the row names.
#
# qperf. Its client asks its server for a test over a TCP connection of
# its own (--listen_port, the row's), and the server's child for that test
# binds its RDMA-CM id to a port of its device's choosing and tells the
# client, which connects there; so a row's capture is the connections that
# start while its control connection is open (vb_qperf_cut). rc_lat runs,
# in both roles and on both datapaths. With siw as server, siw's listener
# refuses our first SYN or two just after qperf has sent its port (RST in
# the captures), which our rdma_connect tries again. qperf's server drops
# its children's exit status, so each side's server is watched from
# outside: ours under strace -f (its test's child must exit 0), siw's
# through the guest kernel's log. There siw's child segfaults after every
# test: qperf 0.4.11's cm_close on a server destroys the QP of the
# listening id, which has none, as rdma_destroy_qp -> ibv_destroy_qp(NULL)
# (fixed upstream in qperf 83bc16e, "Use the rdma_cm_id from CMINFO rather
# than from the event", after 0.4.11): "qperf[138]: segfault at 0 ip ...
# error 4 in libibverbs.so.1.14.44.0[...]", the results already printed
# by our client. The row tolerates exactly that (one such line, not the
# server's own pid, our client passed) and says so; any other segfault
# fails it. rc_bw and rc_rdma_read_bw cannot run against siw, and have no
# row (VB_QPERF runs them): qperf 0.4.11 creates the sender's QP of rc_bw
# and the reader's of rc_rdma_read_bw with no receive WRs, and the other
# side's with no send WRs. siw.ko refuses a QP without a send queue
# (siw_create_qp: -EINVAL, "QP must have send queue" at debug level), and
# libsiw maps the receive queue whatever its size, so an mmap of 0 octets
# fails with EINVAL; in either role siw's qperf says "failed to create QP:
# Invalid argument" and no test connection is made (siw as server: our
# client prints "server: " and exits 1; siw as client: it exits 1, our
# server's child 1). Not softrnic's: over softrnic on both sides all three
# pass (systest TestVerbsPrograms).
#
# A qperf row passes when our client exits 0 with its result ("latency =
# N us") and siw's server printed no failure and served until stopped, or
# when siw's client does the same and our server's child exited 0; and
# when its capture passes check_capture as the others.
#
# fio. 16 MiB in 64 KiB blocks, the server a read job that offers its
# buffers, the client a write job whose --verb=write moves them by RDMA
# Write into the server's, --verb=read by RDMA Read from them; the row's
# connection is on its --port, so its capture is the boot's cut by port.
# Both sides keep their buffers in a file (--mem=mmapshared), filled
# before (zeros; the server's random for read), and after the run every
# 64 KiB buffer of the receiving side must be, by sha256, one of the
# source side's, which must be distinct and none zero (vb_fio_check; what
# systest does, fio's own --verify cannot judge this engine). A fio row
# passes when both fio exit 0 with "err= 0" and no "fio: " complaint, the
# client's io= all 16 MiB, the data check holds and the capture passes
# check_capture as the others. The one line tolerated, on the server only
# and named in the row, is make test's fioFlushed: "fio: cq completion
# status 5(Work Request Flushed Error)", the receive it posted for a next
# message flushed as the client disconnects (its job is done by then and
# it reports no error); not seen in these rows so far.
#
# librdmacm's examples. Each row runs the server in one role and its
# client in the other, on the row's own port (-p), so its capture is the
# boot's cut by port, as the others. They are judged as systest's
# TestVerbsPrograms judges them over softrnic on both sides: both exit 0,
# print no failure (VB_FAILURE, or "event: ", what ucmatose and cmtime
# print for a connection that failed), ucmatose's last line "return
# status 0", the others' "PROG: end 0"; cmtime's server serves until it
# is stopped (siw's by vqsrv and vqend, as qperf's, ours from here) and
# must still be serving then, and its client must print a row of its
# table for each of its seven steps, each completed by some connection.
# Nothing is tolerated. ucmatose and rdma_server run against siw in both
# roles and on both datapaths; rdma_xserver (RC: its 4 octets of private
# data in the MPA Reply, the client's inline Send though it asked for no
# inline data) and cmtime (20 connections at once, each client QP
# destroyed right after its rdma_disconnect) with siw as client only.
#
# With siw as server those two have no row (VB_CM_SIW_SERVER_ALL=1 runs
# them, the last of the boot's siw-server rows): each crashed the guest's
# kernel now and then, rdma_xserver in 2 of 22 rows, cmtime in 1 of 8 (1
# connection of 160), after which the guest's RDMA CM hangs and every
# later row of the boot fails. What both sides show: our client passed
# (rdma_xclient "end 0"; cmtime's table whole: as initiator it is
# established by the MPA Reply); siw's server printed nothing more and
# never ended, and the guest's console has "kernel BUG at
# drivers/infiniband/core/iwcm.c:969!" in cm_work_handler, the BUG() of
# cm_close_handler (iwcm.c:950-969, linux-source-6.1 6.1.192-3) for a
# cm_id in none of ESTABLISHED, CLOSING, DESTROYING; its RDX, the state
# compared, is 2, IW_CM_STATE_CONN_RECV (iwcm.h:39): siw never reported
# the connection established before it reported it closed. The capture
# has our RTR (then rdma_xclient's Send) acknowledged by siw and never
# read: siw answered our FIN with a RST, a socket closed with data unread,
# where every other connection sent its FIN. As MPA responder in
# peer-to-peer mode siw reports ESTABLISHED only from siw_rtr_data_ready,
# the socket callback that reads the initiator's RTR, and siw_accept
# (siw_cm.c:1667-1690) installs it only after it has sent the Reply, the
# endpoint already in SIW_EPSTATE_RDMA_MODE; what arrives before is handed
# to siw_cm_llp_data_ready, which in RDMA_MODE ignores it (siw_cm.c:1253),
# and nothing reads it later. Our close then makes SIW_CM_WORK_PEER_CLOSE
# in RDMA_MODE report DISCONNECT and CLOSE (siw_cm.c:1095-1101) to a cm_id
# still in CONN_RECV. The two programs close at once: in both failed
# rdma_xserver rows our FIN came 508 and 788 us after siw's Reply, in the
# 20 that passed 521 us to 31 ms (all but two over 1.3 ms), so all we
# sent can fall in that window; rdma_client waits for the server's answer
# and ucmatose's server sends first, so neither has failed (22 rows each).
# Not softrnic's: the RTR follows the Reply as RFC 6581 has it (52 us to
# 4.5 ms after it in 200 connections of these rows), as siw's own
# initiator's does. vb_cm_row names such a BUG in its row's detail.
#
# siw runs with peer_to_peer=1: our libraries ask for MPA peer-to-peer
# mode (verbs/ibverbs/qp.c), which as responder they can use only if the
# initiator offers it, and ib_write_lat's server writes first, which RFC
# 5044 forbids a plain MPA responder. As responder siw takes the mode our
# initiator asks for whatever its parameter says, so the parameter decides
# only the rows where siw initiates.

# qperf's tests, a row each (qperf-TEST): rc_lat; VB_QPERF="rc_bw
# rc_rdma_read_bw" runs the two that cannot run against siw (see the top),
# VB_QPERF= none.
VB_QPERF=${VB_QPERF-rc_lat}
VB_TOOLS="rping ib_write_bw ib_send_bw ib_read_bw ib_read_lat ib_write_lat"
for t in $VB_QPERF; do VB_TOOLS+=" qperf-$t"; done
# fio's rdma engine, a row each (fio-VERB): the client's --verb, write
# (RDMA Write) and read (RDMA Read); VB_FIO= none.
VB_FIO=${VB_FIO-write read}
# what the guest lacks of what /usr/bin/fio loads (hack/siw-debs.sh --elf
# fails naming anything missing)
VB_FIO_DEBS="libaio1 libargon2-1 libboost-iostreams1.74.0 libboost-thread1.74.0 libcryptsetup12
	libdaxctl1 libdevmapper1.02.1 libfmt9 libgfapi0 libgfrpc0 libgfxdr0 libglusterfs0 libicu72
	libjson-c5 libnbd0 libndctl6 libnuma1 libpmem1 libpmemblk1 librados2 librbd1 libxml2"
for t in $VB_FIO; do VB_TOOLS+=" fio-$t"; done
# librdmacm's examples (rdmacm-utils), a row each, named by the server's
# program: ucmatose, rdma_server (with rdma_client), rdma_xserver (with
# rdma_xclient, RC) and cmtime; VB_CM= none.
VB_CM=${VB_CM-ucmatose rdma_server rdma_xserver cmtime}
for t in $VB_CM; do VB_TOOLS+=" $t"; done
VB_SIZE=4096
VB_ITERS=50
# vb_gport TOOL: the port a server of TOOL listens on in the guest; ours
# listens on the same plus 10. qperf's is its --listen_port, for its
# control connection; the test's own connection is on a port its server's
# rdma_bind_addr picks (vb_qperf_cut).
vb_gport() {
	case $1 in
	rping) echo 7174 ;; ib_write_bw) echo 18515 ;; ib_send_bw) echo 18516 ;;
	ib_read_bw) echo 18517 ;; ib_read_lat) echo 18518 ;; ib_write_lat) echo 18519 ;;
	qperf-*)
		local t i=0
		for t in $VB_QPERF; do [ "qperf-$t" = "$1" ] && break; i=$((i + 1)); done
		echo $((19765 + i))
		;;
	fio-write) echo 19800 ;; fio-read) echo 19801 ;;
	ucmatose) echo 19820 ;; rdma_server) echo 19821 ;; rdma_xserver) echo 19822 ;; cmtime) echo 19823 ;;
	esac
}
# vb_args TOOL server|client PORT [PEER]: the program's arguments but -d.
vb_args() {
	if [ "$1" = rping ]; then
		if [ "$2" = server ]; then echo "-s -a 0.0.0.0 -p $3 -v -C 5"; else echo "-c -a $4 -p $3 -v -V -C 5 -S 64"; fi
	else
		echo "-R -F -s $VB_SIZE -n $VB_ITERS -p $3${4:+ $4}"
	fi
}
# The guest's side. vsrv TAG PORT CMD... runs a server and says when its
# port listens; vcli TAG PATTERN CMD... runs a client, retried (up to five
# times) when it fails within 5 s and its output has PATTERN, what it
# prints when its first connection is refused (vb_refused_first). Each
# then prints its output as "IWGUEST: out TAG: LINE" and its exit status
# as "IWGUEST: TAG rc=N". The console echoes what is typed, so each marker
# is written as two words (see siw_shell_run).
# shellcheck disable=SC2016 # typed into the guest's shell
VB_GUEST_FUNCS=(
	'vrun() { timeout 100 stdbuf -oL -eL "$@" < /dev/null; }'
	'vout() { sed "s/^/IWGUEST: out $1: /" /tmp/$1.out; echo "IWGUEST: $1" "rc=$2"; }'
	'vsrv() { t=$1 p=$2; shift 2; vrun "$@" > /tmp/$t.out 2>&1 & s=$!; until ss -Hltn "sport = :$p" | grep -q . || ! kill -0 $s 2> /dev/null; do sleep 0.2; done; echo "IWGUEST: $t" listening; wait $s; vout $t $?; }'
	'vcli() { t=$1 m=$2; shift 2; n=0; while :; do n=$((n + 1)); a=$(date +%s); vrun "$@" > /tmp/$t.out 2>&1; r=$?; if [ $r = 0 ] || [ $n -ge 5 ] || [ $(($(date +%s) - a)) -ge 5 ] || ! grep -q "$m" /tmp/$t.out; then break; fi; echo "IWGUEST: note" "$t try $n failed (exit $r), retrying"; sed "s/^/IWGUEST: note $t try $n: /" /tmp/$t.out; sleep 2; done; vout $t $r; }'
	# qperf's server serves until stopped and forks a child per test
	# (cmtime's serves until stopped too, with no child);
	# vqsrv starts it, vqend waits (10 s at most) for the test's child
	# to end, stops the server, and prints the kernel's segfault lines
	# since vqsrv as "IWGUEST: seg TAG: LINE". Its status: stopped (it
	# served until then, no child left), busy (a child still ran), or
	# its own exit status.
	'vqsrv() { t=$1 p=$2; shift 2; dmesg | grep -c "segfault at" > /tmp/$t.seg0; timeout 300 stdbuf -oL -eL "$@" < /dev/null > /tmp/$t.out 2>&1 & s=$!; echo $s > /tmp/$t.pid; until ss -Hltn "sport = :$p" | grep -q . || ! kill -0 $s 2> /dev/null; do sleep 0.2; done; echo "IWGUEST: $t" listening; }'
	# fio: vfill FILE N random|zero writes N blocks of 64 KiB; vsums TAG
	# FILE N prints the sha256 of each of FILE's first N blocks as
	# "IWGUEST: sum TAG: I SUM".
	'vfill() { if [ "$3" = random ]; then head -c $(($2 * 65536)) /dev/urandom > $1; else head -c $(($2 * 65536)) /dev/zero > $1; fi; }'
	'vsums() { i=0; while [ $i -lt $3 ]; do echo "IWGUEST: sum" "$1: $i $(dd if=$2 bs=64k skip=$i count=1 2> /dev/null | sha256sum | cut -c1-64)"; i=$((i + 1)); done; }'
	'vqend() { t=$1 s=$(cat /tmp/$t.pid) n=0; q=$(cat /proc/$s/task/$s/children 2> /dev/null); q=${q%% *}; while [ -n "$q" ] && [ -n "$(cat /proc/$q/task/$q/children 2> /dev/null)" ] && [ $n -lt 50 ]; do sleep 0.2; n=$((n + 1)); done; if [ -n "$q" ] && [ -n "$(cat /proc/$q/task/$q/children 2> /dev/null)" ]; then r=busy; kill $q; wait $s; elif [ -n "$q" ] && kill -0 $q 2> /dev/null; then r=stopped; kill $q; wait $s; else wait $s; r=$?; fi; echo "IWGUEST: note" "$t: server pid $q"; dmesg | grep "segfault at" | tail -n +$(($(cat /tmp/$t.seg0) + 1)) | sed "s/^/IWGUEST: seg $t: /"; vout $t $r; }'
)

# siw_shell_type LINE: types LINE into the guest's shell (siw_shell_start),
# as siw_shell_run does, but leaves the shell running.
siw_shell_type() {
	(
		trap '' PIPE
		printf '%s\n' "$1" >&"$SHFD"
	) 2> /dev/null || true
}

# vb_ours SECONDS TOOL ARGS...: a Debian binary over our libraries on the
# boot's datapath (VB_IN, VB_SOCK), line-buffered and bounded. It execs,
# so that a server's pid is its timeout's: call it in a subshell.
vb_ours() {
	local s=$1
	shift
	exec "${VB_IN[@]}" env LD_LIBRARY_PATH="$work/lib" SOFTRNIC_SOCKET="$VB_SOCK" ${VB_PRELOAD:+LD_PRELOAD=$VB_PRELOAD} timeout "$s" stdbuf -oL -eL "$@"
}

# VB_LATE_LISTEN_MS=N forces the gap (see the top) to check that it is
# told apart: the first try of every perftest row with siw as client
# preloads into our server a wrapper that delays each rdma_listen but its
# first by N ms, so siw's test connection is refused, and the row passes
# on its second try.
vb_late_listen_lib() {
	cat > "$work/late-listen.c" <<-'EOF'
		#define _GNU_SOURCE
		#include <dlfcn.h>
		#include <stdlib.h>
		#include <unistd.h>
		struct rdma_cm_id;
		int rdma_listen(struct rdma_cm_id *id, int backlog)
		{
			static int n;
			int (*real)(struct rdma_cm_id *, int) = (int (*)(struct rdma_cm_id *, int))dlsym(RTLD_NEXT, "rdma_listen");
			if (n++)
				usleep(1000 * atoi(getenv("VB_LATE_LISTEN_MS")));
			return real(id, backlog);
		}
	EOF
	cc -shared -fPIC -o "$work/late-listen.so" "$work/late-listen.c" -ldl
}

VB_FAILURE="fail|error|couldn't|unable|cannot|invalid|abort"
# vb_judge WHAT TOOL SIDE FILE RC: the verdict on one side's output (FILE)
# and exit status (RC); prints why it failed, or what it tolerated.
vb_judge() {
	local what=$1 tool=$2 side=$3 f=$4 rc=$5 m
	if [ "$tool-$side-$rc" = rping-server-255 ] && grep -q "server DISCONNECT EVENT" "$f" &&
		grep -q "rdma_get_cm_event: Bad file descriptor" "$f"; then
		# rping's own teardown race (siw_server_verdict): after a clean
		# DISCONNECT its CM thread reads a destroyed event channel and
		# exits 255; the pings are counted below.
		echo "$what: rping teardown race tolerated"
	elif [ "$rc" != 0 ]; then
		echo "$what exited $rc: $(grep -v '^[[:space:]]*$' "$f" | tail -1 | cut -c1-80)"
		return 1
	fi
	if m=$(grep -m1 -iE "$VB_FAILURE" "$f"); then
		echo "$what printed '$(cut -c1-80 <<< "$m")'"
		return 1
	fi
	if [ "$tool" = rping ]; then
		local want='^ping data: rdma-ping-'
		[ "$side" = server ] && want='server ping data: rdma-ping-'
		[ "$(grep -c "$want" "$f")" -ge 5 ] || { echo "$what printed fewer than five pings"; return 1; }
	elif [ "$tool-$side" = ib_read_lat-server ]; then
		grep -q 'RDMA_Read Latency Test' "$f" || { echo "$what printed no banner"; return 1; }
	else
		grep -qE "^ *$VB_SIZE +$VB_ITERS +[0-9]" "$f" || { echo "$what printed no results row"; return 1; }
	fi
}

# vb_refused_first TOOL: what siw's client of TOOL prints when its first
# connection is refused (nothing listens yet), for vcli.
vb_refused_first() {
	if [ "$1" = rping ]; then echo "rdma_connect: Connection refused"; else echo "Function rdma_connect failed"; fi
}

# vb_gap_refused TAG: whether siw's perftest client of the try TAG met the
# gap (see the top): its test connection refused, which it reports from
# rdma_cm_route_handler, reached only after the exchange over the first.
vb_gap_refused() {
	local out
	out=$(sed -n "s/.*IWGUEST: out $1: //p" "$VB_CONSOLE" | tr -d '\r')
	grep -q "^Failed to connect through RDMA CM\.$" <<< "$out" && grep -q "^ERRNO: Connection refused\.$" <<< "$out"
}
VB_TRIES=3

# vb_close_race TOOL FILE RC: whether siw's perftest output FILE and exit
# status RC end in the close race (see the top): the exchange after the
# test, whose Send failed with wc status 2 (IBV_WC_LOC_QP_OP_ERR), and
# nothing else; exit status 1, but ib_send_bw says it goes on and exits
# 0. Prints how many lines that ending has. vb_row tolerates it only when
# our side passed, which shows that Send was received.
vb_close_race() {
	local want="Bad wc status 2
Unable to write to socket/rdma_cm
Failed to close connection between server and client" n=3 rc=1
	[ "$1" = ib_send_bw ] && want+="
Trying to close this side resources" n=4 rc=0
	[ "$3" = "$rc" ] && [ "$(grep -v '^[[:space:]]*$' "$2" | tail -"$n" | sed 's/^[[:space:]]*//; s/[[:space:]]*$//')" = "$want" ] && echo "$n"
}

# vb_row ROLE TOOL: one row of the boot (the guest's shell is up). Adds
# the row to VB_ROWS; vb_boot checks its capture after the boot.
vb_row() {
	local role=$1 tool=$2 name="verbs-$2-$1" ok=PASS t0=$SECONDS
	[ "$VB_DP" = xdp ] && name="xdp-$name"
	if [ -n "${ONLY:-}" ] && [[ "$name" != *$ONLY* ]]; then return; fi
	local tag="$tool-$role" gport port plog="$work/$name.ours" log="$work/$name.guest" ttag="$tool-$role"
	local rc grc why ours=client siw=server spid="" notes=()
	gport=$(vb_gport "$tool")
	if [ "$role" = siw-server ]; then
		# the guest listens on gport; ours connects to it
		port=$gport
		siw_shell_type "vsrv $tag $port $tool -d siw0 $(vb_args "$tool" server "$port")"
		if wait_line "$VB_CONSOLE" "IWGUEST: $tag listening" 60; then
			# shellcheck disable=SC2046 # the arguments are words
			(vb_ours 120 "$tool" -d softrnic0 $(vb_args "$tool" client "$port" "$VB_GADDR")) > "$plog" 2>&1
			rc=$?
		else
			notes+=("the guest's server never listened") rc=none
			: > "$plog"
		fi
		wait_line "$VB_CONSOLE" "IWGUEST: $tag rc=" 130 || notes+=("the guest's $tool never ended")
	else
		# ours listens on gport + 10; the guest connects to it
		ours=server siw=client port=$((gport + 10))
		local try=1 srv
		while :; do
			: > "$plog"
			local pre=""
			[ -n "${VB_LATE_LISTEN_MS:-}" ] && [ "$tool" != rping ] && [ "$try" = 1 ] && pre="$work/late-listen.so"
			# shellcheck disable=SC2046 # the arguments are words
			(VB_PRELOAD=$pre vb_ours 150 "$tool" -d softrnic0 $(vb_args "$tool" server "$port")) > "$plog" 2>&1 &
			spid=$!
			# listening: the kernel datapath's socket shows, the xdp
			# datapath's does not (perftest's banner comes just before it
			# listens; vcli retries what is refused)
			if [ "$VB_DP" = kernel ]; then
				for _ in $(seq 100); do "${VB_IN[@]}" ss -Hltn "sport = :$port" | grep -q . && break; sleep 0.1; done
			elif [ "$tool" != rping ]; then
				wait_line "$plog" "Waiting for client" 10
			else
				sleep 1
			fi
			siw_shell_type "vcli $ttag '$(vb_refused_first "$tool")' $tool -d siw0 $(vb_args "$tool" client "$port" "$VB_PEER")"
			wait_line "$VB_CONSOLE" "IWGUEST: $ttag rc=" 130 || notes+=("the guest's $tool never ended")
			[ "$tool" != rping ] && vb_gap_refused "$ttag" || break
			# the gap: our server waits for the test connection
			# (stopped), or finished if perftest's retry got that far
			if kill -0 "$spid" 2> /dev/null; then
				srv="waiting for it, stopped"
				if [ "$VB_DP" = kernel ] && "${VB_IN[@]}" ss -Hltn "sport = :$port" | grep -q .; then
					srv="listening by then, stopped"
				fi
				kill -TERM "$spid"
				wait "$spid"
			else
				wait "$spid"
				rc=$?
				srv="exited $rc"
				[ "$rc" = 0 ] && vb_judge ours "$tool" server "$plog" 0 > /dev/null && srv="finished"
			fi
			notes+=("try $try: siw's test connection refused, ours not listening again yet; siw's perftest exited $(sed -n "s/.*IWGUEST: $ttag rc=\([0-9]*\).*/\1/p" "$VB_CONSOLE" | tail -1), ours $srv")
			if [ "$try" -ge "$VB_TRIES" ]; then
				notes+=("refused in all $VB_TRIES tries") rc=none spid=""
				break
			fi
			mv "$plog" "$plog.try$try"
			try=$((try + 1)) ttag="$tag-try$try"
		done
		if [ -n "$spid" ]; then
			wait "$spid"
			rc=$?
		fi
	fi
	# the guest's side: its output and exit status; log holds the
	# IWGUEST lines report shows on failure. The first line of a
	# command's output may follow the shell's terminal controls.
	sed -n "s/.*IWGUEST: out $ttag: //p" "$VB_CONSOLE" | tr -d '\r' > "$log.out"
	grep -oE "IWGUEST: (out $tag(-try[0-9])?: |$tag(-try[0-9])? rc=|note $tag(-try[0-9])? ).*" "$VB_CONSOLE" | tr -d '\r' > "$log"
	grc=$(sed -n "s/.*IWGUEST: $ttag rc=\([0-9]*\).*/\1/p" "$VB_CONSOLE" | tail -1)
	why=$(vb_judge "$ours (ours)" "$tool" "$ours" "$plog" "$rc") || ok=FAIL
	[ -n "$why" ] && notes+=("$why")
	local sout="$log.out" src=${grc:-none} cut
	if [ "$ok" = PASS ] && [ "$tool" != rping ] && cut=$(vb_close_race "$tool" "$log.out" "$src"); then
		# judged without the lines of the close race
		grep -v '^[[:space:]]*$' "$log.out" | head -n -"$cut" > "$log.out.judged"
		sout="$log.out.judged" src=0
		notes+=("siw's last Send, which ours received, completed in error as ours closed (siw's close race, tolerated)")
	fi
	why=$(vb_judge "$siw (siw)" "$tool" "$siw" "$sout" "$src") || ok=FAIL
	[ -n "$why" ] && notes+=("$why")
	local note="" n
	for n in "${notes[@]}"; do note+="${note:+; }$n"; done
	VB_ROWS+=("$name|$ok|$role|$port|$log|$plog|$((SECONDS - t0))|$note")
}

# qperf's rows: Debian's qperf -cm1 (iWARP connects over the RDMA-CM
# only), one test a row (VB_QPERF), -t 2. qperf's server serves until it
# is stopped and forks a child for each test, and drops its status: siw's
# is watched through the guest's kernel log (vqend), ours through strace
# -f, which records how each of its processes ended.
VB_QPERF_RESULT='^ +(bw|latency) += +[0-9.]*[1-9][0-9.]* +(GB/sec|MB/sec|KB/sec|us|ms)$'
# The one end of siw's qperf server's test child tolerated (see the top):
# a segfault in libibverbs, in the ibv_destroy_qp(NULL) of its cm_close.
VB_QPERF_SEGV='^\[ *[0-9.]+\] qperf\[([0-9]+)\]: segfault at 0 ip [0-9a-f]+ sp [0-9a-f]+ error [0-9]+ in libibverbs\.so\.1\.[0-9.]+\[[0-9a-f]+\+[0-9a-f]+\]'

# vb_qperf_client WHAT FILE RC: a client of qperf (ours or siw's) exited
# 0, printed its result and no failure; prints why not.
vb_qperf_client() {
	local what=$1 f=$2 rc=$3 m
	if [ "$rc" != 0 ]; then
		echo "$what exited $rc: $(grep -v '^[[:space:]]*$' "$f" | tail -1 | cut -c1-80)"
		return 1
	fi
	if m=$(grep -m1 -iE "$VB_FAILURE" "$f"); then
		echo "$what printed '$(cut -c1-80 <<< "$m")'"
		return 1
	fi
	grep -qE "$VB_QPERF_RESULT" "$f" || { echo "$what printed no result"; return 1; }
}

# vb_qperf_server WHAT FILE STATE: a server of qperf printed no failure
# and served until it was stopped (STATE), its test's child ended by
# then; prints why not.
vb_qperf_server() {
	local what=$1 f=$2 state=$3 m
	[ "$state" = stopped ] || { echo "$what: $state"; return 1; }
	if m=$(grep -m1 -iE "$VB_FAILURE" "$f"); then
		echo "$what printed '$(cut -c1-80 <<< "$m")'"
		return 1
	fi
}

# vb_kid PID: PID's first child, if any.
vb_kid() {
	local k
	k=$(cat "/proc/$1/task/$1/children" 2> /dev/null)
	echo "${k%% *}"
}

# vb_qperf_stop PID: stops our qperf server (PID its timeout's, whose
# child is strace, whose child is qperf) once its test's child has ended,
# 10 s at most. Sets VB_QSTATE (stopped, or what went wrong) and
# VB_QPARENT (the server's pid); returns the timeout's exit status.
vb_qperf_stop() {
	local q k
	q=$(vb_kid "$(vb_kid "$1")")
	VB_QPARENT=$q VB_QSTATE=stopped
	for _ in $(seq 50); do [ -n "$q" ] && [ -n "$(vb_kid "$q")" ] || break; sleep 0.2; done
	if [ -z "$q" ] || ! kill -0 "$q" 2> /dev/null; then
		VB_QSTATE="it exited before it was stopped"
	elif k=$(vb_kid "$q") && [ -n "$k" ]; then
		VB_QSTATE="its test's child still ran 10 s after siw's client ended"
		kill -TERM "$k"
	fi
	[ -n "$q" ] && kill -TERM "$q" 2> /dev/null
	wait "$1"
}

# vb_qperf_cut PCAP LP: a tcpdump filter for the connections of the test
# whose control connection is on port LP: every TCP connection whose SYN
# comes after that connection's first frame and before its last (the
# test's own, on a port qperf's server picks). The rows run one after
# another, so nothing else connects meanwhile. Fails if there is none.
vb_qperf_cut() {
	local frames first last a b f=""
	frames=$(tshark -r "$1" -Y "tcp.port == $2" -T fields -e frame.number 2> /dev/null)
	first=$(head -1 <<< "$frames") last=$(tail -1 <<< "$frames")
	[ -n "$first" ] || return 1
	while read -r a b; do
		f+="${f:+ or }(tcp port $a and tcp port $b)"
	done < <(tshark -r "$1" -Y "tcp.flags.syn == 1 && tcp.flags.ack == 0 && !(tcp.port == $2) && frame.number > $first && frame.number < $last" \
		-T fields -e tcp.srcport -e tcp.dstport 2> /dev/null | sort -u)
	[ -n "$f" ] && echo "$f"
}

# vb_qperf_row ROLE TEST: one qperf row of the boot, as vb_row.
vb_qperf_row() {
	local role=$1 test=$2 name="verbs-qperf-$2-$1" ok=PASS t0=$SECONDS
	[ "$VB_DP" = xdp ] && name="xdp-$name"
	if [ -n "${ONLY:-}" ] && [[ "$name" != *$ONLY* ]]; then return; fi
	local tag="qperf-$test-$role" lp plog="$work/$name.ours" log="$work/$name.guest"
	local rc grc why notes=() args=(-cm1 -t 2) spid seg
	lp=$(vb_gport "qperf-$test")
	if [ "$role" = siw-server ]; then
		siw_shell_type "vqsrv $tag $lp qperf -lp $lp"
		if wait_line "$VB_CONSOLE" "IWGUEST: $tag listening" 60; then
			(vb_ours 120 qperf "${args[@]}" -lp "$lp" "$VB_GADDR" "$test") > "$plog" 2>&1
			rc=$?
		else
			notes+=("the guest's server never listened") rc=none
			: > "$plog"
		fi
		siw_shell_type "vqend $tag"
		wait_line "$VB_CONSOLE" "IWGUEST: $tag rc=" 30 || notes+=("the guest's qperf server never ended")
	else
		lp=$((lp + 10))
		(vb_ours 150 strace -f --seccomp-bpf -e trace=none -e signal=none -q -o "$plog.strace" qperf -lp "$lp") > "$plog" 2>&1 &
		spid=$!
		for _ in $(seq 100); do "${VB_IN[@]}" ss -Hltn "sport = :$lp" | grep -q . && break; sleep 0.1; done
		siw_shell_type "vrun qperf ${args[*]} -lp $lp $VB_PEER $test > /tmp/$tag.out 2>&1; vout $tag \$?"
		wait_line "$VB_CONSOLE" "IWGUEST: $tag rc=" 130 || notes+=("the guest's qperf never ended")
		vb_qperf_stop "$spid"
		rc=$?
	fi
	sed -n "s/.*IWGUEST: out $tag: //p" "$VB_CONSOLE" | tr -d '\r' > "$log.out"
	grep -oE "IWGUEST: ((out|seg|note) $tag: |$tag rc=).*" "$VB_CONSOLE" | tr -d '\r' > "$log"
	grc=$(sed -n "s/.*IWGUEST: $tag rc=\([0-9a-z]*\).*/\1/p" "$VB_CONSOLE" | tail -1)
	if [ "$role" = siw-server ]; then
		why=$(vb_qperf_client "ours (client)" "$plog" "$rc") || ok=FAIL
		[ -n "$why" ] && notes+=("$why")
		case $grc in stopped) ;; busy) grc="its test's child still ran 10 s after ours ended" ;; *) grc="it exited ${grc:-never}" ;; esac
		why=$(vb_qperf_server "siw (server)" "$log.out" "$grc") || ok=FAIL
		[ -n "$why" ] && notes+=("$why")
		# the guest kernel's segfault lines since the server started:
		# none, or exactly the bug's in the server's test child, once
		# ours passed
		local parent n
		parent=$(sed -n "s/.*IWGUEST: note $tag: server pid \([0-9]*\).*/\1/p" "$VB_CONSOLE" | tail -1)
		seg=$(sed -n "s/.*IWGUEST: seg $tag: //p" "$VB_CONSOLE" | tr -d '\r')
		n=$(grep -c . <<< "$seg")
		if [ "$n" = 1 ] && [[ $seg =~ $VB_QPERF_SEGV ]] && [ "${BASH_REMATCH[1]}" != "$parent" ] && [ "$ok" = PASS ]; then
			notes+=("siw's qperf test child segfaulted after the test, in its cm_close (Debian's qperf 0.4.11; fixed upstream in 83bc16e), tolerated")
		elif [ "$n" != 0 ]; then
			ok=FAIL
			notes+=("the guest logged $n segfault(s): $(head -1 <<< "$seg" | cut -c1-100)")
		fi
	else
		why=$(vb_qperf_client "siw (client)" "$log.out" "${grc:-none}") || ok=FAIL
		[ -n "$why" ] && notes+=("$why")
		why=$(vb_qperf_server "ours (server)" "$plog" "$VB_QSTATE") || ok=FAIL
		[ -n "$why" ] && notes+=("$why")
		# how our server's test child ended: exited 0, and only it
		local kids
		kids=$(grep -v "^$VB_QPARENT " "$plog.strace" 2> /dev/null | sed 's/^[0-9]* *//')
		if [ "$kids" != "+++ exited with 0 +++" ]; then
			ok=FAIL
			notes+=("ours (server)'s test child, by strace: $(tr '\n' ' ' <<< "${kids:-nothing}" | cut -c1-80)")
		fi
	fi
	# the client's result, qperf's own words
	local res
	res=$(grep -m1 -hE "$VB_QPERF_RESULT" "$([ "$role" = siw-server ] && echo "$plog" || echo "$log.out")" 2> /dev/null | sed 's/^ *//; s/  */ /g')
	[ -n "$res" ] && notes=("qperf $test: $res" "${notes[@]}")
	local note="" m
	for m in "${notes[@]}"; do note+="${note:+; }$m"; done
	VB_ROWS+=("$name|$ok|$role|qperf:$lp|$log|$plog|$((SECONDS - t0))|$note")
}

# fio's rows: Debian's fio 3.33, its rdma engine, as systest runs it
# (TestVerbsPrograms): the server a read job (--rw=read, iodepth
# VB_FIO_SDEPTH), which only offers its buffers and waits, the client a
# write job with --verb=write (RDMA Writes into the server's buffers) or
# --verb=read (RDMA Reads from them), iodepth VB_FIO_CDEPTH, 64 KiB
# blocks, VB_FIO_SIZE in all. Both keep their I/O buffers in a file
# (--mem=mmapshared:FILE, from its first block), and what fio left there
# is compared (fio's own --verify cannot judge this engine): the source
# side's buffers (the client's after fio filled them, or the server's,
# random octets, for read) distinct and none zero, every buffer of the
# other side's, which began as zeros, whole one of them (by sha256 of each
# 64 KiB block, vsums in the guest).
VB_FIO_SIZE=16m VB_FIO_SDEPTH=16 VB_FIO_CDEPTH=8
# a complaint of fio's (its engine's lines begin "fio: "), not the
# server's note that it waits (systest's fioError)
VB_FIO_ERROR='^fio: ([^w]|w[^a])'
# what fio's server may print as the client leaves: the receive it posted
# for a next message, flushed by the disconnect (its job is over by then,
# and it reports no error; systest's fioFlushed). Tolerated on the server
# only, and named.
VB_FIO_FLUSHED='^fio: cq completion status 5\(Work Request Flushed Error\)$'

# vb_fio_args server|client VERB PORT FILE [PEER]: fio's arguments.
vb_fio_args() {
	if [ "$1" = server ]; then
		echo "--name=srv --ioengine=rdma --port=$3 --bs=64k --size=$VB_FIO_SIZE --rw=read --iodepth=$VB_FIO_SDEPTH --mem=mmapshared:$4"
	else
		echo "--name=cli --ioengine=rdma --hostname=$5 --port=$3 --bs=64k --size=$VB_FIO_SIZE --rw=write --verb=$2 --iodepth=$VB_FIO_CDEPTH --scramble_buffers=0 --mem=mmapshared:$4"
	fi
}

# vb_fio_judge WHAT SIDE FILE RC: one fio's exit status and output (FILE):
# exit 0, "err= 0", no complaint (the server: but the flush, named); the
# client its I/O in full. Prints why not, or what it tolerated.
vb_fio_judge() {
	local what=$1 side=$2 f=$3 rc=$4 m
	if [ "$rc" != 0 ]; then
		echo "$what exited $rc: $(grep -v '^[[:space:]]*$' "$f" | grep -m1 '^fio: ' | cut -c1-80)"
		return 1
	fi
	if [ "$side" = server ]; then
		m=$(grep -vE "$VB_FIO_FLUSHED" "$f" | grep -m1 -E "$VB_FIO_ERROR")
	else
		m=$(grep -m1 -E "$VB_FIO_ERROR" "$f")
	fi
	[ -z "$m" ] || { echo "$what printed '$(cut -c1-80 <<< "$m")'"; return 1; }
	grep -q "err= 0" "$f" || { echo "$what printed no 'err= 0'"; return 1; }
	if [ "$side" = client ]; then
		grep -q "io=${VB_FIO_SIZE%m}.0MiB" "$f" || { echo "$what did not move ${VB_FIO_SIZE%m}.0MiB"; return 1; }
	fi
	if [ "$side" = server ] && grep -qE "$VB_FIO_FLUSHED" "$f"; then
		echo "$what: its posted receive flushed as the client left (tolerated, as in make test)"
	fi
}

# vb_sums FILE N: the sha256 of each of FILE's first N blocks of 64 KiB.
vb_sums() {
	local i
	for ((i = 0; i < $2; i++)); do dd if="$1" bs=64k skip="$i" count=1 2> /dev/null | sha256sum | cut -c1-64; done
}

# vb_fio_check SRC DST: the data check (see above) of the sums SRC and
# DST, one a line; prints why it failed, or how many blocks it held.
vb_fio_check() {
	local zero s n d
	zero=$(head -c 65536 /dev/zero | sha256sum | cut -c1-64)
	n=$(grep -c . <<< "$1") d=$(grep -c . <<< "$2")
	[ "$n" -gt 0 ] && [ "$d" -gt 0 ] || { echo "data: no sums ($n source, $d receiving)"; return 1; }
	grep -qxF "$zero" <<< "$1" && { echo "data: a source buffer is zeros"; return 1; }
	[ "$(sort -u <<< "$1" | grep -c .)" = "$n" ] || { echo "data: source buffers alike"; return 1; }
	while read -r s; do
		grep -qxF "$s" <<< "$1" || { echo "data: a receiving buffer is none of the $n source ones$([ "$s" = "$zero" ] && echo " (zeros)")"; return 1; }
	done <<< "$2"
	echo "data: each of $d buffers one of the other side's $n"
}

# vb_fio_row ROLE VERB: one fio row of the boot, as vb_row.
vb_fio_row() {
	local role=$1 verb=$2 name="verbs-fio-$2-$1" ok=PASS t0=$SECONDS
	[ "$VB_DP" = xdp ] && name="xdp-$name"
	if [ -n "${ONLY:-}" ] && [[ "$name" != *$ONLY* ]]; then return; fi
	local tag="fio-$verb-$role" port plog="$work/$name.ours" log="$work/$name.guest"
	local rc grc why notes=() spid gbuf="/tmp/fio-$verb-$role.buf" hbuf="$work/$name.buf" ours siw
	local gfill gn hfill hn
	port=$(vb_gport "fio-$verb")
	if [ "$role" = siw-server ]; then
		ours=client siw=server
		# the server's buffers: random for read (the source), zeros
		gfill=zero hfill=zero gn=$((VB_FIO_SDEPTH + 1)) hn=$((VB_FIO_CDEPTH + 1))
		[ "$verb" = read ] && gfill=random
		head -c $((hn * 65536)) /dev/zero > "$hbuf"
		siw_shell_type "cd /tmp; vfill $gbuf $gn $gfill; vsrv $tag $port fio $(vb_fio_args server "$verb" "$port" "$gbuf"); vsums $tag $gbuf $VB_FIO_SDEPTH"
		if wait_line "$VB_CONSOLE" "IWGUEST: $tag listening" 60; then
			# shellcheck disable=SC2046 # the arguments are words
			(vb_ours 120 fio $(vb_fio_args client "$verb" "$port" "$hbuf" "$VB_GADDR")) > "$plog" 2>&1
			rc=$?
		else
			notes+=("the guest's server never listened") rc=none
			: > "$plog"
		fi
		wait_line "$VB_CONSOLE" "IWGUEST: $tag rc=" 130 || notes+=("the guest's fio never ended")
		wait_line "$VB_CONSOLE" "IWGUEST: sum $tag: $((VB_FIO_SDEPTH - 1)) " 60 || notes+=("the guest's sums never came")
	else
		ours=server siw=client port=$((port + 10))
		gfill=zero hfill=zero gn=$((VB_FIO_CDEPTH + 1)) hn=$((VB_FIO_SDEPTH + 1))
		if [ "$verb" = read ]; then
			head -c $((hn * 65536)) /dev/urandom > "$hbuf"
		else
			head -c $((hn * 65536)) /dev/zero > "$hbuf"
		fi
		# shellcheck disable=SC2046 # the arguments are words
		(vb_ours 150 fio $(vb_fio_args server "$verb" "$port" "$hbuf")) > "$plog" 2>&1 &
		spid=$!
		if [ "$VB_DP" = kernel ]; then
			for _ in $(seq 100); do "${VB_IN[@]}" ss -Hltn "sport = :$port" | grep -q . && break; sleep 0.1; done
		else
			sleep 2
		fi
		siw_shell_type "cd /tmp; vfill $gbuf $gn $gfill; vcli $tag IWNEVER fio $(vb_fio_args client "$verb" "$port" "$gbuf" "$VB_PEER"); vsums $tag $gbuf $VB_FIO_CDEPTH"
		wait_line "$VB_CONSOLE" "IWGUEST: $tag rc=" 130 || notes+=("the guest's fio never ended")
		wait_line "$VB_CONSOLE" "IWGUEST: sum $tag: $((VB_FIO_CDEPTH - 1)) " 60 || notes+=("the guest's sums never came")
		wait "$spid"
		rc=$?
	fi
	sed -n "s/.*IWGUEST: out $tag: //p" "$VB_CONSOLE" | tr -d '\r' > "$log.out"
	grep -oE "IWGUEST: ((out|sum|note) $tag: |$tag rc=).*" "$VB_CONSOLE" | tr -d '\r' > "$log"
	grc=$(sed -n "s/.*IWGUEST: $tag rc=\([0-9]*\).*/\1/p" "$VB_CONSOLE" | tail -1)
	why=$(vb_fio_judge "$ours (ours)" "$ours" "$plog" "$rc") || ok=FAIL
	[ -n "$why" ] && notes+=("$why")
	why=$(vb_fio_judge "$siw (siw)" "$siw" "$log.out" "${grc:-none}") || ok=FAIL
	[ -n "$why" ] && notes+=("$why")
	# the data: the client's buffers (write) or the server's (read) are
	# the source
	local gs hs src dst
	gs=$(sed -n "s/.*IWGUEST: sum $tag: [0-9]* \([0-9a-f]\{64\}\).*/\1/p" "$VB_CONSOLE")
	if [ "$role" = siw-server ]; then hs=$(vb_sums "$hbuf" "$VB_FIO_CDEPTH"); else hs=$(vb_sums "$hbuf" "$VB_FIO_SDEPTH"); fi
	if [ "$role-$verb" = siw-server-write ] || [ "$role-$verb" = siw-client-read ]; then src=$hs dst=$gs; else src=$gs dst=$hs; fi
	why=$(vb_fio_check "$src" "$dst") || ok=FAIL
	notes+=("$why")
	# the client's bandwidth, fio's own words
	local res
	res=$(grep -m1 -hE '^ *(WRITE|READ): bw=' "$([ "$role" = siw-server ] && echo "$plog" || echo "$log.out")" 2> /dev/null | sed 's/^ *[A-Z]*: //; s/ (.*//')
	[ -n "$res" ] && notes=("fio --verb=$verb: $res" "${notes[@]}")
	local note="" m
	for m in "${notes[@]}"; do note+="${note:+; }$m"; done
	VB_ROWS+=("$name|$ok|$role|$port|$log|$plog|$((SECONDS - t0))|$note")
}

# librdmacm's examples' rows, as systest runs them (TestVerbsPrograms),
# each on a port of its own (-p): ucmatose with VB_CM_CONNS connections,
# each with VB_CM_COUNT Sends of VB_CM_SIZE octets from the server, then as
# many back; rdma_server and rdma_client (rdma_verbs.h's synchronous API,
# rdma_create_ep, an inline Send each way); rdma_xserver and rdma_xclient
# -c r (RC: the client's inline Send, with no max_inline_data asked for,
# and the server's 4 octets of private data in its accept); cmtime with
# VB_CM_CMTIME connections made at once, then disconnected at once, its
# client destroying each QP right after rdma_disconnect. cmtime's server
# serves until stopped, like qperf's: siw's is started by vqsrv and
# stopped by vqend, ours stopped here.
VB_CM_CONNS=4 VB_CM_COUNT=200 VB_CM_SIZE=4096 VB_CM_CMTIME=20
# what cmtime's client prints a row of for each step it timed (systest's
# cmtimeStep; "bind addr" only with -b)
VB_CM_STEPS=("create id" "resolve addr" "resolve route" "create qp" connect disconnect destroy)

# vb_cm_client PROG: the client's program of the server PROG.
vb_cm_client() {
	case $1 in rdma_server) echo rdma_client ;; rdma_xserver) echo rdma_xclient ;; *) echo "$1" ;; esac
}

# vb_cm_args PROG server|client PORT ADDR: the arguments of PROG's server
# or client; ADDR is the server's, which it binds (rdma_xserver binds the
# wildcard: it takes no address) and its client connects to.
vb_cm_args() {
	case $1-$2 in
	ucmatose-server) echo "-b $4 -p $3 -c $VB_CM_CONNS -C $VB_CM_COUNT -S $VB_CM_SIZE" ;;
	ucmatose-client) echo "-s $4 -p $3 -c $VB_CM_CONNS -C $VB_CM_COUNT -S $VB_CM_SIZE" ;;
	rdma_server-*) echo "-s $4 -p $3" ;;
	rdma_xserver-server) echo "-p $3 -c r" ;;
	rdma_xserver-client) echo "-s $4 -p $3 -c r" ;;
	cmtime-server) echo "-b $4 -p $3" ;;
	cmtime-client) echo "-s $4 -p $3 -c $VB_CM_CMTIME" ;;
	esac
}

# vb_cm_judge WHAT PROG SIDE FILE RC: one side's exit status (RC; for
# cmtime's server its state, stopped when it served until stopped) and
# output (FILE), judged as systest judges them: no failure message nor
# failed event ("event: ..."), and ucmatose ends "return status 0",
# rdma_server and the others "PROG: end 0"; cmtime's client a row for
# each of its seven steps, every one completed by some connection (a step
# none completed keeps the min it began with, 1000000000.00). Prints why
# not.
vb_cm_judge() {
	local what=$1 prog=$2 side=$3 f=$4 rc=$5 m want s
	if [ "$prog-$side" = cmtime-server ]; then
		[ "$rc" = stopped ] || { echo "$what: $rc"; return 1; }
	elif [ "$rc" != 0 ]; then
		echo "$what exited $rc: $(grep -v '^[[:space:]]*$' "$f" | tail -1 | cut -c1-80)"
		return 1
	fi
	if m=$(grep -m1 -iE "$VB_FAILURE|event:" "$f"); then
		echo "$what printed '$(cut -c1-80 <<< "$m")'"
		return 1
	fi
	case $prog-$side in
	cmtime-server) ;;
	cmtime-client)
		for s in "${VB_CM_STEPS[@]}"; do
			m=$(grep -m1 -E "^$s *: +[0-9. ]+$" "$f") || { echo "$what printed no row for '$s'"; return 1; }
			[[ $m != *1000000000.00* ]] || { echo "$what: no connection completed '$s'"; return 1; }
		done
		;;
	*)
		want="$(if [ "$side" = server ]; then echo "$prog"; else vb_cm_client "$prog"; fi): end 0"
		[ "$prog" = ucmatose ] && want="return status 0"
		m=$(grep -v '^[[:space:]]*$' "$f" | tail -1)
		[[ $m == *"$want" ]] || { echo "$what ended '$(cut -c1-80 <<< "$m")', not '$want'"; return 1; }
		;;
	esac
}

# vb_cm_row ROLE PROG: one row of librdmacm's example PROG, as vb_row.
vb_cm_row() {
	local role=$1 prog=$2 name="verbs-$2-$1" ok=PASS t0=$SECONDS
	[ "$VB_DP" = xdp ] && name="xdp-$name"
	if [ -n "${ONLY:-}" ] && [[ "$name" != *$ONLY* ]]; then return; fi
	local tag="$prog-$role" port plog="$work/$name.ours" log="$work/$name.guest"
	# rdma_xserver and cmtime with siw as server: siw's RTR race (see
	# the top)
	case $prog-$role in
	rdma_xserver-siw-server | cmtime-siw-server) [ -n "${VB_CM_SIW_SERVER_ALL:-}" ] || return ;;
	esac
	local rc grc why notes=() spid cprog ours siw c0
	c0=$(wc -l < "$VB_CONSOLE")
	cprog=$(vb_cm_client "$prog")
	port=$(vb_gport "$prog")
	if [ "$role" = siw-server ]; then
		ours=client siw=server
		if [ "$prog" = cmtime ]; then
			siw_shell_type "vqsrv $tag $port $prog $(vb_cm_args "$prog" server "$port" "$VB_GADDR")"
		else
			siw_shell_type "vsrv $tag $port $prog $(vb_cm_args "$prog" server "$port" "$VB_GADDR")"
		fi
		if wait_line "$VB_CONSOLE" "IWGUEST: $tag listening" 60; then
			# shellcheck disable=SC2046 # the arguments are words
			(vb_ours 120 "$cprog" $(vb_cm_args "$prog" client "$port" "$VB_GADDR")) > "$plog" 2>&1
			rc=$?
		else
			notes+=("the guest's server never listened") rc=none
			: > "$plog"
		fi
		# cmtime's server: a second for its last disconnects, then stopped
		[ "$prog" = cmtime ] && siw_shell_type "sleep 1; vqend $tag"
		wait_line "$VB_CONSOLE" "IWGUEST: $tag rc=" 130 || notes+=("the guest's $prog never ended")
	else
		ours=server siw=client port=$((port + 10))
		# shellcheck disable=SC2046 # the arguments are words
		(vb_ours 150 "$prog" $(vb_cm_args "$prog" server "$port" "$VB_PEER")) > "$plog" 2>&1 &
		spid=$!
		if [ "$VB_DP" = kernel ]; then
			for _ in $(seq 100); do "${VB_IN[@]}" ss -Hltn "sport = :$port" | grep -q . && break; sleep 0.1; done
		else
			sleep 2
		fi
		siw_shell_type "vcli $tag 'Connection refused' $cprog $(vb_cm_args "$prog" client "$port" "$VB_PEER")"
		wait_line "$VB_CONSOLE" "IWGUEST: $tag rc=" 130 || notes+=("the guest's $cprog never ended")
		if [ "$prog" = cmtime ]; then
			sleep 1
			rc="it exited before it was stopped"
			if kill -0 "$spid" 2> /dev/null; then
				rc=stopped
				kill -TERM "$spid"
			fi
			wait "$spid"
		else
			wait "$spid"
			rc=$?
		fi
	fi
	sed -n "s/.*IWGUEST: out $tag: //p" "$VB_CONSOLE" | tr -d '\r' > "$log.out"
	grep -oE "IWGUEST: ((out|seg|note) $tag: |$tag rc=).*" "$VB_CONSOLE" | tr -d '\r' > "$log"
	grc=$(sed -n "s/.*IWGUEST: $tag rc=\([0-9a-z]*\).*/\1/p" "$VB_CONSOLE" | tail -1)
	[ "$prog-$siw" = cmtime-server ] && case $grc in stopped) ;; *) grc="it exited ${grc:-never} before it was stopped" ;; esac
	why=$(vb_cm_judge "$ours (ours)" "$prog" "$ours" "$plog" "$rc") || ok=FAIL
	[ -n "$why" ] && notes+=("$why")
	why=$(vb_cm_judge "$siw (siw)" "$prog" "$siw" "$log.out" "${grc:-none}") || ok=FAIL
	[ -n "$why" ] && notes+=("$why")
	# the guest kernel's segfault lines while siw's cmtime server ran
	local seg
	seg=$(sed -n "s/.*IWGUEST: seg $tag: //p" "$VB_CONSOLE" | tr -d '\r')
	if [ -n "$seg" ]; then
		ok=FAIL
		notes+=("the guest logged $(grep -c . <<< "$seg") segfault(s): $(head -1 <<< "$seg" | cut -c1-100)")
	fi
	# the guest kernel's BUG, if any, since the row began: the RTR race
	# (see the top) is iwcm.c:969's
	local bug
	bug=$(tail -n +"$((c0 + 1))" "$VB_CONSOLE" | grep -m1 -o 'kernel BUG at [^ ]*' | tr -d '\r!')
	if [ -n "$bug" ]; then
		ok=FAIL
		[[ $bug == *iwcm.c:969 ]] && bug+=" (siw's RTR race, see hack/interop-verbs.sh: a connection it never reported established, closed)"
		notes+=("the guest's $bug")
	fi
	# cmtime's client: how long its connects and disconnects took, its
	# own words
	if [ "$prog" = cmtime ]; then
		local res
		res=$(grep -hE "^(connect|disconnect) +: " "$([ "$role" = siw-server ] && echo "$plog" || echo "$log.out")" 2> /dev/null | awk '{printf "%s%s %s ms", (NR > 1 ? ", " : ""), $1, $3}')
		[ -n "$res" ] && notes=("cmtime -c $VB_CM_CMTIME: $res" "${notes[@]}")
	fi
	local note="" m
	for m in "${notes[@]}"; do note+="${note:+; }$m"; done
	VB_ROWS+=("$name|$ok|$role|$port|$log|$plog|$((SECONDS - t0))|$note")
}

# vb_daemon DATAPATH NS LOG: softrnicd on the tap once run.sh has made it.
vb_daemon() {
	for _ in $(seq 300); do ip -n "$2" link show dev "$TAP" > /dev/null 2>&1 && break; sleep 0.1; done
	sleep 0.2 # the address
	rm -f "$VB_SOCK"
	ip netns exec "$2" "$work/softrnicd" --iface "$TAP" --datapath "$1" --socket "$VB_SOCK" --log-level warn 2> "$3" &
	VB_DPID=$!
	pids+=("$VB_DPID")
	wait_socket "$VB_SOCK" "softrnicd --datapath $1 on $TAP" "$3"
}

# vb_boot DATAPATH: one guest boot, the datapath's rows.
vb_boot() {
	VB_DP=$1
	local r t n selected=""
	for r in siw-server siw-client; do
		for t in $VB_TOOLS; do
			n="verbs-$t-$r"
			[ "$VB_DP" = xdp ] && n="xdp-$n"
			if [ -z "${ONLY:-}" ] || [[ "$n" == *$ONLY* ]]; then selected=1; fi
		done
	done
	[ -n "$selected" ] || return 0
	local base="verbs-$VB_DP" all="$work/verbs-$VB_DP.pcap" ns=$NS
	VB_GADDR=10.79.0.2 VB_PEER=10.79.0.1
	VB_CONSOLE="$work/$base.console" VB_DLOG="$work/$base.daemon" VB_SOCK="$work/verbs.sock" VB_ROWS=()
	if [ "$VB_DP" = kernel ]; then
		# a namespace of its own: no TIME_WAIT of its kernel sockets
		# meets the xdp rows in NS
		VB_NS=srnverbs$$
		ip netns add "$VB_NS" || return 1
		ip -n "$VB_NS" link set lo up
		ns=$VB_NS
	fi
	VB_IN=(ip netns exec "$ns")
	local t0=$SECONDS up=1 f initrd=()
	if [ "${#VB_OVERLAY[@]}" -gt 0 ]; then
		# the guest's initramfs and the qperf and fio overlays (about
		# 220 MB, for this boot only)
		cat "${SIW_GUEST_DIR:-/var/tmp/softrnic-siw-guest}/initramfs.cpio" "${VB_OVERLAY[@]}" > "$work/$base.initrd.cpio" || up=0
		initrd=(--initrd "$work/$base.initrd.cpio")
	fi
	[ "$up" = 1 ] && { siw_shell_start "$VB_CONSOLE" --net tap --netns "$ns" --tap "$TAP" --tap-ip "$VB_PEER/24" --ip "$VB_GADDR/24" \
		--pcap "$all" --siwopts peer_to_peer=1 --timeout 600 "${initrd[@]}" || up=0; }
	vb_daemon "$VB_DP" "$ns" "$VB_DLOG" || up=0
	if [ "$up" = 1 ]; then
		for f in "${VB_GUEST_FUNCS[@]}"; do siw_shell_type "$f"; done
		siw_shell_type "for i in \$(seq 60); do ping -c1 -W1 $VB_PEER >/dev/null 2>&1 && break; sleep 1; done; echo 'IWGUEST: peer' up"
		wait_line "$VB_CONSOLE" 'IWGUEST: peer up' 90 || up=0
	fi
	if [ "$up" = 1 ]; then
		for r in siw-server siw-client; do
			for t in $VB_TOOLS; do
				case $t in
				qperf-*) vb_qperf_row "$r" "${t#qperf-}" ;;
				fio-*) vb_fio_row "$r" "${t#fio-}" ;;
				ucmatose | rdma_server | rdma_xserver | cmtime) vb_cm_row "$r" "$t" ;;
				*) vb_row "$r" "$t" ;;
				esac
			done
		done
		siw_shell_type exit
		siw_shell_end
	else
		kill "$SHPID" 2> /dev/null
		wait "$SHPID" 2> /dev/null
		exec {SHFD}>&-
	fi
	kill -TERM "$VB_DPID" 2> /dev/null
	wait "$VB_DPID" 2> /dev/null
	if [ "$VB_DP" = kernel ]; then
		ip netns del "$VB_NS"
		VB_NS=
	fi
	rm -f "$work/$base.initrd.cpio"
	echo "   guest boot $base: $((SECONDS - t0)) s"
	if [ "$up" = 0 ]; then
		results+=("$(printf '%-4s  %-34s %-10s %-4s %s' FAIL "$base (boot)" - - "the guest's shell or the daemon did not start: $VB_CONSOLE")")
		return
	fi
	# One row each: the boot's capture cut to the row's port (a qperf
	# row's: to its test's connection), checked.
	local row name ok role port log plog secs note pcap cut mode=$VB_MODE dlog=$VB_DLOG
	for row in "${VB_ROWS[@]}"; do
		IFS='|' read -r name ok role port log plog secs note <<< "$row"
		pcap="$work/$name.pcap" cut="tcp port $port"
		if [[ $port == qperf:* ]] && ! cut=$(vb_qperf_cut "$all" "${port#qperf:}"); then
			ok=FAIL cut="tcp port 0"
			note="${note:+$note; }no connection of qperf's test in the capture"
		fi
		tcpdump -r "$all" -w "$pcap" "$cut" 2> /dev/null
		note="${note:+$note; }$secs s"
		report "$name" on 12 12
	done
	unset note
}

echo "== Debian's rping, perftest, qperf, fio and librdmacm's examples over softrnic's libibverbs and librdmacm against the same over Linux siw"
vb_selected=
for t in $VB_TOOLS; do
	for n in "verbs-$t-siw-server" "verbs-$t-siw-client" "xdp-verbs-$t-siw-server" "xdp-verbs-$t-siw-client"; do
		if [ -z "${ONLY:-}" ] || [[ "$n" == *$ONLY* ]]; then vb_selected=1; fi
	done
done
if [ -n "$vb_selected" ]; then
	vb_setup_fail=""
	# Debian's own binaries, unmodified: dpkg checks every file against
	# the package's checksums.
	for t in $VB_TOOLS stdbuf; do command -v "${t%%-*}" > /dev/null || vb_setup_fail="no ${t%%-*}"; done
	for t in $VB_CM; do command -v "$(vb_cm_client "$t")" > /dev/null || vb_setup_fail="no $(vb_cm_client "$t")"; done
	[ -z "$vb_setup_fail" ] && [ -n "$(dpkg -V perftest rdmacm-utils qperf fio 2>&1)" ] && vb_setup_fail="dpkg -V perftest rdmacm-utils qperf fio: $(dpkg -V perftest rdmacm-utils qperf fio 2>&1 | head -1)"
	# qperf: strace watches our server's children, and the guest gets
	# Debian's qperf of its own suite from an initramfs overlay
	VB_OVERLAY=()
	if [ -z "$vb_setup_fail" ] && [ -n "$VB_QPERF" ]; then
		if ! command -v strace > /dev/null; then
			vb_setup_fail="no strace (the qperf rows watch our server's children with it)"
		elif ! o=$(bash hack/siw-debs.sh --cpio "${SIW_QPERF_CACHE:-/var/tmp/softrnic-siw-qperf}" qperf 2> "$work/siw-debs.log"); then
			vb_setup_fail="hack/siw-debs.sh qperf: $(tail -1 "$work/siw-debs.log")"
		else
			VB_OVERLAY+=("$o")
		fi
	fi
	# fio: Debian's fio of the guest's suite and the libraries its binary
	# links that the guest lacks (VB_FIO_DEBS), from an overlay of their
	# own, checked by ELF load closure (siw-debs.sh --elf: by Depends,
	# libdevmapper1.02.1, loaded for librbd1's libcryptsetup12, would
	# also want dmsetup, a program nothing here runs)
	if [ -z "$vb_setup_fail" ] && [ -n "$VB_FIO" ]; then
		# shellcheck disable=SC2086 # the packages are words
		if ! o=$(bash hack/siw-debs.sh --cpio --elf "${SIW_FIO_CACHE:-/var/tmp/softrnic-siw-fio}" fio $VB_FIO_DEBS 2> "$work/siw-debs-fio.log"); then
			vb_setup_fail="hack/siw-debs.sh fio: $(tail -1 "$work/siw-debs-fio.log")"
		else
			VB_OVERLAY+=("$o")
		fi
	fi
	[ -z "$vb_setup_fail" ] && { go run ./verbs/mklib -o "$work/lib" > "$work/mklib.log" 2>&1 || vb_setup_fail="mklib: $(tail -1 "$work/mklib.log")"; }
	[ -z "$vb_setup_fail" ] && [ -n "${VB_LATE_LISTEN_MS:-}" ] && { vb_late_listen_lib || vb_setup_fail="the VB_LATE_LISTEN_MS wrapper did not build"; }
	if [ -n "$vb_setup_fail" ]; then
		results+=("$(printf '%-4s  %-34s %-10s %-4s %s' FAIL "verbs (setup)" - - "$vb_setup_fail")")
	else
		# the MPA mode of every row: revision 2, peer-to-peer with ... (see the top)
		VB_MODE="--rev 2 --p2p write"
		VB_NS=
		trap 'cleanup; ip netns del "$NS" 2>/dev/null; [ -z "$VB_NS" ] || ip netns del "$VB_NS" 2>/dev/null' EXIT
		vb_boot kernel
		vb_boot xdp
	fi
fi
