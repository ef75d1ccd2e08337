package rnic

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/softrnic/softrnic/ddp"
	"github.com/softrnic/softrnic/mpa"
	"github.com/softrnic/softrnic/xdpnet"
)

// Connection setup errors. A rejection carries the peer's private data.
var (
	ErrUnreachable = errors.New("rnic: peer unreachable")
	// ErrRefused (with ErrUnreachable): the peer's host answered the
	// connection with a reset: nothing listens on the port.
	ErrRefused  = errors.New("rnic: connection refused: nothing listens on the port")
	ErrTimedOut = errors.New("rnic: connection setup timed out")
	ErrState    = errors.New("rnic: QP not in a state to connect")
)

// RejectedError is returned by Connect when the peer's consumer rejected.
type RejectedError struct{ PrivateData []byte }

func (e *RejectedError) Error() string { return "rnic: connection rejected by the peer" }

// Unwrap makes it errors.Is(err, mpa.ErrRejected).
func (e *RejectedError) Unwrap() error { return mpa.ErrRejected }

// ConnectOptions are the initiator's.
type ConnectOptions struct {
	PrivateData []byte
	// Timeout bounds TCP connect plus MPA startup; DefaultMPATimeout if 0.
	Timeout time.Duration
	// Dialer lets tests bind a source address.
	Dialer *net.Dialer
	// Started, if set, is called once, as soon as Connect has taken what
	// the connection needs of this host — on the xdp datapath its local
	// port, before it waits for the peer's link-layer address; on the
	// kernel datapath its socket, before it connects — with nil, or with
	// the error that stopped it before: ErrResources when a limit of the
	// host did (the error names it), ErrInvalidParam, ErrState,
	// ErrUnreachable with no route. A consumer that answers its own
	// caller before the peer answers (the daemon's Connect request, which
	// DAT answers INSUFFICIENT_RESOURCES when the provider runs short)
	// waits for it; it comes without waiting on the network. It must not
	// block.
	Started func(error)
}

