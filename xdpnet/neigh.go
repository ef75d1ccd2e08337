package xdpnet

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/tcp"
)

// neighbourTTL is how long a MAC read from the kernel is used before it is
// read again; retrigger the least time between two resolution requests
// for one address.
const (
	neighbourTTL = 5 * time.Second
	retrigger    = 200 * time.Millisecond
)

// neighbours is the loop's cache of the kernel's neighbour table for one
// interface, read over a NETLINK_ROUTE socket opened in the Poller's
// namespace. Owned by the loop.
type neighbours struct {
	fd      int
	ifindex int
	seq     uint32
	cache   map[netip.Addr]*neighbour
	// routes maps a destination to its next hop on the interface: the
	// destination itself on the link, or its gateway.
	routes map[netip.Addr]*route
	// events is a second NETLINK_ROUTE socket subscribed to neighbour
	// and IPv4 route changes, drained by follow.
	events int
	// last is the most recent hit (destination, its next hop's entry,
	// when the route was read): most segments go to one peer.
	lastAddr, lastHop netip.Addr
	last              *neighbour
	lastAt            tcp.Time
	buf               []byte
	kernel            unix.SockaddrNetlink // reused for every query
}

type route struct {
	hop       netip.Addr
	ok        bool     // a route through the interface exists
	checkedAt tcp.Time // when the kernel was last asked
}

type neighbour struct {
	mac       [6]byte
	valid     bool     // mac was read from a usable kernel entry once
	checkedAt tcp.Time // when the kernel was last asked
	asked     tcp.Time // when resolution was last triggered
}

func newNeighbours(ifindex int) (*neighbours, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("xdpnet: netlink socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("xdpnet: netlink bind: %w", err)
	}
	// Bound every wait for an answer.
	tv := unix.NsecToTimeval(int64(100 * time.Millisecond))
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("xdpnet: netlink timeout: %w", err)
	}
	ev, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.NETLINK_ROUTE)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("xdpnet: netlink socket: %w", err)
	}
	if err := unix.Bind(ev, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: unix.RTMGRP_NEIGH | unix.RTMGRP_IPV4_ROUTE}); err != nil {
		unix.Close(fd)
		unix.Close(ev)
		return nil, fmt.Errorf("xdpnet: netlink subscribe: %w", err)
	}
	return &neighbours{fd: fd, events: ev, ifindex: ifindex, cache: make(map[netip.Addr]*neighbour),
		routes: make(map[netip.Addr]*route), buf: make([]byte, 4096),
		kernel: unix.SockaddrNetlink{Family: unix.AF_NETLINK}}, nil
}

func (n *neighbours) close() error {
	unix.Close(n.events)
	return unix.Close(n.fd)
}

// follow drains the kernel's notifications of neighbour and route
// changes: a changed entry for an address in the cache is read again at
// its next use, and any route change makes every next hop be looked up
// again. It reports how many notifications it took. The loop calls it
// every sweep, so a change is followed within about 100 ms rather than at
// the next neighbourTTL.
func (n *neighbours) follow() int {
	count := 0
	for {
		k, _, err := unix.Recvfrom(n.events, n.buf, unix.MSG_DONTWAIT)
		if err != nil || k == 0 {
			if err == unix.ENOBUFS { // missed some: forget everything
				n.forget()
				continue
			}
			return count
		}
		nlEach(n.buf[:k], func(h *unix.NlMsghdr, msg []byte) {
			count++
			switch h.Type {
			case unix.RTM_NEWROUTE, unix.RTM_DELROUTE:
				clear(n.routes)
				n.last = nil
			case unix.RTM_NEWNEIGH, unix.RTM_DELNEIGH:
				if len(msg) < unix.SizeofNdMsg {
					return
				}
				if dst, ok := attr4(msg[unix.SizeofNdMsg:], unix.NDA_DST); ok {
					if e := n.cache[dst]; e != nil {
						e.checkedAt, e.valid = 0, false
					}
				}
			}
		})
	}
}

// forget drops every cached answer.
func (n *neighbours) forget() {
	clear(n.routes)
	clear(n.cache)
	n.last = nil
}

// attr finds the attribute of type typ in a netlink attribute list.
func attr(attrs []byte, typ uint16) ([]byte, bool) {
	for len(attrs) >= unix.SizeofRtAttr {
		at := (*unix.RtAttr)(unsafe.Pointer(&attrs[0]))
		if at.Len < unix.SizeofRtAttr || int(at.Len) > len(attrs) {
			break
		}
		if at.Type == typ {
			return attrs[unix.SizeofRtAttr:at.Len], true
		}
		attrs = attrs[min(len(attrs), nlAlign(int(at.Len))):]
	}
	return nil, false
}

