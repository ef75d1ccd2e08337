package xdpnet

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/tcp"
)

// This file is how other goroutines reach the loop. Do and Async queue
// functions for it and wake it; the exported calls below are Do calls
// whose loop-side halves live with their concern (listen, closeListener
// and connect in ports.go, the flows in group.go); a Source is polled by
// the loop itself. Only the loop touches what they change.

// call is a Do request: the loop runs fn, then closes done.
type call struct {
	fn   func(s *tcp.Stack, now tcp.Time)
	done chan struct{}
}

// Do runs fn on the loop with the Stack and the loop's clock, and waits for
// it. It fails with ErrClosed when the loop has stopped. fn must not keep
// the Stack, and must not block. Do must not be called from the loop
// (from a Handler or from fn).
func (p *Poller) Do(fn func(s *tcp.Stack, now tcp.Time)) error {
	c := call{fn: fn, done: make(chan struct{})}
	// Counted before it is queued, so that the loop never sees the
	// call before the count (see sleep).
	p.callsQueued.Add(1)
	select {
	case p.calls <- c:
	case <-p.quit:
		p.callsQueued.Add(-1)
		return ErrClosed
	}
	// A loop awake takes the call at its next turn; only a sleeping one
	// needs the write (a system call per Do otherwise, for nothing while
	// the loop spins).
	p.Wake()
	select {
	case <-c.done:
		return nil
	case <-p.quit:
		// The loop may have run fn just before it stopped.
		select {
		case <-c.done:
			return nil
		default:
		}
		return ErrClosed
	}
}

// Async queues fn to run on the loop and returns at once; the loop is
// woken if it sleeps. Functions run in the order queued; fn must not
// block. Safe from any goroutine, the loop's included. After the loop
// stopped, queued functions never run.
func (p *Poller) Async(fn func()) {
	p.asyncMu.Lock()
	p.async = append(p.async, fn)
	p.asyncPending.Add(1)
	p.asyncMu.Unlock()
	p.Wake()
}

// runAsync runs the functions Async queued; it reports whether there were any.
func (p *Poller) runAsync() bool {
	if p.asyncPending.Load() == 0 {
		return false
	}
	p.asyncMu.Lock()
	fns := p.async
	p.async = p.asyncSpare[:0]
	p.asyncPending.Store(0)
	p.asyncMu.Unlock()
	for i, fn := range fns {
		fn()
		fns[i] = nil
	}
	p.asyncSpare = fns
	return len(fns) > 0
}

// Wake wakes the loop if it sleeps, at most once per sleep: for work
// queued where sleep looks after setting sleeping (Async, handoff rings),
// or a Source's work that came another way than its doorbell.
func (p *Poller) Wake() {
	if p.sleeping.Load() && !p.woken.Swap(true) {
		p.wake()
	}
}

// wake makes a sleeping loop return from ppoll.
func (p *Poller) wake() {
	var b [8]byte
	b[0] = 1
	_, _ = unix.Write(p.eventfd, b[:])
}

// Listen reserves port, listens on it with h as the Handler of the
// connections it accepts, and steers SYNs to it; a ListenHandler is given
// the listener first. Call it from another goroutine than the loop's.
func (p *Poller) Listen(port uint16, h tcp.Handler) (*tcp.Listener, error) {
	var l *tcp.Listener
	var err error
	if derr := p.Do(func(s *tcp.Stack, now tcp.Time) { l, err = p.listen(port, h) }); derr != nil {
		return nil, derr
	}
	return l, err
}

// CloseListener stops listening on port: SYNs to it go to the kernel
// again (which resets them), connections not yet accepted are reset, and
// the port's reservation ends. Established connections carry on.
func (p *Poller) CloseListener(port uint16) error {
	var err error
	if derr := p.Do(func(*tcp.Stack, tcp.Time) { err = p.closeListener(port) }); derr != nil {
		return derr
	}
	return err
}

// Connect opens a connection from the RNIC's address to remote with h as
// its Handler: it is Dial with only a timeout.
func (p *Poller) Connect(remote netip.AddrPort, h tcp.Handler, timeout time.Duration) (*tcp.Conn, error) {
	return p.Dial(remote, h, DialOptions{Timeout: timeout})
}

