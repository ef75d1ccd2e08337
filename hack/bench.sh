#!/usr/bin/env bash
# make bench: one run on the two-namespace topology (root): kernel TCP and
# iperf3 beside softrnic, results in bench/ (results.json, bandwidth.png,
# latency.png). MTU=1500 and CRC=true by default.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=$PATH:/usr/local/go/bin
[ "$(id -u)" = 0 ] || { echo "bench: needs root (network namespaces)" >&2; exit 1; }
bash hack/deps.sh test >/dev/null
bin=$(mktemp -d /tmp/softrnic-bench.XXXXXX)
trap 'rm -rf "$bin"' EXIT
go build -o "$bin/" ./cmd/softrnicd ./cmd/softrnic-perf ./cmd/softrnic-bench
go test -c -o "$bin/xsk.test" ./xsk # bare AF_XDP, the ceiling the xdp figures are read against
"$bin/softrnic-bench" --bin "$bin" --out bench --mtu "${MTU:-1500}" --crc="${CRC:-true}" --seconds "${SECONDS_PER_POINT:-1}"