// attr4 finds an IPv4 address attribute of type typ.
func attr4(attrs []byte, typ uint16) (netip.Addr, bool) {
	if b, ok := attr(attrs, typ); ok && len(b) == 4 {
		return netip.AddrFrom4([4]byte(b)), true
	}
	return netip.Addr{}, false
}

// nextHop is where a segment to addr goes on the link: addr itself, or the
// gateway of the kernel's route to it (RTM_GETROUTE), read again after
// neighbourTTL or a route change. ok is false when the kernel routes addr
// through another interface, or not at all.
func (n *neighbours) nextHop(now tcp.Time, addr netip.Addr) (netip.Addr, bool) {
	r := n.routes[addr]
	if r == nil {
		r = &route{}
		n.routes[addr] = r
	}
	if r.checkedAt == 0 || now-r.checkedAt >= tcp.Time(neighbourTTL) {
		r.checkedAt = now
		hop, oif, err := n.queryRoute(addr)
		r.ok = err == nil && oif == n.ifindex
		r.hop = hop
	}
	return r.hop, r.ok
}

// lookup returns the MAC to send to addr: its next hop's. Without a usable
// one it asks the kernel to resolve the next hop (at most every retrigger)
// and reports false.
func (n *neighbours) lookup(now tcp.Time, addr netip.Addr) ([6]byte, bool) {
	e := n.last
	if addr != n.lastAddr || e == nil || now-n.lastAt >= tcp.Time(neighbourTTL) {
		hop, ok := n.nextHop(now, addr)
		if !ok {
			n.last = nil
			return [6]byte{}, false
		}
		e = n.cache[hop]
		if e == nil {
			e = &neighbour{}
			n.cache[hop] = e
		}
		n.lastAddr, n.last, n.lastAt, n.lastHop = addr, e, now, hop
	}
	addr = n.lastHop
	if e.valid && now-e.checkedAt < tcp.Time(neighbourTTL) {
		return e.mac, true
	}
	// Unresolved: ask the kernel again only every retrigger, not for
	// every segment that waits (each query is a netlink round trip).
	if !e.valid && e.checkedAt != 0 && now-e.checkedAt < tcp.Time(retrigger) {
		return e.mac, false
	}
	e.checkedAt = now
	mac, ok, err := n.query(addr)
	if err == nil && ok {
		e.mac, e.valid = mac, true
		return mac, true
	}
	if e.asked == 0 || now-e.asked >= tcp.Time(retrigger) {
		e.asked = now
		solicit(addr)
	}
	// A known MAC stays in use while the kernel re-resolves it.
	return e.mac, e.valid
}

// Usable neighbour states: the kernel itself would send to these.
const usableNUD = unix.NUD_REACHABLE | unix.NUD_STALE | unix.NUD_DELAY | unix.NUD_PROBE |
	unix.NUD_PERMANENT | unix.NUD_NOARP

// query asks the kernel for its neighbour entry of addr on the interface
// (RTM_GETNEIGH with NDA_DST, Linux 5.0+). ok is false when there is none
// or it is not usable (incomplete, failed).
func (n *neighbours) query(addr netip.Addr) (mac [6]byte, ok bool, err error) {
	var buf [addrRequestLen]byte
	req := addrRequest(buf[:], unix.NdMsg{Family: unix.AF_INET, Ifindex: int32(n.ifindex)}, unix.NDA_DST, addr)
	msg, errno, err := n.roundTrip(req, unix.RTM_GETNEIGH, unix.RTM_NEWNEIGH)
	switch {
	case err != nil:
		return mac, false, fmt.Errorf("xdpnet: neighbour: %w", err)
	case errno == unix.ENOENT:
		return mac, false, nil
	case errno != 0:
		return mac, false, fmt.Errorf("xdpnet: neighbour request: %w", errno)
	case len(msg) < unix.SizeofNdMsg:
		return mac, false, fmt.Errorf("xdpnet: neighbour answer too short")
	}
	nd := (*unix.NdMsg)(unsafe.Pointer(&msg[0]))
	if nd.State&usableNUD == 0 {
		return mac, false, nil
	}
	if b, ok := attr(msg[unix.SizeofNdMsg:], unix.NDA_LLADDR); ok && len(b) == 6 {
		return [6]byte(b), true, nil
	}
	return mac, false, nil
}

