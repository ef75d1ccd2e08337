package rnic

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/ddp"
	"github.com/softrnic/softrnic/mpa"
	"github.com/softrnic/softrnic/tcp"
	"github.com/softrnic/softrnic/xdpnet"
)

// engineConn is a QP's connection on the accelerated datapath: the
// tcp.Handler and tcp.Filler of the TCP connection, called on the poller
// that owns it, with the QP's mutex held around the engines (the consumer
// posts work from other goroutines under the same mutex). The TCP engine
// never calls it from inside a call that holds that mutex (see the package
// comment), and what the QP posts meanwhile is delivered once it is
// released.
type engineConn struct {
	// pl is the poller that owns the connection; it changes once, when
	// Accept moves a passive connection to its QP's poller.
	pl  atomic.Pointer[xdpnet.Poller]
	llp *mpaConn
	// q is the device QP; nil while a passive connection waits for
	// the consumer.
	q *QP
	// conn is the TCP connection, set on the loop.
	conn *tcp.Conn
	// result receives the outcome of an active open, once.
	result chan error
	// req is the passive connection's request while it waits (until
	// the QP takes the connection). reqTimer bounds the wait for the
	// MPA Request; it is stopped when the Request comes, so that a
	// connection that closes later is not held until it fires.
	req      *ConnRequest
	reqTimer *time.Timer
	id       tcp.FourTuple
	// serveFn is serve, made once: a method value per kick would be an
	// allocation per posted work request.
	serveFn func()
	// queued: a kick is queued on the poller.
	queued atomic.Bool
	// dead: the QP let go of the connection (Reset, Destroy); its
	// callbacks do nothing more. tcpUp: the TCP handshake completed.
	// Loop-owned.
	dead, tcpUp bool
}

// newEngineConn makes the connection state for a QP (q nil while a passive
// connection waits for its consumer) on poller p.
func newEngineConn(p *xdpnet.Poller, q *QP, llp *mpaConn) *engineConn {
	ec := &engineConn{q: q, llp: llp}
	ec.pl.Store(p)
	ec.serveFn = ec.serve
	return ec
}

func (ec *engineConn) poller() *xdpnet.Poller { return ec.pl.Load() }

// cpuCheck makes the engine callbacks of QPs count the calls that ran off
// their poller's CPU (tests of seed 004's rule; a getcpu per call).
var cpuCheck atomic.Bool

// noteCPU runs on the loop with q.mu held.
func (ec *engineConn) noteCPU() {
	if !cpuCheck.Load() || ec.q == nil {
		return
	}
	var cpu uint32
	_, _, _ = unix.RawSyscall(unix.SYS_GETCPU, uintptr(unsafe.Pointer(&cpu)), 0, 0)
	ec.q.cpuCalls++
	if want := ec.poller().CPU(); want >= 0 && int(cpu) != want {
		ec.q.cpuOff++
	}
}

// orphan is the Handler of a connection whose QP let go of it: it takes
// what arrives and nothing else, and when the connection ends it stops the
// timer that bounds the orphan's close (detach), which would otherwise
// hold the connection for orphanTimeout after it is gone.
type orphan struct{ timer *time.Timer }

func (*orphan) Receive(c *tcp.Conn, b []byte) int { return len(b) }

func (o *orphan) Event(_ *tcp.Conn, ev tcp.Event) {
	if ev == tcp.EventClosed && o.timer != nil {
		o.timer.Stop()
		o.timer = nil
	}
}

