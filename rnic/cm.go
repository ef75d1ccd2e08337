package rnic

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/softrnic/softrnic/ddp"
	"github.com/softrnic/softrnic/mpa"
	"github.com/softrnic/softrnic/xdpnet"
)

// Connection setup errors. A rejection carries the peer's private data.
var (
	ErrUnreachable = errors.New("rnic: peer unreachable")
	ErrTimedOut    = errors.New("rnic: connection setup timed out")
	ErrState       = errors.New("rnic: QP not in a state to connect")
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
}

// Connect establishes the QP's connection to raddr (host:port): TCP, then
// the MPA Request and Reply, then RTS. The peer's private data is in the
// Established event, and returned.
func (q *QP) Connect(ctx context.Context, raddr string, opts ConnectOptions) ([]byte, error) {
	q.mu.Lock()
	busy := q.busyLocked()
	q.unlock()
	if busy {
		return nil, ErrState
	}
	if q.dev.xdp != nil {
		return q.connectEngine(ctx, raddr, opts)
	}
	timeout := opts.Timeout
	if timeout == 0 {
		timeout = DefaultMPATimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	d := opts.Dialer
	if d == nil {
		d = &net.Dialer{}
	}
	nc, err := d.DialContext(ctx, "tcp", raddr)
	if err != nil {
		// The dialer times out at the context's deadline, which can be
		// a moment before the context itself says so.
		var ne net.Error
		if ctx.Err() != nil || (errors.As(err, &ne) && ne.Timeout()) {
			return nil, fmt.Errorf("connect %s: %w", raddr, ErrTimedOut)
		}
		return nil, fmt.Errorf("connect %s: %w: %v", raddr, ErrUnreachable, err)
	}
	conn := nc.(*net.TCPConn)
	_ = conn.SetNoDelay(true)
	cfg := q.mpaConfig(opts.PrivateData)
	req, err := cfg.Request()
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("connect: %w: %v", ErrInvalidParam, err)
	}
	deadline, _ := ctx.Deadline()
	_ = conn.SetDeadline(deadline)
	// A cancelled ctx (the consumer went away) ends the MPA exchange at
	// once, and the peer sees a reset.
	stop := context.AfterFunc(ctx, func() {
		_ = conn.SetLinger(0)
		_ = conn.SetDeadline(time.Unix(1, 0))
	})
	defer stop()
	wire, _ := req.Append(nil)
	if _, err := conn.Write(wire); err != nil {
		conn.Close()
		if errors.Is(ioErr(err), ErrTimedOut) || ctx.Err() != nil {
			// The deadline (or a cancel) came as the Request went out.
			return nil, fmt.Errorf("connect %s: send MPA Request: %w", raddr, ErrTimedOut)
		}
		return nil, fmt.Errorf("connect %s: send MPA Request: %w: %v", raddr, ErrUnreachable, err)
	}
	reply, err := readFrame(conn, true)
	if err != nil {
		conn.Close()
		if errors.Is(err, ErrTimedOut) {
			return nil, fmt.Errorf("connect %s: no MPA Reply: %w", raddr, err)
		}
		return nil, fmt.Errorf("connect %s: MPA Reply: %w", raddr, err)
	}
	if !stop() {
		// ctx ended as the Reply came: the connection is being reset.
		conn.Close()
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return nil, fmt.Errorf("connect %s: no MPA Reply: %w", raddr, ErrTimedOut)
		}
		return nil, fmt.Errorf("connect %s: %w", raddr, ctx.Err())
	}
	_ = conn.SetDeadline(time.Time{})
	p, err := cfg.Complete(&reply)
	if errors.Is(err, mpa.ErrRejected) {
		conn.Close()
		return nil, &RejectedError{PrivateData: clone(reply.PrivateData)}
	}
	if err != nil {
		if wire := negotiationTerminate(p, err); wire != nil {
			_, _ = conn.Write(wire)
		}
		conn.Close()
		return nil, fmt.Errorf("connect %s: %w", raddr, err)
	}
	pd := clone(p.PeerPrivateData)
	if err := q.start(conn, p, true, ConnEvent{Kind: Established, PrivateData: pd}); err != nil {
		conn.Close()
		return nil, fmt.Errorf("connect %s: %w", raddr, err)
	}
	time.AfterFunc(nudgeDelay, q.nudgeIfSilent)
	return pd, nil
}

