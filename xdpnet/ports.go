package xdpnet

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/bpf"
	"github.com/softrnic/softrnic/internal/shrink"
	"github.com/softrnic/softrnic/tcp"
)

// flow is a 4-tuple the poller added to the steering program's flow map.
type flow struct {
	id    tcp.FourTuple
	added tcp.Time
	// idx is the flow's place in Poller.flowList (sweep's order).
	idx int
	// seen: the sweep found the connection in the Stack once.
	seen bool
	// active: the connection was opened from here, on a local port of
	// the port table; a passive one's port is its listener's.
	active bool
	// reserve is the kernel socket that holds an imported connection's
	// local port (reserveFD), if one could be bound.
	reserve   int
	reserveFD bool
	// The stall check (checkConn): what the connection had moved to
	// when the sweep last saw it move, when that was, and whether this
	// episode was reported.
	una         tcp.Seq
	in          uint64
	movedAt     tcp.Time
	stallReport bool
}

// listen is a port the poller listens on.
type listen struct {
	l       *tcp.Listener
	reserve int
}

// synGrace is how long a passive flow may exist without a connection in
// the Stack: a SYN answered with a SYN cookie has none until its ACK.
const synGrace = 5 * time.Second

// sweepShare is the share of the flows one sweep looks at (one in
// sweepShare), and sweepMin the least: a sweep costs a bounded part of a
// turn, whatever the number of flows, and still comes round to every flow
// within sweepShare sweeps (a second at 10,000 flows). Looking at all
// 10,000 every 100 ms took the loop out of its turn for about half a
// millisecond each time.
const (
	sweepShare = 10
	sweepMin   = 256
)

// reservePort binds a kernel TCP socket (not listening) to addr and port,
// so that no kernel socket can take the port; port 0 lets the kernel pick
// an ephemeral one, which is returned. It runs on the loop's thread, in the
// Poller's namespace.
func reservePort(addr netip.Addr, port uint16) (fd int, got uint16, err error) {
	fd, err = unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, 0, fmt.Errorf("reserve port: socket: %w", resourceErr(err))
	}
	if port != 0 {
		// A listener's port. A kernel connection that used the port
		// lately holds it in TIME_WAIT for a minute: the reservation
		// takes it all the same, as any server's SO_REUSEADDR lets it
		// (dapltest's port 62000 right after a run on the kernel
		// datapath). So that no other socket can then bind it (with
		// SO_REUSEADDR, as Go's net.Listen does), the reservation
		// listens, behind a filter that drops every segment: the
		// kernel never answers on the engine's port (a SYN that
		// reaches it, from this host, gets no answer).
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
			unix.Close(fd)
			return -1, 0, fmt.Errorf("reserve port: SO_REUSEADDR: %w", err)
		}
		drop := []unix.SockFilter{{Code: unix.BPF_RET | unix.BPF_K, K: 0}}
		if err := unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER,
			&unix.SockFprog{Len: uint16(len(drop)), Filter: &drop[0]}); err != nil {
			unix.Close(fd)
			return -1, 0, fmt.Errorf("reserve port: socket filter: %w", err)
		}
	}
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: addr.As4(), Port: int(port)}); err != nil {
		unix.Close(fd)
		switch {
		case port == 0 && errors.Is(err, unix.EADDRINUSE):
			// Linux says EADDRINUSE when no ephemeral port is left.
			return -1, 0, fmt.Errorf("reserve port on %v: %w", addr, portsErr(err))
		case errors.Is(err, unix.EADDRINUSE):
			return -1, 0, fmt.Errorf("reserve port %v:%d: %w: %w", addr, port, tcp.ErrPortInUse, err)
		}
		return -1, 0, fmt.Errorf("reserve port %v:%d: %w", addr, port, resourceErr(err))
	}
	if port != 0 {
		if err := unix.Listen(fd, 0); err != nil {
			unix.Close(fd)
			return -1, 0, fmt.Errorf("reserve port %v:%d: listen: %w", addr, port, err)
		}
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		unix.Close(fd)
		return -1, 0, fmt.Errorf("reserve port: getsockname: %w", err)
	}
	return fd, uint16(sa.(*unix.SockaddrInet4).Port), nil
}