// detach lets go of the connection on the loop, resetting it if abort;
// otherwise the TCP engine finishes the close alone: our FIN, queued now if
// the peer's came in this same turn (CLOSE-WAIT), is sent and retransmitted
// on the engine's timers until acknowledged (LAST-ACK, CLOSING), for at
// most orphanTimeout. In TIME-WAIT nothing of ours is outstanding, and the
// connection goes at once (RFC 9293 §3.10.5 allows ABORT there) so that
// its local port is free. After detach the QP may be reset and reused.
func (ec *engineConn) detach(abort bool) {
	_ = ec.poller().Do(func(*tcp.Stack, tcp.Time) {
		ec.dead = true
		c := ec.conn
		if c == nil {
			return
		}
		o := &orphan{}
		c.SetHandler(o)
		if abort || c.State() == tcp.StateTimeWait {
			c.Abort()
			return
		}
		c.Close()
		if c.State() == tcp.StateClosed {
			return
		}
		p := ec.poller()
		o.timer = time.AfterFunc(orphanTimeout, func() {
			p.Async(func() {
				if c.State() != tcp.StateClosed {
					c.Abort()
				}
			})
		})
	})
}

// orphanTimeout bounds how long a connection whose QP is gone keeps
// sending its FIN: the peer gives us closeTimeout for it.
const orphanTimeout = closeTimeout

func (ec *engineConn) lock() {
	if ec.q != nil {
		ec.q.mu.Lock()
	}
}

func (ec *engineConn) unlock() {
	if ec.q != nil {
		ec.q.unlock()
	}
}

func (ec *engineConn) Receive(c *tcp.Conn, b []byte) int {
	if ec.dead {
		return len(b)
	}
	ec.conn = c
	if ec.q != nil && ec.q.attr.BeforeReceive != nil {
		ec.q.attr.BeforeReceive()
	}
	ec.lock()
	ec.noteCPU()
	n := ec.llp.Receive(c, b)
	ec.unlock()
	if ec.result != nil && ec.llp.Err != nil && !ec.llp.Ready() {
		// Startup failed on the peer's Reply (the connection may close
		// gracefully after a Terminate): the active open learns now.
		ec.report(ec.startupErr(c))
	}
	return n
}

func (ec *engineConn) Fill(c *tcp.Conn, dst []byte) int {
	if ec.dead {
		return 0
	}
	ec.conn = c
	ec.lock()
	ec.noteCPU()
	if ec.q != nil && ec.q.conn == llpConn(ec) && ec.q.abort {
		// An abortive disconnect resets; mpaConn.Fill would close
		// the ended QP's connection with a FIN before serve ran. (A
		// connection the QP let go of — a failed active open whose
		// Terminate and FIN are still going out — is not the QP's
		// to reset.)
		ec.unlock()
		c.Abort()
		return 0
	}
	n := ec.llp.Fill(c, dst)
	ec.unlock()
	return n
}

func (ec *engineConn) Event(c *tcp.Conn, ev tcp.Event) {
	if ec.dead {
		return
	}
	ec.conn = c
	if ev == tcp.EventEstablished {
		ec.tcpUp = true
	}
	ec.lock()
	ec.llp.Event(c, ev)
	ec.unlock()
	if ev != tcp.EventClosed {
		return
	}
	if ec.result != nil && !ec.llp.Ready() {
		ec.report(ec.startupErr(c))
	}
	if ec.req != nil {
		// The peer left while the consumer decided: the answer fails.
		ec.req.gone.Store(true)
	}
}

// awaitingRequest: a passive connection whose MPA Request has not come
// (nor has startup failed); loop-owned state.
func (ec *engineConn) awaitingRequest() bool {
	return ec.req == nil && ec.llp.Err == nil && !ec.llp.Ready()
}