func clone(b []byte) []byte {
	if b == nil {
		return nil
	}
	return append([]byte(nil), b...)
}

// readFrame reads one MPA startup frame under the connection's deadline.
func readFrame(conn net.Conn, reply bool) (mpa.Frame, error) {
	buf := make([]byte, mpa.FrameHeaderLen, mpa.FrameHeaderLen+mpa.MaxPrivateData)
	// The key first: a peer that is not iWARP (an HTTP client's short
	// request) is refused at once, not after the header it never sends.
	if _, err := io.ReadFull(conn, buf[:mpa.KeyLen]); err != nil {
		return mpa.Frame{}, ioErr(err)
	}
	if _, _, err := mpa.ParseFrame(buf[:mpa.KeyLen], reply); err != mpa.ErrShortFrame {
		return mpa.Frame{}, err
	}
	if _, err := io.ReadFull(conn, buf[mpa.KeyLen:]); err != nil {
		return mpa.Frame{}, ioErr(err)
	}
	n, err := mpa.FrameLen(buf)
	if err != nil {
		return mpa.Frame{}, err
	}
	// Check the key before waiting for private data that may never come.
	if _, _, err := mpa.ParseFrame(append(buf[:mpa.FrameHeaderLen:mpa.FrameHeaderLen], make([]byte, n-mpa.FrameHeaderLen)...), reply); err != nil && err != mpa.ErrShortFrame {
		return mpa.Frame{}, err
	}
	buf = buf[:n]
	if _, err := io.ReadFull(conn, buf[mpa.FrameHeaderLen:]); err != nil {
		return mpa.Frame{}, ioErr(err)
	}
	f, _, err := mpa.ParseFrame(buf, reply)
	return f, err
}

func ioErr(err error) error {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return ErrTimedOut
	}
	return fmt.Errorf("%w: %v", ddp.LLPConnectionLost, err)
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
	// rejected. Default 128.
	Backlog int
	// RequestTimeout bounds the wait for a new connection's MPA Request,
	// and then for the consumer to accept or reject it.
	RequestTimeout time.Duration
}

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
	// shaking are the kernel datapath's connections whose MPA Request
	// is being read, for Close to end those reads at once.
	shakeMu sync.Mutex
	shaking map[*net.TCPConn]struct{}
}

// Listen starts accepting connection requests on addr (host:port).
func (d *Device) Listen(addr string, opts ListenOptions) (*Listener, error) {
	if opts.Backlog <= 0 {
		opts.Backlog = 128
	}
	if opts.RequestTimeout <= 0 {
		opts.RequestTimeout = DefaultMPATimeout
	}
	if d.xdp != nil {
		return d.listenEngine(addr, opts)
	}
	la, err := net.ResolveTCPAddr("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w: %v", addr, ErrInvalidParam, err)
	}
	ln, err := net.ListenTCP("tcp", la)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", addr, err)
	}
	l := &Listener{dev: d, ln: ln, opts: opts, reqs: make(chan *ConnRequest, opts.Backlog), done: make(chan struct{})}
	l.loops.Add(1)
	go l.acceptLoop()
	return l, nil
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
			l.ln.Close()
			// A peer that sends half a Request, or nothing, does not
			// hold Close (and the daemon's shutdown) for the request
			// timeout.
			l.shakeMu.Lock()
			for nc := range l.shaking {
				_ = nc.SetDeadline(time.Now())
			}
			l.shakeMu.Unlock()
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

