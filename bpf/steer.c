//go:build ignore

// XDP steering program of the softrnic software RNIC.
//
// Every received frame is classified once: TCP segments that belong to the
// RNIC (a 4-tuple in `flows`, or a SYN without ACK to a port in
// `listen_ports`) are redirected to the AF_XDP socket bound to the receive
// queue they arrived on (`xsks`); everything else, and anything we cannot
// parse, goes to the kernel stack untouched (XDP_PASS). The program never
// drops: a frame we do not own, or cannot prove we own, is the kernel's.
//
// The parser reads no further into TCP than the 4-tuple and the flags
// (DESIGN.md, bpf/): options, sequence numbers and payload are the
// userspace engine's business.
//
// Byte order: every address and port in the maps is in network order, as it
// sits in the packet, so the fast path never swaps.

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

// Wire constants. Header layouts are read at fixed offsets rather than
// through the kernel's struct definitions, so only linux/bpf.h (map types,
// struct xdp_md, XDP actions) is needed from the UAPI.
#define ETH_HLEN 14 // destination, source, EtherType
#define VLAN_HLEN 4 // TCI, encapsulated EtherType
#define MAX_VLAN_TAGS 2

#define ETH_P_IP 0x0800
#define ETH_P_IPV6 0x86DD
#define ETH_P_8021Q 0x8100
#define ETH_P_8021AD 0x88A8

#define IPV4_MIN_HLEN 20
#define IPV4_OFF_FRAG 6 // flags (3 bits) and fragment offset (13 bits)
#define IPV4_OFF_PROTO 9
#define IPV4_OFF_SADDR 12
#define IPV4_OFF_DADDR 16
#define IPV4_MF 0x2000
#define IPV4_FRAG_OFFSET 0x1FFF

#define IPPROTO_TCP 6

#define TCP_MIN_HLEN 20
#define TCP_OFF_SPORT 0
#define TCP_OFF_DPORT 2
#define TCP_OFF_FLAGS 13 // CWR ECE URG ACK PSH RST SYN FIN
#define TCP_FLAG_SYN 0x02
#define TCP_FLAG_ACK 0x10

// Counter indices of the `stats` map. The Go loader reads them in this order
// (statOrder in stats.go); append only, never renumber.
enum steer_stat {
	STAT_STEERED_FLOW = 0,   // segment of a flow in `flows`
	STAT_STEERED_LISTEN,     // SYN (no ACK) to a port in `listen_ports`
	STAT_PASSED_NOT_IP,      // EtherType neither IPv4 nor (later) IPv6
	STAT_PASSED_NOT_TCP,     // IP, but not TCP
	STAT_PASSED_NO_MATCH,    // TCP, but neither a flow nor a listened-to SYN
	STAT_PASSED_FRAGMENT,    // IPv4 fragment (first or later)
	STAT_PASSED_MALFORMED,   // truncated or invalid header; passed, not dropped
	STAT_REDIRECT_FAILED,    // steered, but no AF_XDP socket on the queue: passed
	STAT_MAX,
};

// Key of `flows`: the 4-tuple as it appears in a received segment, so
// saddr/sport are the remote end and daddr/dport the local one. 12 bytes,
// no padding.
struct flow_key {
	__u32 saddr; // network order
	__u32 daddr; // network order
	__u16 sport; // network order
	__u16 dport; // network order
};

// flows: established or connecting RNIC flows -> flags / queue hint
// (reserved; the program only tests presence).
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct flow_key);
	__type(value, __u32);
	__uint(max_entries, 65536);
} flows SEC(".maps");

// listen_ports: local TCP ports (network order) the RNIC listens on -> unused
// byte. Only SYNs without ACK are steered by this map; later segments of an
// accepted connection are steered by `flows`.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u16);
	__type(value, __u8);
	__uint(max_entries, 1024);
} listen_ports SEC(".maps");

// xsks: receive queue index -> AF_XDP socket bound to that queue.
struct {
	__uint(type, BPF_MAP_TYPE_XSKMAP);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 64);
} xsks SEC(".maps");

// stats: per-CPU counters indexed by enum steer_stat.
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, STAT_MAX);
} stats SEC(".maps");

static __always_inline void count(__u32 reason)
{
	__u64 *n = bpf_map_lookup_elem(&stats, &reason);

	if (n)
		*n += 1; // per-CPU slot: no other writer
}