// portTable holds the local ports of the active connections of one
// address: one kernel socket per port (reservePort), however many
// connections use the port, since the steering program and the Stacks
// tell connections apart by their 4-tuples, not their local ports. A
// connection takes a port already held whose 4-tuple with its remote end
// is free, and only when there is none does the kernel reserve another
// one: N connections to one remote end (one server's port) hold N ports
// and N sockets, as each needs a port of its own, but connections to M
// remote ends (an MPI job's peers) hold as many ports as the most any one
// of them has. A port goes back to the kernel, its socket closed, with the
// last flow that used it. (Reserving the engine's ports without a socket
// each, through net.ipv4.ip_local_reserved_ports, would keep only the
// kernel's own port picking off them, not an application that binds a
// port explicitly, and it changes the whole namespace: the design keeps
// the guarantee that no kernel socket can collide with an RNIC flow.)
//
// The pollers of a Group share one table, since a flow may move between
// them; mu guards it, and is held only for table lookups and the
// reservation system calls, never across a call into a Stack.
type portTable struct {
	addr netip.Addr

	mu    sync.Mutex
	ports map[uint16]*reservation
	list  []*reservation // the same, in the order acquire scans them
	// used are the (local port, remote end) pairs of active flows;
	// remotes what the table knows of each remote end.
	used    map[portRemote]struct{}
	remotes map[netip.AddrPort]*remoteEnd
	// The maps' high-water marks (shrink).
	portsMost, usedMost, remotesMost int
	// nheld is len(list), for held.
	nheld atomic.Int64
}

// remoteEnd is a remote end's share of the table: how many of its flows
// hold ports, and where in list its next scan starts. Each remote end
// scans list in order from its own cursor, so that its flows take the
// held ports one after the other and the first port tried is usually
// free for it.
type remoteEnd struct {
	flows, cursor int
}

// reservation is a local port held for active connections.
type reservation struct {
	fd   int
	port uint16
	refs int // active flows on the port
	idx  int // in portTable.list
}

type portRemote struct {
	port   uint16
	remote netip.AddrPort
}

// probeLimit bounds how many held ports acquire tries for one connection
// before it reserves a new one: the table's cost per connection stays
// bounded when most held ports are busy towards the remote end asked for.
const probeLimit = 32

func newPortTable(addr netip.Addr) *portTable {
	return &portTable{addr: addr, ports: map[uint16]*reservation{}, used: map[portRemote]struct{}{},
		remotes: map[netip.AddrPort]*remoteEnd{}}
}

// acquire returns a local port for a connection to remote: a port held
// already whose pair with remote is free and not taken (the Stack's
// connections, which the table does not know, are asked about through
// taken), or one the kernel reserves now.
func (t *portTable) acquire(remote netip.AddrPort, taken func(port uint16) bool) (uint16, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	re := t.remotes[remote]
	if re == nil {
		re = &remoteEnd{}
		t.remotes[remote] = re
	}
	// With as many flows to remote as ports held, every held port is
	// busy towards it: no need to look.
	if n := len(t.list); re.flows < n {
		for range min(n, probeLimit) {
			r := t.list[re.cursor%n]
			re.cursor = (re.cursor + 1) % n
			pr := portRemote{r.port, remote}
			if _, busy := t.used[pr]; busy || taken(r.port) {
				continue
			}
			t.take(r, pr, re)
			return r.port, nil
		}
	}
	fd, port, err := reservePort(t.addr, 0)
	if err == nil && t.ports[port] != nil {
		// The kernel gave a port we hold: it cannot, as our socket is
		// bound to it.
		unix.Close(fd)
		err = fmt.Errorf("reserve port: the kernel gave %d, which is held", port)
	}
	if err != nil {
		if re.flows == 0 {
			delete(t.remotes, remote)
		}
		return 0, err
	}
	r := &reservation{fd: fd, port: port, idx: len(t.list)}
	t.ports[port] = r
	t.list = append(t.list, r)
	t.nheld.Store(int64(len(t.list)))
	t.take(r, portRemote{port, remote}, re)
	return port, nil
}

// take records a flow on r; t.mu held.
func (t *portTable) take(r *reservation, pr portRemote, re *remoteEnd) {
	r.refs++
	t.used[pr] = struct{}{}
	re.flows++
}

// release forgets the active flow from port to remote, and gives the port
// back to the kernel if it was the last on it.
func (t *portTable) release(port uint16, remote netip.AddrPort) {
	t.mu.Lock()
	defer t.mu.Unlock()
	pr := portRemote{port, remote}
	if _, ok := t.used[pr]; !ok {
		return
	}
	delete(t.used, pr)
	t.used = shrink.Map(t.used, &t.usedMost)
	if re := t.remotes[remote]; re != nil {
		if re.flows--; re.flows <= 0 {
			delete(t.remotes, remote)
			t.remotes = shrink.Map(t.remotes, &t.remotesMost)
		}
	}
	r := t.ports[port]
	if r == nil {
		return
	}
	if r.refs--; r.refs > 0 {
		return
	}
	unix.Close(r.fd)
	delete(t.ports, port)
	t.ports = shrink.Map(t.ports, &t.portsMost)
	last := t.list[len(t.list)-1]
	t.list[r.idx], last.idx = last, r.idx
	t.list[len(t.list)-1] = nil
	t.list = t.list[:len(t.list)-1]
	t.nheld.Store(int64(len(t.list)))
}