func (l *Listener) acceptLoop() {
	defer l.loops.Done()
	for {
		nc, err := l.ln.AcceptTCP()
		if err != nil {
			select {
			case <-l.done:
				return
			default:
			}
			time.Sleep(10 * time.Millisecond) // e.g. EMFILE: do not spin
			continue
		}
		l.loops.Add(1)
		go l.handshake(nc)
	}
}

// handshake reads the MPA Request of a new connection and queues the request.
func (l *Listener) handshake(nc *net.TCPConn) {
	defer l.loops.Done()
	_ = nc.SetNoDelay(true)
	l.shakeMu.Lock()
	select {
	case <-l.done:
		l.shakeMu.Unlock()
		nc.Close()
		return
	default:
	}
	if l.shaking == nil {
		l.shaking = map[*net.TCPConn]struct{}{}
	}
	l.shaking[nc] = struct{}{}
	_ = nc.SetDeadline(time.Now().Add(l.opts.RequestTimeout))
	l.shakeMu.Unlock()
	req, err := readFrame(nc, false)
	l.shakeMu.Lock()
	delete(l.shaking, nc)
	l.shakeMu.Unlock()
	if err != nil {
		// RFC 5044 §7.1.2: a bad Request closes the connection.
		nc.Close()
		return
	}
	cr := &ConnRequest{l: l, conn: nc, req: req, PrivateData: clone(req.PrivateData),
		RemoteAddr: nc.RemoteAddr().(*net.TCPAddr), LocalAddr: nc.LocalAddr().(*net.TCPAddr)}
	cr.req.PrivateData = cr.PrivateData
	// The timer may fire at once; answer() takes cr.mu, so it sees timer.
	cr.mu.Lock()
	cr.timer = time.AfterFunc(l.opts.RequestTimeout, func() { _ = cr.Reject(nil) })
	cr.mu.Unlock()
	select {
	case l.reqs <- cr:
	case <-l.done:
		_ = cr.Reject(nil)
	default:
		_ = cr.Reject(nil) // backlog full
	}
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
	l        *Listener
	conn     *net.TCPConn
	req      mpa.Frame
	timer    *time.Timer
	mu       sync.Mutex
	answered bool
	// ec is the connection on the accelerated datapath (conn is nil);
	// gone: it closed before the answer.
	ec          *engineConn
	gone        atomic.Bool
	PrivateData []byte
	RemoteAddr  *net.TCPAddr
	LocalAddr   *net.TCPAddr
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
	q.mu.Lock()
	busy := q.busyLocked()
	q.unlock()
	if busy {
		return ErrState
	}
	if cr.ec != nil {
		return cr.acceptEngine(q, private)
	}
	if !cr.answer() {
		return ErrAnswered
	}
	wire, p, err := acceptWire(q.mpaConfig(private), &cr.req)
	if err != nil {
		cr.conn.Close()
		return fmt.Errorf("accept: %w", err)
	}
	// Nothing reads the socket until start, so the initiator's first
	// FPDUs wait in the kernel until the engine is in RTS.
	_ = cr.conn.SetDeadline(time.Now().Add(cr.l.opts.RequestTimeout))
	if _, err := cr.conn.Write(wire); err != nil {
		cr.conn.Close()
		return fmt.Errorf("accept: send MPA Reply: %w", err)
	}
	_ = cr.conn.SetDeadline(time.Time{})
	if err := q.start(cr.conn, p, false, ConnEvent{Kind: Established, PrivateData: cr.PrivateData}); err != nil {
		cr.conn.Close()
		return fmt.Errorf("accept: %w", err)
	}
	return nil
}

// Reject refuses the request with the consumer's private data (R bit).
func (cr *ConnRequest) Reject(private []byte) error {
	if !cr.answer() {
		return ErrAnswered
	}
	if cr.ec != nil {
		return cr.rejectEngine(private)
	}
	if wire := rejectWire(&cr.req, private); wire != nil {
		_ = cr.conn.SetWriteDeadline(time.Now().Add(time.Second))
		_, _ = cr.conn.Write(wire)
	}
	return cr.conn.Close()
}