// startupErr is why an active open's MPA startup failed.
func (ec *engineConn) startupErr(c *tcp.Conn) error {
	err := ec.llp.Err
	switch {
	case ec.llp.Rejected != nil:
		err = &RejectedError{PrivateData: ec.llp.Rejected}
	case err == nil && !ec.tcpUp && errors.Is(c.Err(), tcp.ErrRefused):
		err = fmt.Errorf("%w: %w: %v", ErrUnreachable, ErrRefused, c.Err())
	case err == nil && !ec.tcpUp && c.Err() != nil:
		// Refused, or no answer to the SYN: the peer is unreachable.
		err = fmt.Errorf("%w: %v", ErrUnreachable, c.Err())
	case err == nil && c.Err() != nil:
		// A peer that took the TCP connection and reset it during MPA
		// startup was reached: it is not an iWARP peer that answers
		// (the kernel datapath's receive goroutine sees the same).
		err = fmt.Errorf("%w: %v", ddp.LLPConnectionLost, c.Err())
	case err == nil:
		err = fmt.Errorf("%w: connection closed during MPA startup", ddp.LLPConnectionLost)
	}
	return err
}

// report delivers an active open's outcome.
func (ec *engineConn) report(err error) {
	select {
	case ec.result <- err:
	default:
	}
}

// kick asks the poller to serve the connection after the consumer posted
// work or disconnected: at most one kick is queued at a time.
func (ec *engineConn) kick() {
	if ec.queued.Swap(true) {
		return
	}
	ec.poller().Async(ec.serveFn)
}

// serve runs on the loop: an abortive disconnect resets the connection,
// anything else lets the TCP engine pull FPDUs.
func (ec *engineConn) serve() {
	ec.queued.Store(false)
	c := ec.conn
	if c == nil || ec.q == nil || ec.dead {
		return
	}
	ec.q.mu.Lock()
	ec.noteCPU()
	abort := ec.q.abort
	ec.q.unlock()
	if abort {
		c.Abort()
		return
	}
	c.Kick()
}

// connectEngine is Connect on the accelerated datapath: the TCP engine of
// the QP's poller opens the connection and MPA startup runs in its
// callbacks; ctx carries Connect's deadline, timeout.
func (q *QP) connectEngine(ctx context.Context, raddr string, cfg mpa.Config, timeout time.Duration, started func(error)) ([]byte, error) {
	ap, err := netip.ParseAddrPort(raddr)
	if err != nil || !ap.Addr().Is4() {
		return nil, fmt.Errorf("connect %s: want IPv4 host:port: %w", raddr, ErrInvalidParam)
	}
	p := q.Poller()
	q.mu.Lock()
	if q.busyLocked() { // Connect looked before unlocking
		q.unlock()
		return nil, ErrState
	}
	ec := q.activeEngineConn(p, cfg)
	q.unlock()
	fail := func(err error) ([]byte, error) {
		q.letGo(ec)
		return nil, err
	}
	c, err := p.Dial(ap, ec, xdpnet.DialOptions{Timeout: timeout, Started: started})
	if err != nil {
		if errors.Is(err, xdpnet.ErrNoNeighbour) {
			return fail(fmt.Errorf("connect %s: %w: %v", raddr, ErrUnreachable, err))
		}
		return fail(fmt.Errorf("connect %s: %w", raddr, err))
	}
	select {
	case err = <-ec.result:
	case <-ctx.Done():
		_ = p.Do(func(*tcp.Stack, tcp.Time) { c.Abort() })
		err = fmt.Errorf("connect %s: %w", raddr, ErrTimedOut)
	}
	if err != nil {
		var rej *RejectedError
		if errors.As(err, &rej) || errors.Is(err, ErrTimedOut) {
			return fail(err)
		}
		return fail(fmt.Errorf("connect %s: %w", raddr, err))
	}
	time.AfterFunc(nudgeDelay, q.nudgeIfSilent)
	return clone(ec.llp.Params.PeerPrivateData), nil
}

// activeEngineConn makes the connection of an active open of q on poller
// p and publishes it as q's; q.mu held.
func (q *QP) activeEngineConn(p *xdpnet.Poller, cfg mpa.Config) *engineConn {
	ec := newEngineConn(p, q, newMPAConn(q.eng, cfg, true))
	ec.result = make(chan error, 1)
	// On the poller, with q.mu held (engineConn.Receive).
	q.attach(ec.llp)
	established := ec.llp.OnReady
	ec.llp.OnReady = func(e *mpaConn) {
		ec.id = ec.conn.ID() // Addrs reads it under q.mu
		established(e)
		ec.report(nil)
	}
	q.conn = ec
	return ec
}