// held is the number of ports held, and of kernel sockets holding them:
// read without the table's lock, which the pollers of a Group share and
// hold across socket system calls, by every poller after each Do.
func (t *portTable) held() int { return int(t.nheld.Load()) }

// closeAll releases every port; for a table nobody uses any more.
func (t *portTable) closeAll() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, r := range t.list {
		unix.Close(r.fd)
	}
	t.list = nil
	t.nheld.Store(0)
	clear(t.ports)
	clear(t.used)
	clear(t.remotes)
}

func bpfFlow(id tcp.FourTuple) bpf.Flow {
	return bpf.Flow{
		Local:  netip.AddrPortFrom(id.LocalAddr, id.LocalPort),
		Remote: netip.AddrPortFrom(id.RemoteAddr, id.RemotePort),
	}
}

// ListenHandler is a Handler that wants the listener Listen makes (to
// take its accepted connections on the loop).
type ListenHandler interface {
	tcp.Handler
	// Listening is given the listener on the loop, before any SYN is
	// steered to it.
	Listening(*tcp.Listener)
}

// listen is Listen's work on the loop: reserve, listen, steer.
func (p *Poller) listen(port uint16, h tcp.Handler) (*tcp.Listener, error) {
	if port == 0 {
		return nil, errors.New("xdpnet: listen on port 0")
	}
	if p.listens[port] != nil {
		return nil, fmt.Errorf("xdpnet: listen on %d: %w", port, tcp.ErrPortInUse)
	}
	fd, _, err := reservePort(p.cfg.Addr, port)
	if err != nil {
		return nil, fmt.Errorf("xdpnet: listen: %w", err)
	}
	l, err := p.stack.Listen(p.cfg.Addr, port, h)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("xdpnet: listen on %d: %w", port, err)
	}
	if w, ok := h.(ListenHandler); ok {
		w.Listening(l)
	}
	if err := p.steering.AddListen(port); err != nil {
		l.Close()
		unix.Close(fd)
		return nil, fmt.Errorf("xdpnet: listen on %d: %w", port, err)
	}
	p.listens[port] = &listen{l: l, reserve: fd}
	p.cfg.Group.setListen(port, p)
	return l, nil
}

// closeListener is CloseListener's work on the loop (and shutdown's).
func (p *Poller) closeListener(port uint16) error {
	ls := p.listens[port]
	if ls == nil {
		return fmt.Errorf("xdpnet: close listener %d: not listening", port)
	}
	delete(p.listens, port)
	p.cfg.Group.setListen(port, nil)
	err := p.steering.RemoveListen(port)
	ls.l.Close()
	// Passive connections still open keep their flows, steered by their
	// 4-tuples whatever a kernel socket later does with the port.
	unix.Close(ls.reserve)
	return err
}

// connect is Connect's work on the loop once remote is resolved: a local
// port from the port table, the flow steered, the SYN sent.
func (p *Poller) connect(now tcp.Time, remote netip.AddrPort, h tcp.Handler) (*tcp.Conn, error) {
	port, err := p.claim(remote)
	if err != nil {
		return nil, err
	}
	return p.connectFrom(now, port, remote, h)
}

// claim takes what a connection to remote needs of this host: a local
// port from the port table, and the steering of its flow. On the loop;
// connectFrom uses the claim, unclaim gives it back.
func (p *Poller) claim(remote netip.AddrPort) (uint16, error) {
	port, err := p.ports.acquire(remote, func(port uint16) bool {
		id := fourTuple(p.cfg.Addr, port, remote)
		return p.flows[id] != nil || p.stack.Lookup(id) != nil
	})
	if err != nil {
		return 0, fmt.Errorf("xdpnet: connect to %v: %w", remote, err)
	}
	if err := p.steering.AddFlow(bpfFlow(fourTuple(p.cfg.Addr, port, remote))); err != nil {
		p.ports.release(port, remote)
		return 0, fmt.Errorf("xdpnet: connect to %v: %w", remote, resourceErr(err))
	}
	return port, nil
}

