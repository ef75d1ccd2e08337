package sdp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/client"
	"github.com/softrnic/softrnic/mpa"
)

// ListenConfig configures a Listener.
type ListenConfig struct {
	// Socket is the daemon's control socket (default: SOFTRNIC_SOCKET,
	// then the one daemon socket in /run/softrnic).
	Socket string
	// Policy limits which clients are offloaded (by their address, and
	// by the listener's port); nil offloads every SDP client.
	Policy *Policy
	// DetectTimeout bounds the wait for a client's first octets, which
	// say whether it speaks SDP (default 250 ms); a client silent that
	// long is a TCP client.
	DetectTimeout time.Duration
	// HelloTimeout bounds an SDP client's setup once detected
	// (default 5 s).
	HelloTimeout time.Duration
	// TCP is the listener's own configuration.
	TCP net.ListenConfig
	// ZcopyThreshold is the SDP connections' Read Zcopy threshold, as
	// Dialer's.
	ZcopyThreshold int
	// PollFor is the SDP connections' PollFor, as Dialer's.
	PollFor time.Duration
	// Backlog bounds the connections taken from the kernel's accept
	// queue and not yet returned by Accept, being classified or waiting
	// (default DefaultBacklog). Past it the listener takes no more: the
	// kernel's queue holds them, and drops handshakes once it is full,
	// as for any listener whose application is slow to accept. So a
	// peer that opens thousands of connections holds no more than
	// Backlog of the listener's goroutines and classifications.
	Backlog int
	// Setup, when not nil, sets the options of each connection before
	// Accept returns it, the *net.TCPConn of a TCP client or the *Conn
	// of an SDP one, as Dialer.Setup; an error closes the connection.
	Setup func(TCPOptions) error
}

// DefaultBacklog is ListenConfig.Backlog's default.
const DefaultBacklog = 128

// Listener accepts SDP and TCP clients on one port, through one accept
// queue (see the package comment).
type Listener struct {
	cfg   ListenConfig
	tcp   *net.TCPListener
	queue chan net.Conn
	// slots holds a token for each connection taken from the kernel
	// and not yet returned by Accept (or closed): at most Backlog.
	slots  chan struct{}
	closed chan struct{}
	once   sync.Once
	wg     sync.WaitGroup
	// err is why the kernel listener stopped, if not Close: written
	// before closed is closed, read after.
	err error
}

// Listen listens on address, as net.Listen.
func Listen(network, address string) (net.Listener, error) {
	var lc ListenConfig
	return lc.Listen(context.Background(), network, address)
}

// Listen listens on address with the configuration.
func (lc *ListenConfig) Listen(ctx context.Context, network, address string) (net.Listener, error) {
	nl, err := lc.TCP.Listen(ctx, network, address)
	if err != nil {
		return nil, err
	}
	tl, ok := nl.(*net.TCPListener)
	if !ok {
		nl.Close()
		return nil, fmt.Errorf("sdp: listen %s: %s is not TCP", address, network)
	}
	return NewListener(tl, *lc), nil
}

// NewListener serves SDP and TCP clients on a TCP listener made elsewhere
// (inherited from systemd, or made in another network namespace); the
// Listener owns it from now on.
func NewListener(tl *net.TCPListener, cfg ListenConfig) *Listener {
	if cfg.Backlog <= 0 {
		cfg.Backlog = DefaultBacklog
	}
	l := &Listener{cfg: cfg, tcp: tl, queue: make(chan net.Conn, cfg.Backlog), slots: make(chan struct{}, cfg.Backlog),
		closed: make(chan struct{})}
	if l.cfg.DetectTimeout <= 0 {
		l.cfg.DetectTimeout = 250 * time.Millisecond
	}
	if l.cfg.HelloTimeout <= 0 {
		l.cfg.HelloTimeout = 5 * time.Second
	}
	l.wg.Add(1)
	go l.acceptLoop()
	return l
}

// Addr is the listener's address.
func (l *Listener) Addr() net.Addr { return l.tcp.Addr() }

// Accept returns the next connection: a *Conn for an SDP client, a
// *net.TCPConn for any other.
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.queue:
		<-l.slots
		return c, nil
	case <-l.closed:
		err := l.err
		if err == nil {
			err = net.ErrClosed
		}
		return nil, &net.OpError{Op: "accept", Net: "sdp", Addr: l.tcp.Addr(), Err: err}
	}
}

