package sdp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/softrnic/softrnic/client"
	"github.com/softrnic/softrnic/ctl"
)

// EnvOffload turns offload off when set to "0", "off" or "false": every
// connection is plain TCP, as seed 002's AF_INET_DIRECT did when unset.
// EnvSocket names the daemon's control socket.
const (
	EnvOffload = "SOFTRNIC_SDP"
	EnvSocket  = "SOFTRNIC_SOCKET"
)

// offloadOff reports whether the environment turns offload off.
func offloadOff() bool {
	switch strings.ToLower(os.Getenv(EnvOffload)) {
	case "0", "off", "false", "no":
		return true
	}
	return false
}

// socketPath is the daemon's control socket: s, else $SOFTRNIC_SOCKET,
// else the one daemon socket in /run/softrnic (ctl.FindSocket; none or
// several there is an error, and the connection TCP).
func socketPath(s string) (string, error) {
	if s != "" {
		return s, nil
	}
	if s := os.Getenv(EnvSocket); s != "" {
		return s, nil
	}
	return ctl.FindSocket()
}

// transport is one session with a daemon, shared by every connection of
// the process through that daemon: an IA (each connection makes its own PZ).
type transport struct {
	ia *client.IA
}

// transportOpen is the session with one daemon, opened once however many
// Dials and listeners ask for it at the same time: done is closed once
// the open has ended, t or err written before.
type transportOpen struct {
	done chan struct{}
	t    *transport
	err  error
}

var transports struct {
	// mu guards m. It is never held across a call to a daemon, so that
	// a slow or stuck daemon delays only the Dials that use it.
	mu sync.Mutex
	m  map[string]*transportOpen
}

// openTimeout bounds the connect of a session's open (the daemon's
// answer to Hello is the client's to wait for).
const openTimeout = 30 * time.Second