// Connect establishes the QP's connection to raddr (host:port): TCP, then
// the MPA Request and Reply, then RTS. The peer's private data is in the
// Established event, and returned. A failure of this host rather than of
// the peer or the path to it — out of descriptors, local ports, the
// steering program's flow table — wraps ErrResources and names the limit.
func (q *QP) Connect(ctx context.Context, raddr string, opts ConnectOptions) (_ []byte, err error) {
	started := func(error) {}
	if opts.Started != nil {
		var once sync.Once
		started = func(err error) {
			once.Do(func() {
				if errors.Is(err, xdpnet.ErrNoNeighbour) {
					err = fmt.Errorf("%w: %w", ErrUnreachable, err)
				}
				opts.Started(resourceError(err))
			})
		}
		defer func() { started(err) }() // a failure before the start
	}
	ctx, cancel, cfg, timeout, err := q.prepareConnect(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	defer cancel()
	var pd []byte
	if q.dev.xdp != nil {
		pd, err = q.connectEngine(ctx, raddr, cfg, timeout, started)
	} else {
		pd, err = q.connectKernel(ctx, raddr, cfg, startedDialer(opts.Dialer, started))
	}
	return pd, resourceError(err)
}

// prepareConnect is what Connect and SocketConnect check and set up first:
// the QP free to connect (ErrState), the deadline of opts.Timeout (or
// DefaultMPATimeout) on ctx, and the MPA Request's configuration, valid
// (ErrInvalidParam).
func (q *QP) prepareConnect(ctx context.Context, opts ConnectOptions) (context.Context, context.CancelFunc, mpa.Config, time.Duration, error) {
	q.mu.Lock()
	busy := q.busyLocked()
	q.unlock()
	if busy {
		return nil, nil, mpa.Config{}, 0, ErrState
	}
	timeout := opts.Timeout
	if timeout == 0 {
		timeout = DefaultMPATimeout
	}
	cfg := q.mpaConfig(opts.PrivateData)
	if _, err := cfg.Request(); err != nil {
		return nil, nil, mpa.Config{}, 0, fmt.Errorf("%w: %v", ErrInvalidParam, err)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	return ctx, cancel, cfg, timeout, nil
}

// startedDialer is d (or a new Dialer) calling started once the socket
// exists: the kernel calls Control after creating it, before connecting.
func startedDialer(d *net.Dialer, started func(error)) *net.Dialer {
	var sd net.Dialer
	if d != nil {
		sd = *d
	}
	control := sd.Control
	sd.Control = func(network, address string, c syscall.RawConn) error {
		var err error
		if control != nil {
			err = control(network, address, c)
		}
		if err == nil {
			started(nil)
		}
		return err
	}
	return &sd
}

// resourceError is err, wrapping ErrResources with the limit it names when
// a limit of this host caused it (xdpnet's ErrResources, or the errno of a
// socket, accept or bind that ran out of descriptors or memory), for
// errors.Is(err, ErrResources): such a failure is neither the peer's
// answer nor the path's, and must not reach the consumer as one.
func resourceError(err error) error {
	if err == nil || errors.Is(err, ErrResources) {
		return err
	}
	if lim := xdpnet.ResourceError(err); errors.Is(lim, xdpnet.ErrResources) {
		return fmt.Errorf("%w: %w", ErrResources, lim)
	}
	return err
}

func clone(b []byte) []byte {
	if b == nil {
		return nil
	}
	return append([]byte(nil), b...)
}

// negotiationTerminate is the lone Terminate (framed) that reports an MPA
// negotiation failure of the initiator on a connection that never reached
// RTS (RFC 6581 §9: IRD or RTR failures), or nil for other failures.
func negotiationTerminate(p mpa.Params, err error) []byte {
	var cause ddp.TerminateError
	if !errors.As(err, &cause) || (cause != ddp.LLPInsufficientIRD && cause != ddp.LLPNoMatchingRTR) {
		return nil
	}
	f := ddp.TerminateFields{Error: cause}
	body := make([]byte, ddp.UntaggedHeaderLen+f.Len())
	ddp.Untagged(body).Encode(&ddp.UntaggedFields{Last: true, Opcode: ddp.OpTerminate, QN: ddp.QNTerminate, MSN: 1})
	ddp.Terminate(body[ddp.UntaggedHeaderLen:]).Encode(&f)
	return mpa.NewFramer(p.CRC, p.MarkersTx).Append(nil, body, nil)
}

// acceptWire is the MPA Reply that accepts req with cfg, and the
// negotiated parameters. An initiator IRD below our ORD shrinks our ORD
// (RFC 6581 §9.1 lets us reject instead; a consumer that needs the depth
// can check ORD).
func acceptWire(cfg mpa.Config, req *mpa.Frame) ([]byte, mpa.Params, error) {
	reply, p, err := cfg.Accept(req)
	if err != nil && !errors.Is(err, ddp.LLPInsufficientIRD) {
		return nil, p, err
	}
	wire, err := reply.Append(nil)
	return wire, p, err
}

// rejectWire is the MPA Reply that rejects req with private data, or nil
// when none can be built.
func rejectWire(req *mpa.Frame, private []byte) []byte {
	cfg := mpa.Config{PrivateData: private}
	reply, err := cfg.Reject(req)
	if err != nil {
		return nil
	}
	wire, _ := reply.Append(nil)
	return wire
}

// ListenOptions configure a Listener.
type ListenOptions struct {
	// Backlog bounds connection requests waiting for Accept; more are
	// rejected. Default DefaultBacklog.
	Backlog int
	// RequestTimeout bounds the wait for a new connection's MPA Request,
	// and then for the consumer to accept or reject it.
	RequestTimeout time.Duration
	// AnswerTimeout, if set, bounds the consumer's answer instead: for
	// a consumer that holds requests on purpose (daemon/ibconn.go) and
	// still wants a peer that says nothing closed soon.
	AnswerTimeout time.Duration
}

// DefaultBacklog is ListenOptions.Backlog's default, Linux's SOMAXCONN
// since 5.4. A request beyond it is rejected, and its initiator sees what
// looks like the peer's rejection: with 128, a client that opened 1,000
// connections at once had 15 of them rejected whenever the consumer's
// accepting goroutine lost the CPU to the pollers for a moment. A request
// waiting costs a pointer here.
const DefaultBacklog = 4096

// Listener is a passive endpoint on a TCP port.
type Listener struct {
	dev *Device
	ln  *net.TCPListener
	// On the accelerated datapath: the port and the poller listening
	// (ln is nil).
	port  uint16
	p     *xdpnet.Poller
	el    *engineListener
	addr  *net.TCPAddr
	opts  ListenOptions
	reqs  chan *ConnRequest
	done  chan struct{}
	once  sync.Once
	loops sync.WaitGroup
	// starting are the kernel datapath's connections whose MPA Request
	// has not come, for Close to reset them at once.
	startMu  sync.Mutex
	starting map[*kernelConn]struct{}
	// failMu guards what acceptFailed counts between two warnings.
	failMu     sync.Mutex
	failWarned time.Time
	failCount  int
}

// acceptWarnEvery spaces the warnings of acceptFailed.
const acceptWarnEvery = 10 * time.Second

// acceptFailed tells the operator, through the device's warnings, that a
// peer's connection could not be taken (the kernel datapath's accept ran
// out of descriptors): nobody else hears of it, and the peer only sees
// its request unanswered. At most one warning per acceptWarnEvery, with
// the number since the last.
func (l *Listener) acceptFailed(err error) {
	l.failMu.Lock()
	l.failCount++
	now := time.Now()
	if !l.failWarned.IsZero() && now.Sub(l.failWarned) < acceptWarnEvery {
		l.failMu.Unlock()
		return
	}
	n := l.failCount
	l.failWarned, l.failCount = now, 0
	l.failMu.Unlock()
	l.dev.warnf("listener %v: %d connection requests not taken: %v", l.Addr(), n, resourceError(err))
}

// Listen starts accepting connection requests on addr (host:port).
func (d *Device) Listen(addr string, opts ListenOptions) (*Listener, error) {
	if opts.Backlog <= 0 {
		opts.Backlog = DefaultBacklog
	}
	if opts.RequestTimeout <= 0 {
		opts.RequestTimeout = DefaultMPATimeout
	}
	var l *Listener
	var err error
	if d.xdp != nil {
		l, err = d.listenEngine(addr, opts)
	} else {
		l, err = d.listenKernel(addr, opts)
	}
	return l, resourceError(err)
}

// Addr is the listening address.
func (l *Listener) Addr() *net.TCPAddr {
	if l.ln == nil {
		return l.addr
	}
	return l.ln.Addr().(*net.TCPAddr)
}

// Close stops listening; requests not yet accepted are rejected.
func (l *Listener) Close() error {
	l.once.Do(func() {
		close(l.done)
		if l.ln != nil {
			// A peer that sends half a Request, or nothing, does not
			// hold Close (and the daemon's shutdown) for the request
			// timeout.
			l.closeKernel()
		} else {
			l.closeEngine()
		}
		l.loops.Wait()
		for {
			select {
			case cr := <-l.reqs:
				_ = cr.Reject(nil)
			default:
				return
			}
		}
	})
	return nil
}

// Accept waits for the next connection request.
func (l *Listener) Accept(ctx context.Context) (*ConnRequest, error) {
	select {
	case cr := <-l.reqs:
		return cr, nil
	case <-l.done:
		return nil, ErrClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// ConnRequest is an incoming connection waiting for the consumer's answer.
type ConnRequest struct {
	l *Listener
	// kc is the connection on the kernel datapath, ec on the
	// accelerated one.
	kc       *kernelConn
	timer    *time.Timer
	mu       sync.Mutex
	answered bool
	ec       *engineConn
	// gone: the connection closed before the answer.
	gone        atomic.Bool
	PrivateData []byte
	RemoteAddr  *net.TCPAddr
	LocalAddr   *net.TCPAddr
}

// newRequest makes the connection request of the peer's MPA Request f on
// kc (kernel datapath) or ec (xdp datapath), the connection's own until
// answered, with the consumer's answer timed by l's AnswerTimeout, or
// RequestTimeout without one (a rejection when it runs out).
func (l *Listener) newRequest(kc *kernelConn, ec *engineConn, f *mpa.Frame) *ConnRequest {
	cr := &ConnRequest{l: l, kc: kc, ec: ec, PrivateData: clone(f.PrivateData)}
	if kc != nil {
		cr.RemoteAddr, cr.LocalAddr = kc.nc.RemoteAddr().(*net.TCPAddr), kc.nc.LocalAddr().(*net.TCPAddr)
		kc.req = cr
	} else {
		id := ec.id
		cr.RemoteAddr = &net.TCPAddr{IP: id.RemoteAddr.AsSlice(), Port: int(id.RemotePort)}
		cr.LocalAddr = &net.TCPAddr{IP: id.LocalAddr.AsSlice(), Port: int(id.LocalPort)}
		ec.req = cr
	}
	cr.mu.Lock()
	answer := l.opts.AnswerTimeout
	if answer <= 0 {
		answer = l.opts.RequestTimeout
	}
	cr.timer = time.AfterFunc(answer, func() { _ = cr.Reject(nil) })
	cr.mu.Unlock()
	return cr
}

// ErrAnswered: the request was already accepted, rejected or timed out.
var ErrAnswered = errors.New("rnic: connection request already answered")

func (cr *ConnRequest) answer() bool {
	cr.mu.Lock()
	defer cr.mu.Unlock()
	if cr.answered {
		return false
	}
	cr.answered = true
	cr.timer.Stop()
	return true
}

// Accept connects q to the request: the MPA Reply goes out with the
// consumer's private data, and q is in RTS. Receives posted on q before
// Accept catch the peer's first messages.
func (cr *ConnRequest) Accept(q *QP, private []byte) error {
	if q.dev != cr.l.dev {
		return fmt.Errorf("accept: QP of another device: %w", ErrInvalidParam)
	}
	release, err := cr.take(q)
	if err != nil {
		return err
	}
	defer release()
	if cr.ec != nil {
		return cr.acceptEngine(q, private)
	}
	return cr.acceptKernel(q, private)
}

// take answers the request with q: q is taken (accepting) until release,
// so that no Connect or other Accept uses it while the connection is
// being given to it, which publishes it as q.conn.
func (cr *ConnRequest) take(q *QP) (release func(), err error) {
	q.mu.Lock()
	if q.busyLocked() {
		q.unlock()
		return nil, ErrState
	}
	q.accepting = true
	q.unlock()
	release = func() {
		q.mu.Lock()
		q.accepting = false
		q.unlock()
	}
	if !cr.answer() {
		release()
		return nil, ErrAnswered
	}
	return release, nil
}

// Reject refuses the request with the consumer's private data (R bit).
func (cr *ConnRequest) Reject(private []byte) error {
	if !cr.answer() {
		return ErrAnswered
	}
	if cr.ec != nil {
		return cr.rejectEngine(private)
	}
	return cr.rejectKernel(private)
}
