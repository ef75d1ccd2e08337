package xdpnet

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/internal/repair"
	"github.com/softrnic/softrnic/tcp"
)

// Taking a kernel connection over (seed 004's stream → RDMA): the caller
// Holds the flow (its segments come here from now on, and wait), reads the
// kernel connection's state with TCP_REPAIR and makes the kernel forget it
// (internal/repair), then Imports the state into this poller's Stack,
// which takes the segments held meanwhile. Unhold gives up before that:
// the segments go to the kernel again.

// heldFlow keeps the frames of a flow being taken over, within bounds
// (beyond them the peer retransmits).
type heldFlow struct {
	frames  [][]byte
	octets  int
	dropped int
	// released: Unhold gave the flow back to the kernel, and frames
	// that were already on their way here are dropped (the peer
	// retransmits them to the kernel) rather than met by the Stack,
	// which knows no connection for them and would reset it.
	released bool
}

// Bounds of what a held flow keeps: a handover takes milliseconds.
const (
	maxHeldFrames = 1024
	maxHeldOctets = 4 << 20
)

func (h *heldFlow) keep(frame []byte) {
	if h.released {
		return
	}
	if len(h.frames) >= maxHeldFrames || h.octets+len(frame) > maxHeldOctets {
		h.dropped++
		return
	}
	h.frames = append(h.frames, append([]byte(nil), frame...))
	h.octets += len(frame)
}

// ErrHeld: the flow is already held, steered or connected here.
var ErrHeld = errors.New("xdpnet: flow already in use")

// Hold steers the flow id (a connection of this poller's address, which
// the kernel has now) to this poller and keeps its segments, unread, until
// Import or Unhold. Call it from another goroutine than the loop.
func (p *Poller) Hold(id tcp.FourTuple) error {
	if id.LocalAddr != p.cfg.Addr {
		return fmt.Errorf("xdpnet: hold %v: the local address is not %v", id, p.cfg.Addr)
	}
	var err error
	if derr := p.Do(func(s *tcp.Stack, _ tcp.Time) {
		if h := p.held[id]; (h != nil && !h.released) || p.flows[id] != nil || s.Lookup(id) != nil {
			err = fmt.Errorf("xdpnet: hold %v: %w", id, ErrHeld)
			return
		}
		if e := p.steering.AddFlow(bpfFlow(id)); e != nil {
			err = fmt.Errorf("xdpnet: hold %v: %w", id, resourceErr(e))
			return
		}
		p.held[id] = &heldFlow{}
		p.cfg.Group.setOwner(id, p)
	}); derr != nil {
		return derr
	}
	return err
}

// Unhold stops holding id: the steering goes, and so do the segments held
// (the kernel, which has the connection again, gets their
// retransmissions). Frames already on their way to the poller are
// dropped for a while (unheldGrace) instead of being reset.
func (p *Poller) Unhold(id tcp.FourTuple) error {
	var err error
	var h *heldFlow
	if derr := p.Do(func(*tcp.Stack, tcp.Time) {
		if h = p.held[id]; h == nil || h.released {
			err = fmt.Errorf("xdpnet: unhold %v: not held", id)
			return
		}
		h.released, h.frames, h.octets = true, nil, 0
		p.cfg.Group.clearOwner(id, p)
		err = p.steering.RemoveFlow(bpfFlow(id))
	}); derr != nil {
		return derr
	}
	if h != nil && h.released {
		time.AfterFunc(unheldGrace, func() {
			p.Async(func() {
				if p.held[id] == h {
					delete(p.held, id)
				}
			})
		})
	}
	return err
}

// unheldGrace is how long frames of a flow given back to the kernel are
// dropped: those already in the AF_XDP ring or another poller's hand-off
// ring when its steering went.
const unheldGrace = time.Second

// ImportStats say what an Import carried.
type ImportStats struct {
	// Held segments were kept during the handover and given to the
	// connection; Dropped were beyond the bounds.
	Held, Dropped int
	// PortReserved: a kernel socket holds the local port for the
	// connection's life (it could not be bound when another socket, a
	// listener, holds it already, which does as well).
	PortReserved bool
}