// Close stops listening; connections still being classified are closed.
func (l *Listener) Close() error {
	err := net.ErrClosed
	l.once.Do(func() {
		err = l.tcp.Close()
		close(l.closed)
	})
	l.wg.Wait()
	for {
		select {
		case c := <-l.queue:
			c.Close()
		default:
			return err
		}
	}
}

func (l *Listener) acceptLoop() {
	defer l.wg.Done()
	for {
		select {
		case l.slots <- struct{}{}:
		case <-l.closed:
			return
		}
		tc, err := l.tcp.AcceptTCP()
		if err != nil {
			<-l.slots
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			l.once.Do(func() {
				l.err = err
				close(l.closed)
			})
			return
		}
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			c := l.classify(tc)
			if c != nil && setup(l.cfg.Setup, c) != nil {
				c.Close()
				c = nil
			}
			if c == nil {
				<-l.slots
				return
			}
			// The queue has room: its capacity is the slots'.
			select {
			case l.queue <- c:
			case <-l.closed:
				c.Close()
				<-l.slots
			}
		}()
	}
}

// classify looks at a new connection's first octets and returns it as
// the TCP connection it is, or as the SDP connection it becomes; nil if
// it ended on the way.
func (l *Listener) classify(tc *net.TCPConn) net.Conn {
	// The policy's ports are the listener's own (Policy.Ports), not the
	// client's ephemeral one.
	local := tc.LocalAddr().(*net.TCPAddr).AddrPort()
	remote := tc.RemoteAddr().(*net.TCPAddr).AddrPort()
	offload := !offloadOff() && l.cfg.Policy.Offload(netip.AddrPortFrom(remote.Addr(), local.Port()))
	if !l.peekMPA(tc) {
		return tc
	}
	if !offload {
		// An SDP client this listener will not offload: its MPA
		// Request is refused as MPA refuses one, so that it falls
		// back to TCP at once; the application never sees its
		// octets.
		l.rejectMPA(tc)
		return nil
	}
	c, handed, err := l.serveSDP(tc)
	switch {
	case err != nil && !handed:
		// No daemon to take it (none, or one that failed): the
		// client is refused as by a listener that will not offload.
		l.rejectMPA(tc)
		return nil
	case err != nil:
		// The client asked for RDMA and will fall back to TCP on a
		// connection of its own (the daemon closed tc).
		return nil
	}
	return c
}

// peekMPA reports whether tc's first octets are an MPA Request's, reading
// nothing: a client that sends something else, or nothing within
// DetectTimeout, is TCP.
func (l *Listener) peekMPA(tc *net.TCPConn) bool {
	rc, err := tc.SyscallConn()
	if err != nil {
		return false
	}
	deadline := time.Now().Add(l.cfg.DetectTimeout)
	_ = tc.SetReadDeadline(deadline)
	defer tc.SetReadDeadline(time.Time{})
	var buf [16]byte
	for time.Now().Before(deadline) {
		var n int
		var rerr error
		err = rc.Read(func(fd uintptr) bool {
			n, _, rerr = unix.Recvfrom(int(fd), buf[:], unix.MSG_PEEK)
			return rerr != unix.EAGAIN
		})
		if err != nil || rerr != nil || n <= 0 {
			return false
		}
		if !bytes.Equal(buf[:n], mpa.KeyRequest[:n]) {
			return false
		}
		if n == mpa.KeyLen {
			return true
		}
		// Part of the key: wait for the rest (the socket stays
		// readable, so the deadline is ours to watch).
		time.Sleep(time.Millisecond)
	}
	return false
}