static __always_inline int pass(__u32 reason)
{
	count(reason);
	return XDP_PASS;
}

// redirect hands the frame to the AF_XDP socket of its receive queue. With
// no socket in that slot the helper returns the fallback action, XDP_PASS,
// and the kernel stack gets the frame (and answers an unowned SYN with RST)
// rather than losing it.
static __always_inline int redirect(struct xdp_md *ctx, __u32 reason)
{
	long act = bpf_redirect_map(&xsks, ctx->rx_queue_index, XDP_PASS);

	count(reason);
	if (act != XDP_REDIRECT)
		count(STAT_REDIRECT_FAILED);
	return act;
}

// steer_tcp classifies a TCP segment whose IP header has been validated.
// l4 points at the TCP header; saddr/daddr are the IPv4 addresses in
// network order.
static __always_inline int steer_tcp(struct xdp_md *ctx, void *l4, void *end,
				     __u32 saddr, __u32 daddr)
{
	if (l4 + TCP_MIN_HLEN > end)
		return pass(STAT_PASSED_MALFORMED);

	struct flow_key key = {
		.saddr = saddr,
		.daddr = daddr,
		.sport = *(__u16 *)(l4 + TCP_OFF_SPORT),
		.dport = *(__u16 *)(l4 + TCP_OFF_DPORT),
	};
	if (bpf_map_lookup_elem(&flows, &key))
		return redirect(ctx, STAT_STEERED_FLOW);

	__u8 flags = *(__u8 *)(l4 + TCP_OFF_FLAGS);
	if ((flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN &&
	    bpf_map_lookup_elem(&listen_ports, &key.dport))
		return redirect(ctx, STAT_STEERED_LISTEN);

	return pass(STAT_PASSED_NO_MATCH);
}

// steer_ipv4 validates the IPv4 header at l3 and hands TCP to steer_tcp.
static __always_inline int steer_ipv4(struct xdp_md *ctx, void *l3, void *end)
{
	if (l3 + IPV4_MIN_HLEN > end)
		return pass(STAT_PASSED_MALFORMED);

	__u8 vihl = *(__u8 *)l3;
	__u32 hlen = (vihl & 0x0F) * 4;
	if ((vihl >> 4) != 4 || hlen < IPV4_MIN_HLEN)
		return pass(STAT_PASSED_MALFORMED);

	__u16 frag = *(__u16 *)(l3 + IPV4_OFF_FRAG);
	if (frag & bpf_htons(IPV4_MF | IPV4_FRAG_OFFSET))
		return pass(STAT_PASSED_FRAGMENT);

	if (*(__u8 *)(l3 + IPV4_OFF_PROTO) != IPPROTO_TCP)
		return pass(STAT_PASSED_NOT_TCP);

	// hlen is at most 60, so the verifier can bound l4.
	return steer_tcp(ctx, l3 + hlen, end, *(__u32 *)(l3 + IPV4_OFF_SADDR),
			 *(__u32 *)(l3 + IPV4_OFF_DADDR));
}

SEC("xdp")
int xdp_steer(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;

	if (data + ETH_HLEN > end)
		return pass(STAT_PASSED_MALFORMED);

	void *l3 = data + ETH_HLEN;
	__u16 proto = *(__u16 *)(l3 - 2);

	// Up to two VLAN tags (802.1ad outer, 802.1Q inner); a third stays
	// unparsed and the frame goes to the kernel as not-IP.
#pragma unroll
	for (int i = 0; i < MAX_VLAN_TAGS; i++) {
		if (proto != bpf_htons(ETH_P_8021Q) && proto != bpf_htons(ETH_P_8021AD))
			break;
		if (l3 + VLAN_HLEN > end)
			return pass(STAT_PASSED_MALFORMED);
		proto = *(__u16 *)(l3 + 2);
		l3 += VLAN_HLEN;
	}

	switch (proto) {
	case bpf_htons(ETH_P_IP):
		return steer_ipv4(ctx, l3, end);
	// case bpf_htons(ETH_P_IPV6): steer_ipv6 with a flows6 map keyed by
	// 16-byte addresses, once the engine speaks IPv6.
	default:
		return pass(STAT_PASSED_NOT_IP);
	}
}

// The kernel gates GPL-only helpers on a GPL-compatible license string.
char LICENSE[] SEC("license") = "Dual BSD/GPL";