// listenEngine is Listen on the accelerated datapath: the first poller
// listens (the others will hand it SYNs that reach their queues).
func (d *Device) listenEngine(addr string, opts ListenOptions) (*Listener, error) {
	x := d.xdp
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w: %v", addr, ErrInvalidParam, err)
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil || port == 0 {
		return nil, fmt.Errorf("listen %s: %w: port", addr, ErrInvalidParam)
	}
	if host != "" {
		if a, err := netip.ParseAddr(host); err != nil || (a != x.addr && !a.IsUnspecified()) {
			return nil, fmt.Errorf("listen %s: %w: the RNIC's address is %v", addr, ErrInvalidParam, x.addr)
		}
	}
	l := &Listener{dev: d, opts: opts, reqs: make(chan *ConnRequest, opts.Backlog), done: make(chan struct{}),
		port: uint16(port), p: x.pollers[0]}
	l.addr = &net.TCPAddr{IP: x.addr.AsSlice(), Port: int(port)}
	l.el = &engineListener{l: l}
	if _, err = l.p.Listen(uint16(port), l.el); err != nil {
		return nil, fmt.Errorf("listen %s: %w", addr, err)
	}
	return l, nil
}

// engineListener is the Handler the TCP engine gives new passive
// connections; at establishment each gets an engineConn of its own.
type engineListener struct {
	l  *Listener
	tl *tcp.Listener // loop-owned: set by Listening before any SYN is steered
	// starting are the connections accepted from tl whose MPA Request
	// has not arrived; loop-owned.
	starting map[*engineConn]struct{}
}

// Listening is xdpnet's hook: it runs on the loop with the TCP listener.
func (el *engineListener) Listening(tl *tcp.Listener) { el.tl = tl }

var _ xdpnet.ListenHandler = (*engineListener)(nil)

func (el *engineListener) Receive(c *tcp.Conn, b []byte) int { return len(b) }

func (el *engineListener) Event(c *tcp.Conn, ev tcp.Event) {
	if ev != tcp.EventEstablished {
		return
	}
	l := el.l
	for el.tl.Accept() != nil {
	}
	ec := newEngineConn(l.p, nil, newMPAConn(nil, mpa.Config{}, false))
	ec.conn, ec.id = c, c.ID()
	ec.llp.OnRequest = func(_ *mpaConn, f *mpa.Frame) { l.engineRequest(ec, f) }
	c.SetHandler(ec)
	if el.starting == nil {
		el.starting = map[*engineConn]struct{}{}
	}
	el.starting[ec] = struct{}{}
	// The Request must come within RequestTimeout.
	ec.reqTimer = time.AfterFunc(l.opts.RequestTimeout, func() {
		l.p.Async(func() {
			delete(el.starting, ec)
			if ec.awaitingRequest() {
				c.Abort()
			}
		})
	})
}

// engineRequest runs on the loop with a passive connection's MPA Request:
// it is queued for Accept like the kernel datapath's.
func (l *Listener) engineRequest(ec *engineConn, f *mpa.Frame) {
	if l.el != nil {
		delete(l.el.starting, ec)
	}
	if ec.reqTimer != nil {
		ec.reqTimer.Stop()
		ec.reqTimer = nil
	}
	cr := l.newRequest(nil, ec, f)
	select {
	case <-l.done:
		ec.llp.Reject(nil)
		cr.answer()
		return
	default:
	}
	select {
	case l.reqs <- cr:
	default:
		ec.llp.Reject(nil) // backlog full
		cr.answer()
	}
}