// DialOptions are Dial's.
type DialOptions struct {
	// Timeout bounds the wait for the peer's link-layer address.
	Timeout time.Duration
	// Started, if set, is called once, from Dial's goroutine, when the
	// connection holds what it needs of this host (its local port and
	// its place in the steering program's flow table) or has failed to:
	// with nil then, or with the error Dial returns. It
	// comes before Dial waits for the peer's link-layer address, so a
	// caller that answers its own before the peer does can tell a
	// shortage here (ErrResources) at once.
	Started func(error)
}

// Dial opens a connection from the RNIC's address to remote with h as its
// Handler: it takes a local port (see portTable), resolves remote's
// link-layer address (waiting up to o.Timeout), steers the flow and sends
// the SYN. EventEstablished or EventClosed on h tells how it went. A host
// limit (descriptors, ports, the flow table) fails it with ErrResources,
// a peer the kernel routes elsewhere or that cannot be resolved with
// ErrNoNeighbour. Call it from another goroutine than the loop's.
func (p *Poller) Dial(remote netip.AddrPort, h tcp.Handler, o DialOptions) (c *tcp.Conn, err error) {
	started := func(error) {}
	if o.Started != nil {
		var once sync.Once
		started = func(err error) { once.Do(func() { o.Started(err) }) }
		defer func() { started(err) }()
	}
	if !remote.Addr().Is4() {
		return nil, fmt.Errorf("xdpnet: connect to %v: IPv4 only", remote)
	}
	deadline := time.Now().Add(o.Timeout)
	// held is the port claimed while the peer is being resolved, and
	// given back if the connection never comes to use it.
	var held uint16
	defer func() {
		if held != 0 {
			port := held
			if p.Do(func(*tcp.Stack, tcp.Time) { p.unclaim(port, remote) }) != nil {
				// The loop has stopped: the steering map and the
				// port table, which a Group shares, have locks of
				// their own.
				p.unclaim(port, remote)
			}
		}
	}()
	for {
		// One round trip to the loop when the neighbour is known, as
		// it is for all but the first connection to a peer.
		var route routeState
		var resolved bool
		if derr := p.Do(func(s *tcp.Stack, now tcp.Time) {
			if _, route = p.neigh.nextHop(now, remote.Addr()); route == routed {
				_, resolved = p.neigh.lookup(now, remote.Addr())
			}
			switch {
			case resolved && held != 0:
				c, err = p.connectFrom(now, held, remote, h)
				held = 0 // connectFrom used or gave back the claim
			case resolved:
				c, err = p.connect(now, remote, h)
			case route != notRouted && held == 0:
				held, err = p.claim(remote)
			}
		}); derr != nil {
			return nil, derr
		}
		if resolved || err != nil {
			return c, err
		}
		if route == notRouted {
			return nil, fmt.Errorf("xdpnet: connect to %v: %w: no route through %s", remote, ErrNoNeighbour, p.cfg.Interface)
		}
		started(nil) // the port and the flow are held
		// Unresolved, or the route could not be read just now (a
		// netlink query that failed is asked again, not taken for an
		// answer): wait for it within the timeout.
		if time.Now().After(deadline) {
			if route == routeUnknown {
				return nil, fmt.Errorf("xdpnet: connect to %v: %w: the route could not be read within %v", remote, ErrNoNeighbour, o.Timeout)
			}
			return nil, fmt.Errorf("xdpnet: connect to %v: %w within %v", remote, ErrNoNeighbour, o.Timeout)
		}
		time.Sleep(time.Millisecond)
	}
}

