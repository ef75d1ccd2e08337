package xdpnet

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/bpf"
	"github.com/softrnic/softrnic/tcp"
)

// flow is a 4-tuple the poller added to the steering program's flow map.
type flow struct {
	added tcp.Time
	// seen: the sweep found the connection in the Stack once.
	seen bool
	// reserve is the kernel socket holding the local port of an active
	// connection, -1 for a passive one (its listener's socket holds it).
	reserve int
}

// listen is a port the poller listens on.
type listen struct {
	l       *tcp.Listener
	reserve int
}

// synGrace is how long a passive flow may exist without a connection in
// the Stack: a SYN answered with a SYN cookie has none until its ACK.
const synGrace = 5 * time.Second

// reservePort binds a kernel TCP socket (not listening) to addr and port,
// so that no kernel socket can take the port; port 0 lets the kernel pick
// an ephemeral one, which is returned. It runs on the loop's thread, in the
// Poller's namespace.
func reservePort(addr netip.Addr, port uint16) (fd int, got uint16, err error) {
	fd, err = unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, 0, fmt.Errorf("reserve port: socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: addr.As4(), Port: int(port)}); err != nil {
		unix.Close(fd)
		if errors.Is(err, unix.EADDRINUSE) {
			return -1, 0, fmt.Errorf("reserve port %v:%d: %w: %w", addr, port, tcp.ErrPortInUse, err)
		}
		return -1, 0, fmt.Errorf("reserve port %v:%d: %w", addr, port, err)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		unix.Close(fd)
		return -1, 0, fmt.Errorf("reserve port: getsockname: %w", err)
	}
	return fd, uint16(sa.(*unix.SockaddrInet4).Port), nil
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

// connect is Connect's work on the loop once remote is resolved: reserve
// an ephemeral port, steer the flow, send the SYN.
func (p *Poller) connect(now tcp.Time, remote netip.AddrPort, h tcp.Handler) (*tcp.Conn, error) {
	fd, port, err := reservePort(p.cfg.Addr, 0)
	if err != nil {
		return nil, fmt.Errorf("xdpnet: connect to %v: %w", remote, err)
	}
	id := tcp.FourTuple{LocalAddr: p.cfg.Addr, RemoteAddr: remote.Addr(), LocalPort: port, RemotePort: remote.Port()}
	if err := p.steering.AddFlow(bpfFlow(id)); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("xdpnet: connect to %v: %w", remote, err)
	}
	c, err := p.stack.Connect(now, p.cfg.Addr, port, remote, h)
	if err != nil {
		_ = p.steering.RemoveFlow(bpfFlow(id))
		unix.Close(fd)
		return nil, fmt.Errorf("xdpnet: connect to %v: %w", remote, err)
	}
	p.flows[id] = &flow{added: now, reserve: fd}
	p.cfg.Group.setOwner(id, p)
	return c, nil
}

// addPassiveFlow steers the rest of a connection whose SYN arrived on a
// listened port. A failure leaves the handshake's ACK to the kernel,
// which resets it; the peer then retries.
func (p *Poller) addPassiveFlow(now tcp.Time, id tcp.FourTuple) {
	if f := p.flows[id]; f != nil {
		return
	}
	if err := p.steering.AddFlow(bpfFlow(id)); err != nil {
		p.stats.FlowErrors++
		return
	}
	p.flows[id] = &flow{added: now, reserve: -1}
	p.cfg.Group.setOwner(id, p)
}

// sweep removes the flows whose connections have left the Stack.
func (p *Poller) sweep(now tcp.Time) {
	if len(p.flows) == 0 {
		return
	}
	for id, f := range p.flows {
		if p.stack.Lookup(id) != nil {
			f.seen = true
			continue
		}
		if f.seen || f.reserve >= 0 || now-f.added >= tcp.Time(synGrace) {
			p.removeFlow(id, f)
		}
	}
}

// removeFlow stops steering id and releases its port's reservation.
func (p *Poller) removeFlow(id tcp.FourTuple, f *flow) {
	delete(p.flows, id)
	p.cfg.Group.clearOwner(id, p)
	if err := p.steering.RemoveFlow(bpfFlow(id)); err != nil {
		p.stats.FlowErrors++
	}
	if f.reserve >= 0 {
		unix.Close(f.reserve)
	}
}