// Import makes the connection of the held flow st.ID from st on this
// poller's Stack, with h as its Handler (tcp.Stack.Import), and gives it
// the segments held meanwhile. The flow stays steered for the
// connection's life, like any other. Call it from another goroutine than
// the loop, once the kernel has forgotten the connection.
func (p *Poller) Import(st tcp.Imported, h tcp.Handler) (c *tcp.Conn, stats ImportStats, err error) {
	id := st.ID
	if derr := p.Do(func(s *tcp.Stack, now tcp.Time) {
		hf := p.held[id]
		if hf == nil || hf.released {
			err = fmt.Errorf("xdpnet: import %v: not held", id)
			return
		}
		if c, err = s.Import(now, st, h); err != nil {
			return
		}
		delete(p.held, id)
		f := &flow{id: id, added: now, seen: true}
		// The kernel socket is gone: a bind keeps its port from a new
		// one that would reuse the 4-tuple.
		if fd, rerr := reserveImported(p.cfg.Addr, id.LocalPort); rerr == nil {
			f.reserve, f.reserveFD = fd, true
		}
		p.addFlow(f)
		stats = ImportStats{Held: len(hf.frames), Dropped: hf.dropped, PortReserved: f.reserveFD}
		for _, fr := range hf.frames {
			p.inputFrame(now, fr, true)
		}
	}); derr != nil {
		return nil, stats, derr
	}
	return c, stats, err
}

// Reachable says whether the poller can send to addr through its
// interface: the kernel routes it there and knows (or learns within
// timeout) its link-layer address. A connection whose peer cannot be
// reached so cannot be taken over.
func (p *Poller) Reachable(addr netip.Addr, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		var route routeState
		var resolved bool
		if err := p.Do(func(_ *tcp.Stack, now tcp.Time) {
			if _, route = p.neigh.nextHop(now, addr); route == routed {
				_, resolved = p.neigh.lookup(now, addr)
			}
		}); err != nil {
			return err
		}
		switch {
		case resolved:
			return nil
		case route == notRouted:
			return fmt.Errorf("xdpnet: %v: %w: not routed through %s", addr, ErrNoNeighbour, p.cfg.Interface)
		case time.Now().After(deadline):
			return fmt.Errorf("xdpnet: %v: %w within %v", addr, ErrNoNeighbour, timeout)
		}
		time.Sleep(time.Millisecond)
	}
}

// TakeoverStats say what a TakeOver did.
type TakeoverStats struct {
	// Duration is from the steering of the flow to the engine's start.
	Duration time.Duration
	// Send octets came across from the kernel's send queue (InFlight of
	// them sent and unacknowledged, the rest unsent); Unread from its
	// receive queue.
	Send, InFlight, Unread int
	// TSVal is the engine's first timestamp value (0 without
	// timestamps): above every TSval the kernel sent.
	TSVal uint32
	ImportStats
}

