#!/usr/bin/env bash
# Installs what the tests and tools need and the machine lacks: Debian packages
# (apt-get update first, only when something is missing) and Go tools into
# .tools/. Safe to run again; does nothing when everything is there.
#
#   hack/deps.sh build  # packages the build needs (the DAT headers, libdat2)
#   hack/deps.sh test   # packages the tests use, and the build's
#   hack/deps.sh lint   # staticcheck
set -euo pipefail
cd "$(dirname "$0")/.."

# command -> Debian package
declare -A test_pkgs=(
	[ip]=iproute2
	[ethtool]=ethtool
	[tshark]=tshark
	[tcpdump]=tcpdump
	[ping]=iputils-ping
	[iperf3]=iperf3
	[sysctl]=procps   # topology.NewTunPeer, header kernel tests
	[clang]=clang     # bpf: make generate, TestGeneratedUpToDate
	[llvm-strip]=llvm # bpf: bpf2go strips DWARF from the object
	[ibv_devinfo]=ibverbs-utils # verbs: Debian's own ibv_devinfo over our libibverbs
	# systest: Debian's verbs programs over our libibverbs and librdmacm
	[ib_write_bw]=perftest
	[rping]=rdmacm-utils
	[qperf]=qperf
	[fio]=fio
)

# file -> Debian package, for packages that bring no command
declare -A test_files=(
	[/usr/include/bpf/bpf_helpers.h]=libbpf-dev # bpf: libbpf headers
	[/usr/bin/dtest]=dapl2-utils                # systest: dtest, dapltest
	# verbs/abi: the export tables the libibverbs and librdmacm
	# replacements must equal (issue 22)
	[/usr/lib/x86_64-linux-gnu/libibverbs.so.1]=libibverbs1
	[/usr/lib/x86_64-linux-gnu/librdmacm.so.1]=librdmacm1
)

# What the build needs: the uDAPL provider (dapl/) compiles against the DAT
# headers and links libdat2 (libdapl-dev brings both); verbs/ against
# libibverbs' headers.
declare -A build_files=(
	[/usr/include/dat2/udat.h]=libdapl-dev
	# the libibverbs replacement (verbs/) compiles against rdma-core's headers
	[/usr/include/infiniband/verbs.h]=libibverbs-dev
	[/usr/include/rdma/rdma_cma.h]=librdmacm-dev
)

apt_install() {
	[ $# -gt 0 ] || return 0
	if [ "$(id -u)" != 0 ]; then
		echo "deps: missing Debian packages: $*; not root, so not installing (tests that need them skip)" >&2
		return 0
	fi
	echo "deps: installing $*" >&2
	export DEBIAN_FRONTEND=noninteractive
	# tshark asks whether non-root users may capture; answer no.
	echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

build_missing() {
	for file in "${!build_files[@]}"; do
		[ -e "$file" ] || missing+=("${build_files[$file]}")
	done
}

case "${1:-test}" in
build)
	missing=()
	build_missing
	apt_install $(printf '%s\n' "${missing[@]}" | sort -u)
	;;
test)
	missing=()
	build_missing
	for cmd in "${!test_pkgs[@]}"; do
		command -v "$cmd" >/dev/null 2>&1 || missing+=("${test_pkgs[$cmd]}")
	done
	for file in "${!test_files[@]}"; do
		[ -e "$file" ] || missing+=("${test_files[$file]}")
	done
	apt_install $(printf '%s\n' "${missing[@]}" | sort -u)
	;;
lint)
	GO=${GO:-go}
	version=v0.8.2
	if ! [ -x .tools/staticcheck ] || ! .tools/staticcheck -version 2>/dev/null | grep -q "(${version#v})"; then
		echo "deps: installing staticcheck $version into .tools/" >&2
		GOBIN="$PWD/.tools" "$GO" install "honnef.co/go/tools/cmd/staticcheck@$version"
	fi
	;;
*)
	echo "usage: hack/deps.sh build|test|lint" >&2
	exit 2
	;;
esac
