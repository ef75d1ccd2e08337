package xdpnet

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/tcp"
)

// neighbourTTL is how long a MAC read from the kernel is used before it is
// read again; retrigger the least time between two resolution requests
// for one address; queryTimeout bounds the wait for the kernel's answer.
const (
	neighbourTTL = 5 * time.Second
	retrigger    = 200 * time.Millisecond
	queryTimeout = 100 * time.Millisecond
)

// neighbours is the loop's cache of the kernel's neighbour table for one
// interface and of its routes through it, read with
// github.com/vishvananda/netlink over NETLINK_ROUTE sockets opened in the
// Poller's namespace. Owned by the loop.
//
// A query is a round trip to the kernel that the loop waits for: about
// 14 µs and 39 allocations for a destination's route and neighbour
// together through the library, against 3.5 µs and 4 written by hand
// (BenchmarkNeigh/Refresh, 2 cores). Each destination pays it once per
// neighbourTTL, and Connect to a destination not cached; a segment never
// does: the cache answers it in about 5 ns without a system call or an
// allocation (BenchmarkNeigh/Hit).
type neighbours struct {
	ifindex int
	// handle asks for routes (RTM_GETROUTE, Handle.RouteGet).
	handle *netlink.Handle
	// neighSocket carries the RTM_GETNEIGH requests about one address
	// (NDA_DST, Linux 5.0+), made with the library's nl package (which
	// takes the socket in a map): its NeighList dumps the whole table,
	// which costs a millisecond and three thousand allocations per
	// lookup on a host that knows a thousand neighbours.
	neighSocket map[int]*nl.SocketHandle
	// events is subscribed to neighbour and IPv4 route changes, drained
	// by follow.
	events *nl.NetlinkSocket
	cache  map[netip.Addr]*neighbour
	// routes maps a destination to its next hop on the interface: the
	// destination itself on the link, or its gateway.
	routes map[netip.Addr]*route
	// last is the most recent hit (destination, its next hop's entry,
	// when the route was read): most segments go to one peer.
	lastAddr, lastHop netip.Addr
	last              *neighbour
	lastAt            tcp.Time
	buf               []byte // follow's
}

type route struct {
	hop       netip.Addr
	state     routeState
	checkedAt tcp.Time // when the kernel was last asked
}

// routeState is what the kernel said of a route to a destination.
type routeState uint8

const (
	// routeUnknown: the query failed (interrupted, timed out); it is
	// asked again after retrigger, and means neither yes nor no.
	routeUnknown routeState = iota
	// routed: through the interface.
	routed
	// notRouted: through another interface, or unreachable.
	notRouted
)

type neighbour struct {
	mac       [6]byte
	valid     bool     // mac was read from a usable kernel entry once
	checkedAt tcp.Time // when the kernel was last asked
	asked     tcp.Time // when resolution was last triggered
}

// newNeighbours opens the sockets in the calling thread's network
// namespace.
func newNeighbours(ifindex int) (_ *neighbours, err error) {
	n := &neighbours{ifindex: ifindex, cache: make(map[netip.Addr]*neighbour),
		routes: make(map[netip.Addr]*route), buf: make([]byte, 4096)}
	defer func() {
		if err != nil {
			n.close()
		}
	}()
	if n.handle, err = netlink.NewHandle(unix.NETLINK_ROUTE); err != nil {
		return nil, fmt.Errorf("xdpnet: netlink: %w", err)
	}
	if err := n.handle.SetSocketTimeout(queryTimeout); err != nil {
		return nil, fmt.Errorf("xdpnet: netlink timeout: %w", err)
	}
	s, err := nl.GetNetlinkSocketAt(netns.None(), netns.None(), unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("xdpnet: netlink: %w", err)
	}
	n.neighSocket = map[int]*nl.SocketHandle{unix.NETLINK_ROUTE: {Socket: s}}
	tv := unix.NsecToTimeval(int64(queryTimeout))
	_ = s.SetSendTimeout(&tv)    // cannot fail
	_ = s.SetReceiveTimeout(&tv) // cannot fail
	if n.events, err = nl.Subscribe(unix.NETLINK_ROUTE, unix.RTNLGRP_NEIGH, unix.RTNLGRP_IPV4_ROUTE); err != nil {
		return nil, fmt.Errorf("xdpnet: netlink subscribe: %w", err)
	}
	return n, nil
}

func (n *neighbours) close() {
	if n.handle != nil {
		n.handle.Close()
	}
	for _, sh := range n.neighSocket {
		sh.Close()
	}
	if n.events != nil {
		n.events.Close()
	}
}

// follow drains the kernel's notifications of neighbour and route
// changes: a changed entry for an address in the cache is read again at
// its next use, and any route change makes every next hop be looked up
// again. It reports how many notifications it took. The loop calls it
// every sweep, so a change is followed within about 100 ms rather than at
// the next neighbourTTL.
//
// The socket is read here without waiting, not with the library's
// Receive, which waits for a message when none is queued, nor with its
// NeighSubscribe and RouteSubscribe, which run a goroutine each that ends
// at the first overflow (ENOBUFS); this drain forgets everything then and
// carries on.
func (n *neighbours) follow() int {
	count := 0
	for {
		k, _, err := unix.Recvfrom(n.events.GetFd(), n.buf, unix.MSG_DONTWAIT)
		if err != nil || k == 0 {
			if err == unix.ENOBUFS { // missed some: forget everything
				n.forget()
				continue
			}
			return count
		}
		msgs, err := syscall.ParseNetlinkMessage(n.buf[:k])
		if err != nil {
			continue
		}
		for _, m := range msgs {
			count++
			switch m.Header.Type {
			case unix.RTM_NEWROUTE, unix.RTM_DELROUTE:
				clear(n.routes)
				n.last = nil
			case unix.RTM_NEWNEIGH, unix.RTM_DELNEIGH:
				// IPv4 only: struct ndmsg starts with the family.
				if len(m.Data) < unix.SizeofNdMsg || m.Data[0] != unix.AF_INET {
					continue
				}
				if e, err := netlink.NeighDeserialize(m.Data); err == nil {
					if c := n.cache[addrOf(e.IP)]; c != nil {
						c.checkedAt, c.valid = 0, false
					}
				}
			}
		}
	}
}