// Move carries the established connection id from p to another poller of
// its Group, and then runs then on that poller's loop with the connection.
// Segments that arrive meanwhile are dropped (TCP retransmits them). Call
// it from another goroutine than the two loops.
func (p *Poller) Move(id tcp.FourTuple, to *Poller, then func(*tcp.Conn)) error {
	g := p.cfg.Group
	if g == nil || to.cfg.Group != g {
		return errors.New("xdpnet: move: pollers not of one group")
	}
	if to == p {
		var err error
		if derr := p.Do(func(s *tcp.Stack, _ tcp.Time) {
			if c := s.Lookup(id); c != nil {
				then(c)
			} else {
				err = fmt.Errorf("xdpnet: move %v: %w", id, ErrGone)
			}
		}); derr != nil {
			return derr
		}
		return err
	}
	var c *tcp.Conn
	var f *flow
	var err error
	if derr := p.Do(func(s *tcp.Stack, _ tcp.Time) {
		c = s.Lookup(id)
		if c == nil {
			err = fmt.Errorf("xdpnet: move %v: %w", id, ErrGone)
			return
		}
		g.setMoving(id, true)
		if err = s.Detach(c); err != nil {
			g.setMoving(id, false)
			return
		}
		if f = p.flows[id]; f != nil {
			p.dropFlow(f)
		}
	}); derr != nil {
		return derr
	}
	if err != nil {
		return err
	}
	if derr := to.Do(func(s *tcp.Stack, _ tcp.Time) {
		err = s.Adopt(c)
		if err == nil {
			if f != nil {
				to.addFlow(f)
			}
			g.setOwner(id, to)
			then(c)
			g.setMoving(id, false)
		}
	}); derr != nil {
		err = derr
	}
	if err != nil {
		// The connection stays where it was, flow and all. Its segments
		// are dropped (moving) until p has it back: p's Stack without it
		// would answer them with resets.
		if derr := p.Do(func(s *tcp.Stack, _ tcp.Time) {
			adopted := s.Adopt(c) == nil
			if f != nil {
				// Back in the list Move took it out of, whether it
				// stays or goes with its steering and port.
				p.addFlow(f)
				if !adopted {
					p.removeFlow(f)
				}
			}
			g.setMoving(id, false)
		}); derr != nil {
			g.setMoving(id, false)
		}
	}
	return err
}

// Source is work the loop polls besides its socket: an application's send
// and receive rings in shared memory (the design's "SQ doorbell → qp" on
// the poller), or the completions it forwards to an application. A busy
// loop takes posted work requests while it spins, so a post needs no
// wake-up at all; a sleeping one is woken by the producer through
// Doorbell, or by Wake. The methods run on the loop and must not block.
type Source interface {
	// Poll takes the work waiting and reports whether there was any.
	Poll() bool
	// Sleeping is called before the loop sleeps: the source asks its
	// producer to signal (a need-wakeup flag) and reports whether work
	// arrived since Poll last looked, which keeps the loop awake.
	Sleeping() bool
	// Awake is called once the loop no longer sleeps: the producer need
	// not signal.
	Awake()
}

// Doorbell returns a new descriptor of the doorbell, an eventfd the loop
// sleeps on: a Source's producer that finds the need-wakeup flag up writes
// to it, and the loop wakes without another thread in between. Every epoll
// instance that watches a descriptor of the doorbell (the Go runtime of a
// process that wraps it in an os.File: it is non-blocking) makes each ring
// and each read of it dearer by a callback: hand out one per application,
// not one per ring.
func (p *Poller) Doorbell() (*os.File, error) {
	fd, err := unix.FcntlInt(uintptr(p.doorbell), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("xdpnet: doorbell: %w", resourceErr(err))
	}
	return os.NewFile(uintptr(fd), "softrnic-poller-doorbell"), nil
}

// AddSource makes the loop poll s on every turn until RemoveSource.
func (p *Poller) AddSource(s Source) error {
	return p.Do(func(*tcp.Stack, tcp.Time) { p.sources = append(p.sources, s) })
}

// RemoveSource stops polling s; once it returns the loop never calls s
// again (also when the loop has stopped: ErrClosed).
func (p *Poller) RemoveSource(s Source) error {
	return p.Do(func(*tcp.Stack, tcp.Time) {
		if i := slices.Index(p.sources, s); i >= 0 {
			p.sources = slices.Delete(p.sources, i, i+1)
		}
	})
}

// pollSources polls every source; it reports whether any had work.
func (p *Poller) pollSources() bool {
	work := false
	for _, s := range p.sources {
		if s.Poll() {
			work = true
		}
	}
	return work
}

// sourcesSleeping tells the sources the loop is about to sleep; it reports
// whether one of them has work, in which case it must not.
func (p *Poller) sourcesSleeping() bool {
	work := false
	for _, s := range p.sources {
		if s.Sleeping() {
			work = true
		}
	}
	return work
}

// sourcesAwake tells the sources the loop no longer sleeps.
func (p *Poller) sourcesAwake() {
	for _, s := range p.sources {
		s.Awake()
	}
}