// getTransport returns the session with the daemon at socket, opening it
// (again, if it failed or the daemon went away) when needed. Callers that
// come while it is being opened wait for that open, each until its own
// ctx is done; the open goes on for the next caller meanwhile.
func getTransport(ctx context.Context, socket string) (*transport, error) {
	transports.mu.Lock()
	o := transports.m[socket]
	var gone *client.IA
	if o != nil {
		select {
		case <-o.done:
			if o.err != nil {
				o = nil
			} else if o.t.ia.Gone() {
				// Its connections have all failed; its descriptors
				// would stay open for the life of the process.
				gone, o = o.t.ia, nil
			}
		default: // being opened
		}
	}
	if o == nil {
		o = &transportOpen{done: make(chan struct{})}
		if transports.m == nil {
			transports.m = map[string]*transportOpen{}
		}
		transports.m[socket] = o
		go o.open(socket)
	}
	transports.mu.Unlock()
	if gone != nil {
		gone.Close()
	}
	select {
	case <-o.done:
		if o.err != nil {
			return nil, o.err
		}
		return o.t, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// openConn is newConn on the session with the daemon at socket. A
// session found gone only now, by this connection's first request (the
// daemon restarted since the last connection), is opened again once.
func openConn(ctx context.Context, socket string, zcopyThreshold int, pollFor time.Duration) (*transport, *Conn, error) {
	for try := 0; ; try++ {
		t, err := getTransport(ctx, socket)
		if err != nil {
			return nil, nil, err
		}
		c, err := newConn(t, zcopyThreshold, pollFor)
		if err != nil && try == 0 && t.ia.Gone() {
			continue
		}
		return t, c, err
	}
}

// open opens the session (no lock held).
func (o *transportOpen) open(socket string) {
	ctx, cancel := context.WithTimeout(context.Background(), openTimeout)
	defer cancel()
	ia, err := client.Open(ctx, client.Options{Socket: socket, Name: "sdp"})
	if err != nil {
		o.err = err
	} else {
		o.t = &transport{ia: ia}
	}
	close(o.done)
}

// Policy decides which connections may be offloaded: an address and port
// allowed, and not denied. Empty lists allow everything.
type Policy struct {
	Allow, Deny []netip.Prefix
	// Ports, when not empty, are the only remote (Dial) or local
	// (Listen) ports offloaded.
	Ports []uint16
}

// Offload reports whether a connection to or from ap may use SDP.
func (p *Policy) Offload(ap netip.AddrPort) bool {
	if p == nil {
		return true
	}
	a := ap.Addr().Unmap()
	for _, d := range p.Deny {
		if d.Contains(a) {
			return false
		}
	}
	if len(p.Allow) > 0 {
		ok := false
		for _, al := range p.Allow {
			ok = ok || al.Contains(a)
		}
		if !ok {
			return false
		}
	}
	if len(p.Ports) > 0 {
		for _, port := range p.Ports {
			if port == ap.Port() {
				return true
			}
		}
		return false
	}
	return true
}

// Dialer dials SDP connections, and plain TCP ones when SDP cannot be had.
type Dialer struct {
	// Socket is the daemon's control socket (default: SOFTRNIC_SOCKET,
	// then the one daemon socket in /run/softrnic).
	Socket string
	// Policy limits offload; nil offloads every connection.
	Policy *Policy
	// HelloTimeout bounds the RDMA connection's setup (TCP, MPA and
	// the Hello); past it Dial falls back to TCP (default 2 s).
	HelloTimeout time.Duration
	// TCP is the dialer of the fallback.
	TCP net.Dialer
	// Fallback, when not nil, dials the fallback instead of TCP (a
	// proxy's dialer, or one in another network namespace).
	Fallback func(ctx context.Context, network, address string) (net.Conn, error)
	// NoFallback makes Dial fail where it would fall back to TCP.
	NoFallback bool
	// ZcopyThreshold is the connections' Read Zcopy threshold
	// (Conn.SetZcopyThreshold): 0 means DefaultZcopyThreshold, < 0 turns
	// Read Zcopy off.
	ZcopyThreshold int
	// PollFor is how long a waiting Read or Write looks for its event
	// before it sleeps: 0 means DefaultPollFor, < 0 sleeps at once.
	PollFor time.Duration
	// Setup, when not nil, sets the options of the connection before
	// Dial returns it, whichever path won: the *net.TCPConn of the
	// fallback (or a Fallback's connection, if it has the setters) or
	// the *Conn, as a program would on a TCP connection it dialed. An
	// error closes the connection and fails the Dial.
	Setup func(TCPOptions) error
}

// TCPOptions are the setters a *net.TCPConn and a *Conn share: what
// Dialer.Setup and ListenConfig.Setup are given.
type TCPOptions interface {
	SetNoDelay(bool) error
	SetKeepAlive(bool) error
	SetKeepAlivePeriod(time.Duration) error
	SetLinger(int) error
	SetReadBuffer(int) error
	SetWriteBuffer(int) error
}

var (
	_ TCPOptions = (*net.TCPConn)(nil)
	_ TCPOptions = (*Conn)(nil)
)

// setup applies f to c if c has the setters.
func setup(f func(TCPOptions) error, c net.Conn) error {
	o, ok := c.(TCPOptions)
	if f == nil || !ok {
		return nil
	}
	if err := f(o); err != nil {
		return fmt.Errorf("sdp: setup: %w", err)
	}
	return nil
}

// ErrNoOffload says why a connection was not offloaded (with NoFallback).
var ErrNoOffload = errors.New("sdp: not offloaded")

// Dial connects to address, as net.Dial: an SDP connection when the peer
// is an SDP listener behind a softrnicd, a TCP one otherwise.
func Dial(network, address string) (net.Conn, error) {
	var d Dialer
	return d.DialContext(context.Background(), network, address)
}

// DialContext is Dial with a context, as net.Dialer's.
func (d *Dialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	c, err := d.dial(ctx, network, address)
	if err != nil {
		return nil, err
	}
	if err := setup(d.Setup, c); err != nil {
		c.Close()
		return nil, &net.OpError{Op: "dial", Net: "sdp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
	}
	return c, nil
}

// dial is DialContext without the Setup.
func (d *Dialer) dial(ctx context.Context, network, address string) (net.Conn, error) {
	c, err := d.dialSDP(ctx, network, address)
	if err == nil {
		return c, nil
	}
	if d.NoFallback || ctx.Err() != nil {
		return nil, &net.OpError{Op: "dial", Net: "sdp", Err: err}
	}
	if d.Fallback != nil {
		return d.Fallback(ctx, network, address)
	}
	return d.TCP.DialContext(ctx, network, address)
}

// dialSDP tries the RDMA connection.
func (d *Dialer) dialSDP(ctx context.Context, network, address string) (*Conn, error) {
	switch network {
	case "tcp", "tcp4", "tcp6":
	default:
		return nil, fmt.Errorf("%w: network %s", ErrNoOffload, network)
	}
	if offloadOff() {
		return nil, fmt.Errorf("%w: %s=%s", ErrNoOffload, EnvOffload, os.Getenv(EnvOffload))
	}
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		// A name: resolve it as the TCP dialer would.
		host, portName, err := net.SplitHostPort(address)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrNoOffload, err)
		}
		addrs, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		if err == nil && len(addrs) == 0 {
			err = fmt.Errorf("no address for %s", host)
		}
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrNoOffload, err)
		}
		port, err := net.DefaultResolver.LookupPort(ctx, network, portName)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrNoOffload, err)
		}
		ap = netip.AddrPortFrom(addrs[0], uint16(port))
	}
	if !d.Policy.Offload(ap) {
		return nil, fmt.Errorf("%w: %v by policy", ErrNoOffload, ap)
	}
	timeout := d.HelloTimeout
	if timeout <= 0 {
		timeout = 2 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	sock, err := socketPath(d.Socket)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoOffload, err)
	}
	t, c, err := openConn(ctx, sock, d.ZcopyThreshold, d.PollFor)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoOffload, err)
	}
	local, _ := netip.ParseAddr(t.ia.Attr().Address)
	hello := Hello{BSDH: BSDH{Bufs: recvBufs}, Version: Version, IPVersion: ipVersion(ap.Addr()), MaxAdverts: maxAdverts,
		DesRemRcvSz: bufSize, LocalRcvSz: bufSize, Src: local, Dst: ap.Addr().Unmap()}
	var info client.EPInfo
	var ack HelloAck
	err = c.ep.Connect(ap.String(), hello.Marshal(), timeout)
	if err == nil {
		err = c.established(ctx)
	}
	if err == nil {
		if info, err = c.ep.Query(); err == nil {
			ack, err = ParseHelloAck(info.PrivateData)
		}
		if err == nil && ack.ActRcvSz <= BSDHLen {
			err = fmt.Errorf("%w: HelloAck offers buffers of %d octets", ErrMalformed, ack.ActRcvSz)
		}
		if err == nil && ack.Version>>4 != Version>>4 {
			err = fmt.Errorf("%w: HelloAck of version %#02x, we speak %#02x", ErrMalformed, ack.Version, Version)
		}
	}
	if err != nil {
		_ = c.ep.Disconnect(false)
		c.release()
		return nil, fmt.Errorf("%w: %v", ErrNoOffload, err)
	}
	c.local, c.remote = tcpAddr(info.LocalAddr), tcpAddr(info.RemoteAddr)
	c.start(ack.Bufs, int(ack.ActRcvSz), ack.MaxAdverts)
	// MPA's responder sends nothing before the initiator's first FPDU
	// (RFC 5044 §7.1.2): a credit update at once lets the accepting
	// side write first, as a TCP server may.
	c.mu.Lock()
	if err = c.sendControl(MIDData); err == nil {
		c.stats.CreditUpdatesSent++
	}
	c.mu.Unlock()
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("%w: the first credit update: %v", ErrNoOffload, err)
	}
	return c, nil
}

func ipVersion(a netip.Addr) uint8 {
	if a.Unmap().Is4() {
		return 4
	}
	return 6
}

// tcpAddr parses an address as the daemon gives it.
func tcpAddr(s string) net.Addr {
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		return &net.TCPAddr{}
	}
	return net.TCPAddrFromAddrPort(ap)
}

// option is a configured value as a connection holds it: 0 means def, and
// less than 0 none (0).
func option[T int | time.Duration](v, def T) T {
	switch {
	case v == 0:
		return def
	case v < 0:
		return 0
	}
	return v
}