// unclaim gives back what claim took; on the loop.
func (p *Poller) unclaim(port uint16, remote netip.AddrPort) {
	_ = p.steering.RemoveFlow(bpfFlow(fourTuple(p.cfg.Addr, port, remote)))
	p.ports.release(port, remote)
}

// connectFrom sends the SYN of a connection from port, which claim
// gave, to remote; the claim goes back if it fails. On the loop.
func (p *Poller) connectFrom(now tcp.Time, port uint16, remote netip.AddrPort, h tcp.Handler) (*tcp.Conn, error) {
	c, err := p.stack.Connect(now, p.cfg.Addr, port, remote, h)
	if err != nil {
		p.unclaim(port, remote)
		return nil, fmt.Errorf("xdpnet: connect to %v: %w", remote, err)
	}
	id := fourTuple(p.cfg.Addr, port, remote)
	p.addFlow(&flow{id: id, added: now, active: true})
	p.cfg.Group.setOwner(id, p)
	return c, nil
}

// fourTuple is the 4-tuple of a connection from local:port to remote.
func fourTuple(local netip.Addr, port uint16, remote netip.AddrPort) tcp.FourTuple {
	return tcp.FourTuple{LocalAddr: local, RemoteAddr: remote.Addr(), LocalPort: port, RemotePort: remote.Port()}
}

// addPassiveFlow steers the rest of a connection whose SYN arrived on a
// listened port. A failure leaves the handshake's ACK to the kernel,
// which resets it; the peer then retries.
func (p *Poller) addPassiveFlow(now tcp.Time, id tcp.FourTuple) {
	if f := p.flows[id]; f != nil {
		if !f.active {
			// A new SYN on the 4-tuple of an older connection (the
			// peer reuses its port; ours may be in TIME-WAIT): the
			// flow starts again, or the sweep, which saw the old
			// connection, would remove it under the new one while
			// a cookie's ACK is on its way.
			f.added, f.seen = now, false
		}
		return
	}
	if err := p.steering.AddFlow(bpfFlow(id)); err != nil {
		p.stats.FlowErrors++
		p.warnLimit(now, func() (string, error) {
			return fmt.Sprintf("connection from %v:%d not steered", id.RemoteAddr, id.RemotePort), resourceErr(err)
		})
		return
	}
	p.addFlow(&flow{id: id, added: now})
	p.cfg.Group.setOwner(id, p)
}

// addFlow and dropFlow keep the flows' map and list; dropFlow leaves the
// steering program and the port alone (Move carries the flow on).
func (p *Poller) addFlow(f *flow) {
	f.idx = len(p.flowList)
	p.flowList = append(p.flowList, f)
	p.flows[f.id] = f
}

func (p *Poller) dropFlow(f *flow) {
	delete(p.flows, f.id)
	p.flows = shrink.Map(p.flows, &p.flowsMost)
	last := p.flowList[len(p.flowList)-1]
	p.flowList[f.idx], last.idx = last, f.idx
	p.flowList[len(p.flowList)-1] = nil
	p.flowList = p.flowList[:len(p.flowList)-1]
}

// sweep removes flows whose connections have left the Stack, looking at a
// share of them from where the last sweep stopped (see sweepShare).
func (p *Poller) sweep(now tcp.Time) {
	n := len(p.flowList)
	if n == 0 {
		return
	}
	budget := min(n, max(sweepMin, (n+sweepShare-1)/sweepShare))
	i := p.sweepAt
	for ; budget > 0 && len(p.flowList) > 0; budget-- {
		if i >= len(p.flowList) {
			i = 0
		}
		f := p.flowList[i]
		if c := p.stack.Lookup(f.id); c != nil {
			f.seen = true
			p.checkConn(now, f, c)
			i++
			continue
		}
		if f.seen || f.active || now-f.added >= tcp.Time(synGrace) {
			p.removeFlow(f) // the last flow takes its place: look at i again
			continue
		}
		i++
	}
	p.sweepAt = i
}

// removeFlow stops steering a flow and releases its port.
func (p *Poller) removeFlow(f *flow) {
	p.dropFlow(f)
	p.cfg.Group.clearOwner(f.id, p)
	if err := p.steering.RemoveFlow(bpfFlow(f.id)); err != nil {
		p.stats.FlowErrors++
	}
	if f.active {
		p.ports.release(f.id.LocalPort, netip.AddrPortFrom(f.id.RemoteAddr, f.id.RemotePort))
	}
	if f.reserveFD {
		unix.Close(f.reserve)
		f.reserveFD = false
	}
}
