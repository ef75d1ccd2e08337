#!/usr/bin/env bash
# make bench: one run on the two-namespace topology (root): kernel TCP and
# iperf3 beside softrnic, results in bench/ (results.json, bandwidth.png,
# latency.png). MTU=1500 and CRC=true by default.
#
# BASELINE (default 09109c8, the tree at the start of issue 15) is a git
# ref whose softrnicd and softrnic-perf are built in a temporary worktree
# and alternated with this tree's, for issue 15's targets; BASELINE= (empty)
# skips that. A ref that cannot be built is reported and the run goes on.
# ROUNDS (default 5) is how many times each is measured, alternately.
#
# Then issue 16's scale benchmark (softrnic-scale): SCALE_N QPs (default
# 10000) per daemon pair on each datapath, its table after the others and
# its figures under "scale" in bench/results.json. SCALE_N=0 skips it.
#
# Before it, issue 18's TCP loss grid (softrnic-lossgrid), under
# "lossgrid" in results.json, LOSSGRID_ROUNDS (default 3) rounds whose
# medians the targets are read from. LOSSGRID=0 skips it.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=$PATH:/usr/local/go/bin
[ "$(id -u)" = 0 ] || { echo "bench: needs root (network namespaces)" >&2; exit 1; }
bash hack/deps.sh test >/dev/null
bin=$(mktemp -d /tmp/softrnic-bench.XXXXXX)
wt="" # the baseline's worktree, once added
cleanup() {
	if [ -n "$wt" ]; then
		git worktree remove --force "$wt" || echo "bench: could not remove worktree $wt" >&2
	fi
	rm -rf "$bin"
}
trap cleanup EXIT
go build -o "$bin/" ./cmd/softrnicd ./cmd/softrnic-perf ./cmd/softrnic-bench
go test -c -o "$bin/xsk.test" ./xsk # bare AF_XDP, the ceiling the xdp figures are read against

# The old build goes in $bin/old; a failure leaves --baseline out and says
# why in the run's alternation lines.
baseline=${BASELINE-09109c8}
base=()
if [ -n "$baseline" ]; then
	base=(--baseline-ref "$baseline")
	if git worktree add --detach "$bin/src" "$baseline" >/dev/null; then
		wt=$bin/src
		if (cd "$wt" && go build -o "$bin/old/" ./cmd/softrnicd ./cmd/softrnic-perf); then
			base+=(--baseline "$bin/old")
		else
			echo "bench: could not build baseline $baseline" >&2
		fi
	else
		echo "bench: no worktree for baseline $baseline" >&2
	fi
fi
"$bin/softrnic-bench" --bin "$bin" --out bench --mtu "${MTU:-1500}" --crc="${CRC:-true}" --seconds "${SECONDS_PER_POINT:-1}" --rounds "${ROUNDS:-5}" "${base[@]}"

# The TCP loss grid (issue 18): Linux ↔ Linux beside the engine over one
# impaired link, LOSSGRID_SECONDS (default 3) per stream; LOSSGRID=0 skips.
if [ "${LOSSGRID:-1}" != 0 ]; then
	go build -o "$bin/" ./cmd/softrnic-lossgrid
	"$bin/softrnic-lossgrid" --seconds "${LOSSGRID_SECONDS:-3}" --rounds "${LOSSGRID_ROUNDS:-3}" --results bench/results.json
fi

# Scale: after softrnic-bench, which writes bench/results.json anew, so
# that the figures are added to this run's file. Daemons and clients run
# with a systemd service's descriptor limit where the host allows it
# (softrnic-scale says when it does not).
if [ "${SCALE_N:-10000}" != 0 ]; then
	go build -o "$bin/" ./cmd/softrnic-scale
	"$bin/softrnic-scale" --bin "$bin" -n "${SCALE_N:-10000}" --results bench/results.json
fi