// forget drops every cached answer.
func (n *neighbours) forget() {
	clear(n.routes)
	clear(n.cache)
	n.last = nil
}

// nextHop is where a segment to addr goes on the link: addr itself, or the
// gateway of the kernel's route to it (RTM_GETROUTE), read again after
// neighbourTTL or a route change. The state is notRouted when the kernel
// routes addr through another interface, or not at all; routeUnknown when
// it could not be asked just now. A failed query is not an answer: cached
// for neighbourTTL as one, a netlink read cut short (under load the Go
// runtime's preemption signal interrupts it) made every Connect to the
// peer fail as unreachable for five seconds.
func (n *neighbours) nextHop(now tcp.Time, addr netip.Addr) (netip.Addr, routeState) {
	r := n.routes[addr]
	if r == nil {
		r = &route{}
		n.routes[addr] = r
	}
	again := tcp.Time(neighbourTTL)
	if r.state == routeUnknown {
		again = tcp.Time(retrigger)
	}
	if r.checkedAt == 0 || now-r.checkedAt >= again {
		r.checkedAt = now
		hop, oif, err := n.queryRoute(addr)
		switch {
		case err == nil && oif == n.ifindex:
			r.hop, r.state = hop, routed
		case err == nil || noRoute(err):
			r.state = notRouted
		case r.state == routed:
			// Keep the route known while the kernel cannot be
			// asked, as lookup keeps a known MAC.
		default:
			r.state = routeUnknown
		}
	}
	return r.hop, r.state
}

// noRoute reports whether a route query's error is the kernel's answer
// that there is no route, rather than a failure to ask.
func noRoute(err error) bool {
	return errors.Is(err, unix.ENETUNREACH) || errors.Is(err, unix.EHOSTUNREACH) ||
		errors.Is(err, unix.EACCES) || errors.Is(err, unix.EINVAL) || errors.Is(err, errNoRoutes)
}

// lookup returns the MAC to send to addr: its next hop's. Without a usable
// one it asks the kernel to resolve the next hop (at most every retrigger)
// and reports false.
func (n *neighbours) lookup(now tcp.Time, addr netip.Addr) ([6]byte, bool) {
	e := n.last
	if addr != n.lastAddr || e == nil || now-n.lastAt >= tcp.Time(neighbourTTL) {
		hop, st := n.nextHop(now, addr)
		if st != routed {
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
	req := nl.NewNetlinkRequest(unix.RTM_GETNEIGH, 0)
	req.Sockets = n.neighSocket
	req.AddData(&netlink.Ndmsg{Family: unix.AF_INET, Index: uint32(n.ifindex)})
	a4 := addr.As4()
	req.AddData(nl.NewRtAttr(unix.NDA_DST, a4[:]))
	msgs, err := req.Execute(unix.NETLINK_ROUTE, unix.RTM_NEWNEIGH)
	switch {
	case errors.Is(err, unix.ENOENT):
		return mac, false, nil
	case err != nil:
		return mac, false, fmt.Errorf("xdpnet: neighbour %v: %w", addr, err)
	case len(msgs) == 0: // an acknowledgement, no answer
		return mac, false, nil
	}
	e, err := netlink.NeighDeserialize(msgs[0])
	if err != nil {
		return mac, false, fmt.Errorf("xdpnet: neighbour %v: %w", addr, err)
	}
	if e.State&usableNUD == 0 || len(e.HardwareAddr) != len(mac) {
		return mac, false, nil
	}
	return [6]byte(e.HardwareAddr), true, nil
}

// errNoRoutes: the kernel answered a route query with no route.
var errNoRoutes = errors.New("no route")

// queryRoute asks the kernel how it would send to addr (RTM_GETROUTE): the
// next hop (the gateway, or addr on the link) and the output interface.
func (n *neighbours) queryRoute(addr netip.Addr) (hop netip.Addr, oif int, err error) {
	var routes []netlink.Route
	// An interrupted read is asked again at once, a few times.
	for range 3 {
		if routes, err = n.handle.RouteGet(net.IP(addr.AsSlice())); !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		return hop, 0, fmt.Errorf("xdpnet: route to %v: %w", addr, err)
	}
	if len(routes) == 0 {
		return hop, 0, fmt.Errorf("xdpnet: route to %v: %w", addr, errNoRoutes)
	}
	hop = addr
	if gw := addrOf(routes[0].Gw); gw.IsValid() {
		hop = gw
	}
	return hop, routes[0].LinkIndex, nil
}

// addrOf is ip as a netip.Addr, IPv4 unmapped; the zero Addr for none.
func addrOf(ip net.IP) netip.Addr {
	a, _ := netip.AddrFromSlice(ip)
	return a.Unmap()
}

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