// acceptEngine connects q to a passive connection of the accelerated
// datapath, moving it from the poller whose queue it came in on to q's.
// Accept has taken q (ConnRequest.take): q.conn is published only once the
// connection is on the QP's poller, so that no kick reaches the poller the
// connection is leaving.
func (cr *ConnRequest) acceptEngine(q *QP, private []byte) error {
	ec := cr.ec
	cfg := q.mpaConfig(private)
	var err error
	// Seed 004: the QP runs on its CQ's poller, so the connection moves
	// there from the poller that listened (with a single poller, or a
	// QP of the listener's vector, it stays).
	from, to := ec.poller(), q.Poller()
	if derr := from.Move(ec.id, to, func(c *tcp.Conn) {
		ec.pl.Store(to)
		err = ec.adopt(q, cfg, c, cr.gone.Load())
	}); derr != nil {
		err = derr
		if errors.Is(derr, xdpnet.ErrGone) {
			err = fmt.Errorf("%w: the peer closed the connection", ddp.LLPConnectionLost)
		}
	}
	if err != nil {
		return fmt.Errorf("accept: %w", err)
	}
	return nil
}

// adopt runs on the QP's poller when a passive connection has moved there:
// q answers the waiting Request and runs on the connection, unless it
// closed meanwhile (gone).
func (ec *engineConn) adopt(q *QP, cfg mpa.Config, c *tcp.Conn, gone bool) error {
	if gone || ec.conn == nil {
		return fmt.Errorf("%w: the peer closed the connection", ddp.LLPConnectionLost)
	}
	q.mu.Lock()
	ec.q = q
	q.attach(ec.llp)
	if err := ec.llp.Accept(q.eng, cfg); err != nil {
		ec.q = nil
		q.unlock()
		return err
	}
	q.conn = ec
	ec.req = nil // answered: the request is not the connection's to hold
	// A Disconnect during the accept found no connection to kick.
	abort := q.abort
	q.unlock()
	if abort {
		c.Abort()
	}
	return nil
}

// rejectEngine refuses a passive connection of the accelerated datapath.
func (cr *ConnRequest) rejectEngine(private []byte) error {
	ec := cr.ec
	pd := clone(private)
	ec.poller().Async(func() { ec.llp.Reject(pd) })
	return nil
}

// closeEngine stops an accelerated-datapath listener.
func (l *Listener) closeEngine() {
	_ = l.p.CloseListener(l.port)
	// Connections still in MPA startup have nobody to go to: reset them
	// now rather than at their request timeout.
	_ = l.p.Do(func(*tcp.Stack, tcp.Time) {
		for ec := range l.el.starting {
			if ec.awaitingRequest() {
				ec.conn.Abort()
			}
		}
		clear(l.el.starting)
	})
}

func (ec *engineConn) mpa() *mpaConn { return ec.llp }

// release is detach, on the QP's Reset and Destroy.
func (ec *engineConn) release(abort bool) { ec.detach(abort) }

// addrs are an engine connection's local and remote addresses.
func (ec *engineConn) addrs() (string, string) {
	id := ec.id
	return netip.AddrPortFrom(id.LocalAddr, id.LocalPort).String(), netip.AddrPortFrom(id.RemoteAddr, id.RemotePort).String()
}

// Waiting and Diag make the connection's QP part of the poller's stall
// report (xdpnet.Waiter); on the loop.
func (ec *engineConn) Waiting() bool {
	if ec.dead || ec.q == nil || !ec.llp.Ready() {
		return false
	}
	ec.lock()
	defer ec.unlock()
	return ec.llp.qp.Waiting()
}

func (ec *engineConn) Diag() string {
	if ec.dead || ec.q == nil || !ec.llp.Ready() {
		return fmt.Sprintf("mpa ready=%v err=%v", ec.llp.Ready(), ec.llp.Err)
	}
	ec.lock()
	defer ec.unlock()
	return ec.llp.qp.Diag()
}