// TakeOver moves tc's connection from the kernel into this poller's TCP
// engine with h as its Handler, in the order the kernel needs: the flow
// steered here first (Hold: from then on the kernel sees none of its
// segments), then repair mode, the state read until two reads agree, the
// kernel's connection dropped silently (no FIN, no RST, every descriptor
// of it dead), tc closed, and only then the engine started, sending again
// at once what the kernel had in flight. Repair mode does not stop the
// kernel sending: what it sends after the read (for an ACK from the
// socket's backlog, from TCP small queues' tasklet) the engine learns from
// the peer's ACKs (tcp.Stack.Import). Until the drop, a failure leaves
// the connection to the kernel as it was: repair off without a window
// probe, the steering removed. Connections that cannot be taken over
// (repair.Check) are refused with repair.ErrRefused, and a process
// without CAP_NET_ADMIN in the socket's namespace gets
// repair.ErrPermission. Call it from another goroutine than the loop.
func (p *Poller) TakeOver(tc *net.TCPConn, h tcp.Handler) (*tcp.Conn, TakeoverStats, error) {
	var stats TakeoverStats
	rc, err := tc.SyscallConn()
	if err != nil {
		return nil, stats, err
	}
	if err := repair.Check(rc); err != nil {
		return nil, stats, err
	}
	id, err := TupleOf(tc)
	if err != nil {
		return nil, stats, fmt.Errorf("%w: %v", repair.ErrRefused, err)
	}
	if id.LocalAddr != p.cfg.Addr {
		return nil, stats, fmt.Errorf("%w: the connection's address %v is not the RNIC's (%v): its packets do not arrive on %s",
			repair.ErrRefused, id.LocalAddr, p.cfg.Addr, p.cfg.Interface)
	}
	if err := p.Reachable(id.RemoteAddr, time.Second); err != nil {
		return nil, stats, fmt.Errorf("%w: %v", repair.ErrRefused, err)
	}
	start := time.Now()
	if err := p.Hold(id); err != nil {
		return nil, stats, err
	}
	giveBack := func(s *repair.Socket, err error) (*tcp.Conn, TakeoverStats, error) {
		if s != nil {
			if aerr := s.Abandon(); aerr != nil {
				err = fmt.Errorf("%w (and leaving repair mode: %v)", err, aerr)
			}
		}
		_ = p.Unhold(id)
		return nil, stats, err
	}
	s, err := repair.Enter(rc)
	if err != nil {
		return giveBack(nil, err)
	}
	st, err := s.Read()
	if err != nil {
		return giveBack(s, err)
	}
	ts, err := s.Drop()
	if err != nil {
		return giveBack(s, err)
	}
	if st.Timestamps && int32(ts-st.TSVal) > 0 {
		st.TSVal = ts // the kernel's clock moved on while it was read
	}
	_ = tc.Close()
	c, imp, err := p.Import(st, h)
	if err != nil {
		// The kernel has forgotten the connection: it is lost, and the
		// peer's next segment, given back to the kernel, draws a reset.
		_ = p.Unhold(id)
		return nil, stats, fmt.Errorf("xdpnet: take over %v: %w", id, err)
	}
	stats = TakeoverStats{Duration: time.Since(start), Send: len(st.Send), InFlight: st.SndNxt.Sub(st.SndUna),
		Unread: len(st.Unread), TSVal: st.TSVal, ImportStats: imp}
	return c, stats, nil
}

// reserveImported binds a kernel socket to an imported connection's local
// port, so that the kernel's choice of a port for a new connect() passes
// it over (a port with a bound socket is never an ephemeral pick), and
// the 4-tuple the engine now has cannot come back in the kernel. Unlike a
// listener's reservation it neither listens nor keeps SO_REUSEADDR
// sockets out: the port may be an application's service port, which the
// application must be able to listen on again (with SO_REUSEADDR, as Go's
// net.Listen has). A port a listener holds cannot be bound; the listener
// keeps it as well.
func reserveImported(addr netip.Addr, port uint16) (int, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
		unix.Close(fd)
		return -1, err
	}
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: addr.As4(), Port: int(port)}); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// TupleOf is a kernel TCP connection's addresses as the engine's 4-tuple;
// an error when it has none (a socket that was not connected when its
// net.TCPConn was made).
func TupleOf(tc *net.TCPConn) (tcp.FourTuple, error) {
	la, ok1 := tc.LocalAddr().(*net.TCPAddr)
	ra, ok2 := tc.RemoteAddr().(*net.TCPAddr)
	if !ok1 || !ok2 || la == nil || ra == nil {
		return tcp.FourTuple{}, errors.New("no addresses")
	}
	l, _ := netip.AddrFromSlice(la.IP.To4())
	r, _ := netip.AddrFromSlice(ra.IP.To4())
	return tcp.FourTuple{LocalAddr: l, RemoteAddr: r, LocalPort: uint16(la.Port), RemotePort: uint16(ra.Port)}, nil
}
