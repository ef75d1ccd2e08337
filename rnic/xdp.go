package rnic

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/bpf"
	"github.com/softrnic/softrnic/ddp"
	"github.com/softrnic/softrnic/internal/impair"
	"github.com/softrnic/softrnic/mpa"
	"github.com/softrnic/softrnic/tcp"
	"github.com/softrnic/softrnic/xdpnet"
)

// XDPOptions configure a device on the accelerated datapath: softrnic's
// TCP engine on AF_XDP sockets, one poller per receive queue, with the XDP
// steering program sending it the RNIC's flows.
type XDPOptions struct {
	// Interface and Addr: the interface served and its IPv4 address.
	Interface string
	Addr      netip.Addr
	// Mode of the XDP program: auto (native where the driver has it),
	// native or generic.
	Mode bpf.Mode
	// Pollers is the number of pollers, each owning one receive queue
	// (queue i for poller i); 0 means one per receive queue of the
	// interface, at most one per CPU.
	Pollers int
	// Pin pins poller i to CPUs[i mod len(CPUs)], or with no CPUs to
	// CPU i modulo the number of CPUs.
	Pin  bool
	CPUs []int
	// TCP configures every poller's Stack.
	TCP tcp.Options
	// ImpairRX and ImpairTX degrade every poller's link in process (see
	// xdpnet.Config); each poller draws from its own seed.
	ImpairRX, ImpairTX impair.Config
	// Warn receives the pollers' warnings about the link (see
	// xdpnet.Config.Warn).
	Warn func(msg string)
	// Spin is how long a poller keeps polling after its last work
	// (xdpnet's default when 0).
	Spin time.Duration
	// NAPI says where the kernel runs the interface's receive work
	// (xdpnet.NAPIMode; the zero value is xdpnet.NAPIAuto).
	NAPI xdpnet.NAPIMode
}

// xdpPath is the accelerated datapath of a device.
type xdpPath struct {
	steering *bpf.Steering
	pollers  []*xdpnet.Poller
	napi     *xdpnet.NAPIControl
	cancel   context.CancelFunc
	runs     sync.WaitGroup
	addr     netip.Addr
}