// queryRoute asks the kernel how it would send to addr (RTM_GETROUTE): the
// next hop (the gateway, or addr on the link) and the output interface.
func (n *neighbours) queryRoute(addr netip.Addr) (hop netip.Addr, oif int, err error) {
	var buf [addrRequestLen]byte
	req := addrRequest(buf[:], unix.RtMsg{Family: unix.AF_INET, Dst_len: 32}, unix.RTA_DST, addr)
	msg, errno, err := n.roundTrip(req, unix.RTM_GETROUTE, unix.RTM_NEWROUTE)
	switch {
	case err != nil:
		return hop, 0, fmt.Errorf("xdpnet: route: %w", err)
	case errno != 0:
		return hop, 0, fmt.Errorf("xdpnet: no route to %v: %w", addr, errno)
	case len(msg) < unix.SizeofRtMsg:
		return hop, 0, fmt.Errorf("xdpnet: route answer too short")
	}
	attrs := msg[unix.SizeofRtMsg:]
	hop = addr
	if gw, ok := attr4(attrs, unix.RTA_GATEWAY); ok {
		hop = gw
	}
	if b, ok := attr(attrs, unix.RTA_OIF); ok && len(b) == 4 {
		oif = int(binary.NativeEndian.Uint32(b))
	}
	return hop, oif, nil
}

// addrRequestLen is the length of the longest request addrRequest lays out.
const addrRequestLen = unix.SizeofNlMsghdr + max(unix.SizeofNdMsg, unix.SizeofRtMsg) + unix.SizeofRtAttr + 4

// addrRequest lays out in buf (addrRequestLen octets) a request about one
// IPv4 address: room for the netlink header, which roundTrip fills in,
// then msg, then addr as an attribute of type typ. It returns the request.
func addrRequest[M unix.NdMsg | unix.RtMsg](buf []byte, msg M, typ uint16, addr netip.Addr) []byte {
	off := unix.SizeofNlMsghdr
	*(*M)(unsafe.Pointer(&buf[off])) = msg
	off += int(unsafe.Sizeof(msg))
	*(*unix.RtAttr)(unsafe.Pointer(&buf[off])) = unix.RtAttr{Len: unix.SizeofRtAttr + 4, Type: typ}
	off += unix.SizeofRtAttr
	a4 := addr.As4()
	off += copy(buf[off:], a4[:])
	return buf[:off]
}

// roundTrip sends a request whose header roundTrip fills in (type typ,
// the next sequence number) and returns the payload of the answer of type
// want, or the errno of an NLMSG_ERROR answer. Answers to earlier requests
// that timed out are skipped.
func (n *neighbours) roundTrip(req []byte, typ, want uint16) (msg []byte, errno unix.Errno, err error) {
	n.seq++
	*(*unix.NlMsghdr)(unsafe.Pointer(&req[0])) = unix.NlMsghdr{
		Len: uint32(len(req)), Type: typ, Flags: unix.NLM_F_REQUEST, Seq: n.seq,
	}
	if err := unix.Sendto(n.fd, req, 0, &n.kernel); err != nil {
		return nil, 0, fmt.Errorf("request: %w", err)
	}
	for range 8 {
		k, _, err := unix.Recvfrom(n.fd, n.buf, 0)
		if err != nil {
			return nil, 0, fmt.Errorf("answer: %w", err)
		}
		done := false
		if !nlEach(n.buf[:k], func(h *unix.NlMsghdr, m []byte) {
			if done || h.Seq != n.seq {
				return
			}
			switch h.Type {
			case unix.NLMSG_ERROR:
				done = true
				if len(m) >= 4 {
					errno = unix.Errno(-int32(binary.NativeEndian.Uint32(m)))
				}
				if errno == 0 {
					errno = unix.ENOENT // an acknowledgement, no answer
				}
			case want:
				done, msg = true, m
			}
		}) {
			return nil, 0, errors.New("answer: bad length")
		}
		if done {
			return msg, errno, nil
		}
	}
	return nil, 0, fmt.Errorf("answer: none with sequence %d", n.seq)
}

// nlEach calls fn with each netlink message in b; false if b is malformed.
func nlEach(b []byte, fn func(h *unix.NlMsghdr, msg []byte)) bool {
	for len(b) >= unix.SizeofNlMsghdr {
		h := (*unix.NlMsghdr)(unsafe.Pointer(&b[0]))
		if h.Len < unix.SizeofNlMsghdr || int(h.Len) > len(b) {
			return false
		}
		fn(h, b[unix.SizeofNlMsghdr:h.Len])
		b = b[min(len(b), nlAlign(int(h.Len))):]
	}
	return true
}

func nlAlign(n int) int { return (n + 3) &^ 3 }

// solicit makes the kernel resolve addr: an empty UDP datagram to its
// discard port from a kernel socket goes through the kernel's neighbour
// code, which sends the ARP request and keeps the datagram until the
// answer (the ARP reply passes the steering program to the kernel).
func solicit(addr netip.Addr) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	_ = unix.Sendto(fd, nil, 0, &unix.SockaddrInet4{Port: 9, Addr: addr.As4()})
}
