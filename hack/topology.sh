#!/usr/bin/env bash
# Two hosts for people: network namespaces joined by one veth pair, the same
# network internal/topology builds for the tests.
#
#   hack/topology.sh up   [--name N] [--mtu M] [--queues Q] [--offloads] [--addr-a A/P] [--addr-b B/P]
#   hack/topology.sh down [--name N]
#   hack/topology.sh exec [--name N] a|b CMD...   # run CMD inside host a or b
#
# Defaults: name srn, namespaces srn-a and srn-b, links veth-a and veth-b,
# 192.0.2.1/24 and 192.0.2.2/24, MTU 1500, 1 queue, TX checksum/TSO/GSO off.
set -euo pipefail

usage() { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }

[ $# -ge 1 ] || usage
verb=$1; shift
name=srn mtu=1500 queues=1 offloads=0 addr_a=192.0.2.1/24 addr_b=192.0.2.2/24

if [ "$verb" = exec ]; then
	if [ "${1:-}" = --name ]; then name=$2; shift 2; fi
	[ $# -ge 2 ] || usage
	side=$1; shift
	case "$side" in a|b) ;; *) usage ;; esac
	exec ip netns exec "$name-$side" "$@"
fi

while [ $# -gt 0 ]; do
	case "$1" in
	--name) name=$2; shift 2 ;;
	--mtu) mtu=$2; shift 2 ;;
	--queues) queues=$2; shift 2 ;;
	--offloads) offloads=1; shift ;;
	--addr-a) addr_a=$2; shift 2 ;;
	--addr-b) addr_b=$2; shift 2 ;;
	*) usage ;;
	esac
done
[ "$(id -u)" = 0 ] || { echo "topology.sh: needs root (network namespaces)" >&2; exit 1; }

down() {
	for side in a b; do
		ns=$name-$side
		[ -e "/run/netns/$ns" ] || continue
		pids=$(ip netns pids "$ns" || true)
		[ -z "$pids" ] || kill -KILL $pids 2>/dev/null || true
		ip netns del "$ns"
	done
}

case "$verb" in
up)
	for side in a b; do
		if [ -e "/run/netns/$name-$side" ]; then
			echo "topology.sh: namespace $name-$side exists; run: $0 down --name $name" >&2
			exit 1
		fi
	done
	trap 'down' ERR
	ip netns add "$name-a"
	ip netns add "$name-b"
	ip link add veth-a netns "$name-a" numtxqueues "$queues" numrxqueues "$queues" type veth \
		peer name veth-b netns "$name-b" numtxqueues "$queues" numrxqueues "$queues"
	for side in a b; do
		ns=$name-$side
		if [ $side = a ]; then addr=$addr_a; else addr=$addr_b; fi
		ip -n "$ns" link set lo up
		ip -n "$ns" link set "veth-$side" mtu "$mtu"
		ip -n "$ns" addr add "$addr" dev "veth-$side"
		ip -n "$ns" link set "veth-$side" up
		if [ "$offloads" = 0 ]; then
			ip netns exec "$ns" ethtool -K "veth-$side" tx off tso off gso off >/dev/null
		fi
	done
	trap - ERR
	echo "up: $name-a (veth-a ${addr_a}) <-> $name-b (veth-b ${addr_b}), mtu $mtu, queues $queues"
	;;
down)
	down
	echo "down: $name-a, $name-b"
	;;
*) usage ;;
esac