// OpenXDP returns a device whose QPs run on the accelerated datapath.
// Call it on a thread in the interface's network namespace. It attaches
// the steering program, opens one AF_XDP socket per poller and starts the
// pollers; Close stops them and detaches the program.
func OpenXDP(o XDPOptions) (_ *Device, err error) {
	queues := xdpnet.RXQueues(o.Interface)
	if o.Pollers <= 0 {
		o.Pollers = min(queues, runtime.NumCPU())
	}
	if o.Pollers > queues {
		return nil, fmt.Errorf("rnic: %d pollers but %s has %d receive queues: %w", o.Pollers, o.Interface, queues, ErrInvalidParam)
	}
	x := &xdpPath{addr: o.Addr}
	group := xdpnet.NewGroup()
	defer func() {
		if err != nil {
			x.close()
		}
	}()
	// The interface checks (address, MTU, native XDP limits) come first,
	// with the messages xdpnet gives; then the program is attached once
	// and shared.
	ifi, err := xdpnet.Check(xdpnet.Config{Interface: o.Interface, Addr: o.Addr, Mode: o.Mode, TCP: o.TCP})
	if err != nil {
		return nil, err
	}
	x.steering, err = bpf.Attach(bpf.Options{Interface: o.Interface, Mode: o.Mode})
	if err != nil {
		return nil, err
	}
	cpu := func(i int) int {
		if len(o.CPUs) > 0 {
			return o.CPUs[i%len(o.CPUs)]
		}
		return i % runtime.NumCPU()
	}
	for i := range o.Pollers {
		irx, itx := o.ImpairRX, o.ImpairTX
		irx.Seed, itx.Seed = irx.Seed+uint64(2*i), itx.Seed+uint64(2*i+1)
		p, err := xdpnet.NewPoller(xdpnet.Config{Interface: o.Interface, Queue: i, Addr: o.Addr, Steering: x.steering,
			Group: group, TCP: o.TCP, Pin: o.Pin, CPU: cpu(i), Spin: o.Spin,
			ImpairRX: irx, ImpairTX: itx, Warn: o.Warn})
		if err != nil {
			return nil, err
		}
		x.pollers = append(x.pollers, p)
	}
	// After the program is attached: veth has no NAPI to thread before.
	x.napi, err = xdpnet.StartNAPI(o.Interface, ifi.Index, o.NAPI, x.framesReceived)
	if errors.Is(err, xdpnet.ErrNAPI) && o.NAPI == xdpnet.NAPIAuto {
		if o.Warn != nil {
			o.Warn(fmt.Sprintf("NAPI threading left as it is: %v", err))
		}
		x.napi, err = xdpnet.StartNAPI(o.Interface, ifi.Index, xdpnet.NAPIKeep, nil)
	}
	if err != nil {
		return nil, fmt.Errorf("rnic: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	x.cancel = cancel
	for i, p := range x.pollers {
		x.runs.Add(1)
		go func() {
			defer x.runs.Done()
			// A poller whose datapath fails (its socket or the
			// interface gone) is the operator's business.
			if err := p.Run(ctx); err != nil && o.Warn != nil {
				o.Warn(fmt.Sprintf("poller of queue %d stopped: %v", i, err))
			}
		}()
	}
	d := Open()
	d.xdp = x
	return d, nil
}

func (x *xdpPath) close() {
	if x.cancel != nil {
		x.cancel()
		x.runs.Wait()
	}
	// The NAPI setting goes back while the program still holds veth's
	// NAPI instances.
	if x.napi != nil {
		_ = x.napi.Close()
	}
	for _, p := range x.pollers {
		_ = p.Close()
	}
	if x.steering != nil {
		_ = x.steering.Close()
	}
}

// framesReceived is what the pollers have taken from their RX rings.
func (x *xdpPath) framesReceived() uint64 {
	var n uint64
	for _, p := range x.pollers {
		n += p.FramesReceived()
	}
	return n
}

// poller is the poller of a completion vector.
func (x *xdpPath) poller(vector int) *xdpnet.Poller {
	return x.pollers[vector%len(x.pollers)]
}

// Poller is the poller the QP runs on, its CQs' (seed 004); nil on the
// kernel datapath.
func (q *QP) Poller() *xdpnet.Poller { return q.dev.Poller(q.Vector()) }

// Poller is the poller of a completion vector; nil on the kernel datapath.
func (d *Device) Poller(vector int) *xdpnet.Poller {
	if d.xdp == nil {
		return nil
	}
	return d.xdp.poller(vector)
}

// Pollers returns the accelerated datapath's pollers, nil on the kernel
// datapath.
func (d *Device) Pollers() []*xdpnet.Poller {
	if d.xdp == nil {
		return nil
	}
	return d.xdp.pollers
}

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
	llp *EngineLLP
	// q is the device QP; nil while a passive connection waits for
	// the consumer.
	q *QP
	// conn is the TCP connection, set on the loop.
	conn *tcp.Conn
	// queued: a kick is queued on the poller.
	queued atomic.Bool
	// result receives the outcome of an active open, once.
	result chan error
	// req is the passive connection's request while it waits.
	req *ConnRequest
	id  tcp.FourTuple
	// dead: the QP let go of the connection (Reset, Destroy); its
	// callbacks do nothing more. finTimer: the wait for the peer's FIN
	// after ours is timed. tcpUp: the TCP handshake completed.
	// Loop-owned.
	dead, finTimer, tcpUp bool
	// serveFn is serve, made once: a method value per kick would be an
	// allocation per posted work request.
	serveFn func()
}

// newEngineConn makes the connection state for a QP (q nil while a passive
// connection waits for its consumer) on poller p.
func newEngineConn(p *xdpnet.Poller, q *QP, llp *EngineLLP) *engineConn {
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

// discard is the Handler of a connection whose QP let go of it.
type discard struct{}

func (discard) Receive(c *tcp.Conn, b []byte) int { return len(b) }
func (discard) Event(*tcp.Conn, tcp.Event)        {}

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
		c.SetHandler(discard{})
		if abort || c.State() == tcp.StateTimeWait {
			c.Abort()
			return
		}
		c.Close()
		p := ec.poller()
		time.AfterFunc(orphanTimeout, func() {
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
	// Heard: octets after MPA startup (the Reply does not count; see
	// nudgeIfSilent).
	if ec.q != nil && ec.llp.Ready() && !ec.q.heard.Load() {
		ec.q.heard.Store(true)
	}
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
	if ec.q != nil && ec.q.ec == ec && ec.q.abort {
		// An abortive disconnect resets; EngineLLP.Fill would close
		// the ended QP's connection with a FIN before serve ran. (A
		// connection the QP let go of — a failed active open whose
		// Terminate and FIN are still going out — is not the QP's
		// to reset.)
		ec.unlock()
		c.Abort()
		return 0
	}
	n := ec.llp.Fill(c, dst)
	if ec.q != nil && !ec.finTimer && ec.q.eng.Drained() {
		// A graceful disconnect has sent everything and EngineLLP.Fill
		// closed: from our FIN on, as on the kernel datapath, a peer
		// that never answers it does not hold the QP forever.
		ec.finTimer = true
		q := ec.q
		time.AfterFunc(closeTimeout, func() { ec.closeTimedOut(q) })
	}
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
	case err == nil && !ec.tcpUp && c.Err() != nil:
		// Refused, or no answer to the SYN: the peer is unreachable.
		err = fmt.Errorf("%w: %v", ErrUnreachable, c.Err())
	case err == nil && c.Err() != nil:
		// A peer that took the TCP connection and reset it during MPA
		// startup was reached: it is not an iWARP peer that answers
		// (the kernel datapath's readFrame sees the same).
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

// closeTimedOut ends a graceful disconnect the peer has not completed
// within closeTimeout: the connection is reset and the QP's remaining work
// flushed, as the kernel datapath's transmit loop does.
func (ec *engineConn) closeTimedOut(q *QP) {
	q.mu.Lock()
	if q.ec != ec || q.eng.Ended() {
		q.unlock()
		return
	}
	q.eng.LLPClosed(fmt.Errorf("%w: no FIN from the peer", ddp.LLPConnectionLost))
	q.abort = true
	q.unlock()
	ec.kick()
}

// connectEngine is Connect on the accelerated datapath: the TCP engine of
// the QP's poller opens the connection and MPA startup runs in its
// callbacks.
func (q *QP) connectEngine(ctx context.Context, raddr string, opts ConnectOptions) ([]byte, error) {
	ap, err := netip.ParseAddrPort(raddr)
	if err != nil || !ap.Addr().Is4() {
		return nil, fmt.Errorf("connect %s: want IPv4 host:port: %w", raddr, ErrInvalidParam)
	}
	timeout := opts.Timeout
	if timeout == 0 {
		timeout = DefaultMPATimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cfg := q.mpaConfig(opts.PrivateData)
	if _, err := cfg.Request(); err != nil {
		return nil, fmt.Errorf("connect: %w: %v", ErrInvalidParam, err)
	}
	p := q.Poller()
	ec := newEngineConn(p, q, NewEngineLLP(q.eng, cfg, true))
	ec.result = make(chan error, 1)
	// On the poller, with q.mu held (engineConn.Receive): Established
	// is posted where the QP reaches RTS, so that it comes before any
	// event of what follows on the connection.
	ec.llp.OnReady = func(e *EngineLLP) {
		ec.id = e.conn.ID() // Addrs reads it under q.mu
		q.post(ConnEvent{Kind: Established, PrivateData: clone(e.Params.PeerPrivateData)})
		ec.report(nil)
	}
	q.mu.Lock()
	if q.busyLocked() { // Connect looked before unlocking
		q.unlock()
		return nil, ErrState
	}
	q.ec = ec
	q.unlock()
	fail := func(err error) ([]byte, error) {
		q.mu.Lock()
		if q.ec == ec {
			q.ec = nil
		}
		q.unlock()
		return nil, err
	}
	c, err := p.Connect(ap, ec, timeout)
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
	ec := newEngineConn(l.p, nil, NewEngineLLP(nil, mpa.Config{}, false))
	ec.conn, ec.id = c, c.ID()
	ec.llp.OnRequest = func(_ *EngineLLP, f *mpa.Frame) { l.engineRequest(ec, f) }
	c.SetHandler(ec)
	if el.starting == nil {
		el.starting = map[*engineConn]struct{}{}
	}
	el.starting[ec] = struct{}{}
	// The Request must come within RequestTimeout.
	time.AfterFunc(l.opts.RequestTimeout, func() {
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
	id := ec.id
	cr := &ConnRequest{l: l, ec: ec, PrivateData: clone(f.PrivateData),
		RemoteAddr: &net.TCPAddr{IP: id.RemoteAddr.AsSlice(), Port: int(id.RemotePort)},
		LocalAddr:  &net.TCPAddr{IP: id.LocalAddr.AsSlice(), Port: int(id.LocalPort)}}
	ec.req = cr
	cr.mu.Lock()
	cr.timer = time.AfterFunc(l.opts.RequestTimeout, func() { _ = cr.Reject(nil) })
	cr.mu.Unlock()
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
func (cr *ConnRequest) acceptEngine(q *QP, private []byte) error {
	ec := cr.ec
	if q.dev != cr.l.dev {
		return fmt.Errorf("accept: QP of another device: %w", ErrInvalidParam)
	}
	q.mu.Lock()
	if q.busyLocked() { // Accept looked before unlocking
		q.unlock()
		return ErrState
	}
	// The QP is taken, but q.ec is published only once the connection
	// is on the QP's poller: until then no kick may reach the poller the
	// connection is leaving.
	q.accepting = true
	q.unlock()
	defer func() {
		q.mu.Lock()
		q.accepting = false
		q.unlock()
	}()
	if !cr.answer() {
		return ErrAnswered
	}
	cfg := q.mpaConfig(private)
	var err error
	// Seed 004: the QP runs on its CQ's poller, so the connection moves
	// there from the poller that listened (with a single poller, or a
	// QP of the listener's vector, it stays).
	from, to := ec.poller(), q.Poller()
	if derr := from.Move(ec.id, to, func(c *tcp.Conn) {
		ec.pl.Store(to)
		if cr.gone.Load() || ec.conn == nil {
			err = fmt.Errorf("%w: the peer closed the connection", ddp.LLPConnectionLost)
			return
		}
		q.mu.Lock()
		ec.q = q
		if err = ec.llp.Accept(q.eng, cfg); err != nil {
			ec.q = nil
			q.unlock()
			return
		}
		q.ec = ec
		// At RTS, before anything the connection does next.
		q.post(ConnEvent{Kind: Established, PrivateData: cr.PrivateData})
		// A Disconnect during the accept found no connection to kick.
		abort := q.abort
		q.unlock()
		if abort {
			c.Abort()
		}
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

// addrs are an engine connection's local and remote addresses.
func (ec *engineConn) addrs() (string, string) {
	id := ec.id
	return netip.AddrPortFrom(id.LocalAddr, id.LocalPort).String(), netip.AddrPortFrom(id.RemoteAddr, id.RemotePort).String()
}