// rejectMPA reads the MPA Request at the start of tc, answers it with a
// Reply whose Reject bit is set (RFC 5044 §7.1.1: the responder's ULP
// refused the connection), and closes tc. A Request that does not decode,
// or not whole within HelloTimeout, is an invalid startup frame: tc is
// closed without a Reply (RFC 5044 §7.1.2).
func (l *Listener) rejectMPA(tc *net.TCPConn) {
	defer tc.Close()
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-l.closed:
			_ = tc.SetDeadline(time.Now())
		case <-done:
		}
	}()
	_ = tc.SetDeadline(time.Now().Add(l.cfg.HelloTimeout))
	b := make([]byte, mpa.FrameHeaderLen, mpa.FrameHeaderLen+mpa.MaxPrivateData)
	if _, err := io.ReadFull(tc, b); err != nil {
		return
	}
	n, err := mpa.FrameLen(b)
	if err != nil {
		return
	}
	b = b[:n]
	if _, err := io.ReadFull(tc, b[mpa.FrameHeaderLen:]); err != nil {
		return
	}
	req, _, err := mpa.ParseFrame(b, false)
	if err != nil {
		return
	}
	var cfg mpa.Config
	reply, err := cfg.Reject(&req)
	if err != nil {
		return
	}
	out, err := reply.Append(nil)
	if err != nil {
		return
	}
	// Every octet of the Request is read (its initiator sends nothing
	// more before the Reply), so the close is a FIN behind the Reply,
	// not a reset that could overtake it.
	_, _ = tc.Write(out)
}

// serveSDP hands tc to the daemon as a Socket Service Point and answers
// the client's Hello. handed says whether tc went to the daemon (and was
// closed here): if not, it is still the caller's, nothing read from it.
func (l *Listener) serveSDP(tc *net.TCPConn) (_ *Conn, handed bool, _ error) {
	ctx, cancel := context.WithTimeout(context.Background(), l.cfg.HelloTimeout)
	defer cancel()
	go func() {
		select {
		case <-l.closed:
			cancel()
		case <-ctx.Done():
		}
	}()
	sock, err := socketPath(l.cfg.Socket)
	if err != nil {
		return nil, false, err
	}
	t, c, err := openConn(ctx, sock, l.cfg.ZcopyThreshold, l.cfg.PollFor)
	if err != nil {
		return nil, false, err
	}
	started := false
	defer func() {
		if !started {
			_ = c.ep.Disconnect(false)
			c.release()
		}
	}()
	crs, err := t.ia.CreateEVD(client.EVDOptions{Depth: 4, Kind: client.CREvents | client.ConnectionEvents})
	if err != nil {
		return nil, false, err
	}
	defer crs.Free()
	ssp, err := t.ia.CreateSSP(tc, c.ep, crs, nil)
	if err != nil {
		return nil, false, err
	}
	defer func() {
		// An SSP freed before its request (the client sent part of one
		// and stalled, or the listener closed) gives the socket back:
		// it is closed here, or its descriptor and connection would
		// stay open until a garbage collection.
		if back, _ := ssp.Free(); back != nil {
			back.Close()
		}
	}()
	ev, err := crs.Wait(ctx)
	if err == nil && ev.Type != client.ConnectionRequest {
		err = fmt.Errorf("sdp: %v instead of the client's request", ev.Conn)
	}
	if err != nil {
		return nil, true, err
	}
	info, err := ev.CR.Query()
	var hello Hello
	if err == nil {
		hello, err = ParseHello(info.PrivateData)
	}
	if err == nil && hello.LocalRcvSz <= BSDHLen {
		err = fmt.Errorf("%w: Hello offers buffers of %d octets", ErrMalformed, hello.LocalRcvSz)
	}
	if err == nil && hello.Version>>4 != Version>>4 {
		// Another major version is another protocol (the first
		// generation's 1.1 sends data in its SrcAvails).
		err = fmt.Errorf("%w: Hello of version %#02x, we speak %#02x", ErrMalformed, hello.Version, Version)
	}
	if err == nil {
		// The IP version says how to read the Hello's addresses: it
		// is the connection's own.
		if ra, perr := netip.ParseAddrPort(info.RemoteAddr); perr != nil || hello.IPVersion != ipVersion(ra.Addr()) {
			err = fmt.Errorf("%w: Hello of IP version %d from %s", ErrMalformed, hello.IPVersion, info.RemoteAddr)
		}
	}
	if err != nil {
		_ = ev.CR.Reject(nil)
		return nil, true, err
	}
	ack := HelloAck{BSDH: BSDH{Bufs: recvBufs}, Version: Version, MaxAdverts: maxAdverts, ActRcvSz: bufSize}
	if err := ev.CR.Accept(c.ep, ack.Marshal()); err != nil {
		return nil, true, err
	}
	if err := c.established(ctx); err != nil {
		return nil, true, err
	}
	c.local, c.remote = tcpAddr(info.LocalAddr), tcpAddr(info.RemoteAddr)
	c.start(hello.Bufs, int(hello.LocalRcvSz), hello.MaxAdverts)
	started = true
	return c, true, nil
}
