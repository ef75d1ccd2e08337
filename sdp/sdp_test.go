package sdp_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/nettest"
	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/daemon"
	"github.com/softrnic/softrnic/internal/leakcheck"
	"github.com/softrnic/softrnic/internal/streamcheck"
	"github.com/softrnic/softrnic/internal/testenv"
	"github.com/softrnic/softrnic/mpa"
	"github.com/softrnic/softrnic/sdp"
)

// startDaemon runs a softrnicd on loopback for the test and returns its
// socket.
func startDaemon(t testing.TB) string {
	sock, _ := startServer(t)
	return sock
}

// startServer is startDaemon with the daemon, for a test that closes it.
func startServer(t testing.TB) (string, *daemon.Server) {
	t.Helper()
	// First, so that it runs after every cleanup of the test: the
	// daemon's Close and the connections', listeners' Close before it.
	leakcheck.Check(t)
	sock := filepath.Join(t.TempDir(), "lo.sock")
	return sock, serveAt(t, sock)
}

// serveAt runs a softrnicd on loopback at socket sock, until the test ends
// or the caller closes it.
func serveAt(t testing.TB, sock string) *daemon.Server {
	t.Helper()
	d, err := daemon.New(daemon.Options{Iface: "lo", Socket: sock, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatalf("daemon: %v", err)
	}
	go d.Serve()
	t.Cleanup(func() { d.Close() })
	return d
}

// pair returns a dialed and an accepted connection of ln.
func pair(t testing.TB, d *sdp.Dialer, ln net.Listener) (net.Conn, net.Conn, error) {
	if d.HelloTimeout == 0 {
		// Setup is a few control calls and round trips, but a busy
		// two-core machine under the race detector can take seconds.
		dd := *d
		dd.HelloTimeout = 20 * time.Second
		d = &dd
	}
	type res struct {
		c   net.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		c, err := ln.Accept()
		ch <- res{c, err}
	}()
	c1, err := d.DialContext(context.Background(), "tcp", ln.Addr().String())
	if err != nil {
		return nil, nil, err
	}
	r := <-ch
	if r.err != nil {
		c1.Close()
		return nil, nil, r.err
	}
	return c1, r.c, nil
}

func listen(t testing.TB, sock string) net.Listener {
	t.Helper()
	lc := sdp.ListenConfig{Socket: sock}
	ln, err := lc.Listen(context.Background(), "tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// Both ends of every pair are SDP connections, and they behave as a
// net.Conn must (x/net's conformance test).
func TestConn(t *testing.T) {
	sock := startDaemon(t)
	ln := listen(t, sock)
	d := &sdp.Dialer{Socket: sock, NoFallback: true}
	nettest.TestConn(t, func() (c1, c2 net.Conn, stop func(), err error) {
		c1, c2, err = pair(t, d, ln)
		if err != nil {
			return nil, nil, nil, err
		}
		if _, ok := c1.(*sdp.Conn); !ok {
			t.Fatalf("dialed a %T, want *sdp.Conn", c1)
		}
		if _, ok := c2.(*sdp.Conn); !ok {
			t.Fatalf("accepted a %T, want *sdp.Conn", c2)
		}
		return c1, c2, func() { c1.Close(); c2.Close() }, nil
	})
}

// Random write and read sizes both ways at once; what arrives is what
// was sent (SHA-256), and the credits never went below zero.
func TestStreamBothWays(t *testing.T) {
	sock := startDaemon(t)
	ln := listen(t, sock)
	c1, c2, err := pair(t, &sdp.Dialer{Socket: sock, NoFallback: true}, ln)
	if err != nil {
		t.Fatal(err)
	}
	defer c1.Close()
	defer c2.Close()
	const total = 64 << 20
	errs := make(chan error, 2)
	go func() { errs <- streamcheck.Verified(c1, c2, total, 1) }()
	go func() { errs <- streamcheck.Verified(c2, c1, total, 2) }()
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []net.Conn{c1, c2} {
		st := c.(*sdp.Conn).Stats()
		if st.MinCredits < 0 {
			t.Errorf("credits went to %d", st.MinCredits)
		}
		if st.ZcopySent == 0 || st.ZcopyReceived == 0 {
			t.Errorf("no octet went by Read Zcopy: %+v", st)
		}
		t.Logf("%+v", st)
	}
}

// A plain TCP client of an sdp listener, and an sdp dialer of a plain TCP
// server, get TCP connections that work.
func TestFallback(t *testing.T) {
	sock := startDaemon(t)
	ln := listen(t, sock)
	go streamcheck.EchoServer(ln, func(c net.Conn) {
		if _, ok := c.(*net.TCPConn); !ok {
			t.Errorf("accepted a %T from a TCP client", c)
		}
	})
	c, err := net.DialTimeout("tcp", ln.Addr().String(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	echo(t, c)

	tl, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer tl.Close()
	go streamcheck.EchoServer(tl, nil)
	d := &sdp.Dialer{Socket: sock, HelloTimeout: time.Second}
	start := time.Now()
	c, err = d.DialContext(context.Background(), "tcp", tl.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := c.(*net.TCPConn); !ok {
		t.Fatalf("dialed a %T to a TCP server", c)
	}
	t.Logf("fallback to a TCP server took %v", time.Since(start))
	echo(t, c)
}

func echo(t *testing.T, c net.Conn) {
	t.Helper()
	if err := streamcheck.Echo(c); err != nil {
		t.Fatal(err)
	}
}

// Closing either end in the middle of a Read Zcopy transfer ends the other
// end's calls with an error or EOF, never a hang, and nothing read is
// other than what was written.
func TestCloseDuringZcopy(t *testing.T) {
	sock := startDaemon(t)
	ln := listen(t, sock)
	data := make([]byte, 1<<20)
	for i := range data {
		data[i] = byte(i * 13)
	}
	for _, closer := range []string{"reader", "writer"} {
		t.Run(closer, func(t *testing.T) {
			w, r, err := pair(t, &sdp.Dialer{Socket: sock, NoFallback: true}, ln)
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			defer r.Close()
			werr := make(chan error, 1)
			go func() {
				for range 64 {
					if _, err := w.Write(data); err != nil {
						werr <- err
						return
					}
				}
				werr <- nil
			}()
			buf := make([]byte, 100<<10)
			n := 0
			for n < 5<<20 {
				k, err := r.Read(buf)
				if err != nil {
					t.Fatal(err)
				}
				for i := range k {
					if buf[i] != byte((n+i)%len(data)*13) {
						t.Fatalf("octet %d differs", n+i)
					}
				}
				n += k
			}
			if closer == "reader" {
				r.Close()
				select {
				case err := <-werr:
					if err == nil {
						t.Fatal("every Write succeeded after the reader closed")
					}
				case <-time.After(15 * time.Second):
					t.Fatal("the writer hangs after the reader closed")
				}
				return
			}
			w.Close()
			select {
			case err := <-werr:
				if err == nil {
					t.Fatal("every Write succeeded though the writer closed")
				}
			case <-time.After(15 * time.Second):
				t.Fatal("a Write hangs after Close")
			}
			r.SetReadDeadline(time.Now().Add(15 * time.Second))
			for {
				k, err := r.Read(buf)
				for i := range k {
					if buf[i] != byte((n+i)%len(data)*13) {
						t.Fatalf("octet %d differs", n+i)
					}
				}
				n += k
				if err != nil {
					if errors.Is(err, os.ErrDeadlineExceeded) {
						t.Fatalf("the reader hangs after the writer closed (%d octets read)", n)
					}
					break
				}
			}
		})
	}
}

// SOFTRNIC_SDP=off, and a policy that denies the address, make Dial and
// the listener plain TCP though both ends could do SDP.
func TestOffloadTurnedOff(t *testing.T) {
	sock := startDaemon(t)
	ln := listen(t, sock)
	go streamcheck.EchoServer(ln, nil)
	check := func(name string, d *sdp.Dialer) {
		c, err := d.DialContext(context.Background(), "tcp", ln.Addr().String())
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if _, ok := c.(*net.TCPConn); !ok {
			t.Fatalf("%s: dialed a %T, want TCP", name, c)
		}
		echo(t, c)
	}
	t.Setenv(sdp.EnvOffload, "off")
	check("SOFTRNIC_SDP=off", &sdp.Dialer{Socket: sock})
	t.Setenv(sdp.EnvOffload, "")
	check("a policy denying the address", &sdp.Dialer{Socket: sock,
		Policy: &sdp.Policy{Deny: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}})
	if _, err := (&sdp.Dialer{Socket: sock, NoFallback: true, Policy: &sdp.Policy{Ports: []uint16{1}}}).DialContext(
		context.Background(), "tcp", ln.Addr().String()); !errors.Is(err, sdp.ErrNoOffload) {
		t.Fatalf("NoFallback with the port not offloaded: %v, want ErrNoOffload", err)
	}
}

// A listener whose policy offloads only its own port takes an SDP client
// as SDP: the policy's ports are the listener's, not the client's
// ephemeral one.
func TestListenerPolicyByItsPort(t *testing.T) {
	sock := startDaemon(t)
	tl, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	port := uint16(tl.Addr().(*net.TCPAddr).Port)
	ln := sdp.NewListener(tl, sdp.ListenConfig{Socket: sock, Policy: &sdp.Policy{Ports: []uint16{port}}})
	defer ln.Close()
	c1, c2, err := pair(t, &sdp.Dialer{Socket: sock, NoFallback: true}, ln)
	if err != nil {
		t.Fatalf("an SDP client of a listener offloading its port: %v", err)
	}
	defer c1.Close()
	defer c2.Close()
	if _, ok := c2.(*sdp.Conn); !ok {
		t.Fatalf("accepted a %T, want *sdp.Conn", c2)
	}
}

// A listener that will not offload a client (its policy, or
// SOFTRNIC_SDP=off in its process) refuses the client's MPA Request with
// a Reply whose Reject bit is set, so that an SDP dialer falls back to TCP
// at once; the application accepts only the fallback connection, never
// one that starts with MPA octets. A plain TCP client's octets reach the
// application untouched.
func TestListenerRefusesWhatItWillNotOffload(t *testing.T) {
	sock := startDaemon(t)
	tl, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	deny := &sdp.Policy{Deny: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}
	ln := sdp.NewListener(tl, sdp.ListenConfig{Socket: sock, Policy: deny, DetectTimeout: 100 * time.Millisecond})
	defer ln.Close()
	accepted := acceptAll(ln)
	firstOctets := func(what string, want string) {
		t.Helper()
		select {
		case c := <-accepted:
			defer c.Close()
			if _, ok := c.(*net.TCPConn); !ok {
				t.Fatalf("%s: accepted a %T", what, c)
			}
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			got := make([]byte, len(want))
			if _, err := io.ReadFull(c, got); err != nil || string(got) != want {
				t.Fatalf("%s: the accepted connection starts %q (%v), want %q", what, got, err, want)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: nothing accepted", what)
		}
	}

	// An SDP dialer: refused, it falls back to TCP.
	d := &sdp.Dialer{Socket: sock, HelloTimeout: 20 * time.Second}
	start := time.Now()
	c, err := d.DialContext(context.Background(), "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, ok := c.(*net.TCPConn); !ok {
		t.Fatalf("dialed a %T, want the TCP fallback", c)
	}
	t.Logf("refused and fallen back in %v", time.Since(start))
	if _, err := c.Write([]byte("fallback")); err != nil {
		t.Fatal(err)
	}
	firstOctets("the SDP dialer", "fallback")

	// A plain TCP client.
	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	if _, err := raw.Write([]byte("GET / HTTP/1.0\r\n")); err != nil {
		t.Fatal(err)
	}
	firstOctets("a TCP client", "GET / HTTP/1.0\r\n")

	// SOFTRNIC_SDP=off in the listener's process: an MPA Request gets
	// a rejecting Reply.
	t.Setenv(sdp.EnvOffload, "off")
	expectReject(t, ln.Addr().String())
	select {
	case c := <-accepted:
		t.Fatalf("a refused MPA client was accepted as a %T", c)
	default:
	}
}

// stuckDaemon listens where a daemon would and takes sessions without
// ever answering them, until release; count is the sessions taken.
func stuckDaemon(t *testing.T) (path string, count func() int, release func()) {
	t.Helper()
	path = filepath.Join(t.TempDir(), "stuck.sock")
	ul, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	n := 0
	go func() {
		for {
			c, err := ul.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			n++
			mu.Unlock()
		}
	}()
	var once sync.Once
	release = func() {
		once.Do(func() {
			ul.Close()
			mu.Lock()
			defer mu.Unlock()
			for _, c := range conns {
				c.Close()
			}
		})
	}
	t.Cleanup(release)
	return path, func() int { mu.Lock(); defer mu.Unlock(); return n }, release
}

// A daemon that goes away and comes back at the same socket serves the
// next Dial, even one made before the session with the daemon gone has
// seen the hang-up; and the session with the one gone is closed, not kept: a
// program that outlives many restarts of its daemon holds no descriptor
// for each of them.
func TestDaemonRestartsLeaveNoSession(t *testing.T) {
	leakcheck.Check(t)
	sock := filepath.Join(t.TempDir(), "lo.sock")
	cycle := func() {
		t.Helper()
		d := serveAt(t, sock)
		ln := listen(t, sock)
		accepted := make(chan net.Conn, 1)
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					close(accepted)
					return
				}
				accepted <- c
			}
		}()
		// The session with the daemon before learns that it is gone
		// from the Dial's first request, which then opens a new one.
		c, err := (&sdp.Dialer{Socket: sock, NoFallback: true, HelloTimeout: 20 * time.Second}).DialContext(context.Background(), "tcp", ln.Addr().String())
		if err != nil {
			t.Fatalf("no SDP connection through the restarted daemon: %v", err)
		}
		c.Close()
		(<-accepted).Close()
		ln.Close()
		for range accepted {
		}
		d.Close()
	}
	cycle()
	cycle()
	before := openFDs(t)
	const restarts = 6
	for range restarts {
		cycle()
	}
	if grown := openFDs(t) - before; grown >= restarts {
		t.Fatalf("%d descriptors more after %d restarts of the daemon: the sessions with the daemons gone are kept", grown, restarts)
	}
}

// A daemon that never answers holds up the Dials through it only: one
// through another daemon goes meanwhile. The Dials that wait for it share
// one session's open, and its failure.
func TestStuckDaemonHoldsUpOnlyItsDials(t *testing.T) {
	sock := startDaemon(t)
	ln := listen(t, sock)
	stuck, count, release := stuckDaemon(t)
	const n = 4
	errs := make(chan error, n)
	for range n {
		go func() {
			d := &sdp.Dialer{Socket: stuck, NoFallback: true, HelloTimeout: time.Minute}
			c, err := d.DialContext(context.Background(), "tcp", ln.Addr().String())
			if err == nil {
				c.Close()
			}
			errs <- err
		}()
	}
	for deadline := time.Now().Add(20 * time.Second); count() == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no session with the stuck daemon")
		}
	}
	done := make(chan error, 1)
	go func() {
		c1, c2, err := pair(t, &sdp.Dialer{Socket: sock, NoFallback: true}, ln)
		if err == nil {
			c1.Close()
			c2.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("a Dial through the other daemon: %v", err)
		}
	case <-time.After(30 * time.Second):
		release()
		t.Fatal("a Dial through the other daemon is held up by the stuck one")
	}
	select {
	case err := <-errs:
		t.Fatalf("a Dial through the stuck daemon ended before it hung up: %v", err)
	default:
	}
	release()
	for range n {
		select {
		case err := <-errs:
			if err == nil {
				t.Fatal("a Dial through the stuck daemon succeeded")
			}
		case <-time.After(30 * time.Second):
			t.Fatal("a Dial through the stuck daemon still waits after it hung up")
		}
	}
	if c := count(); c != 1 {
		t.Fatalf("%d sessions opened with the stuck daemon, want 1", c)
	}
}

// sockopt reads an int socket option of a TCP connection.
func sockopt(t *testing.T, c net.Conn, level, opt int) int {
	t.Helper()
	rc, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var v int
	var gerr error
	if err := rc.Control(func(fd uintptr) { v, gerr = unix.GetsockoptInt(int(fd), level, opt) }); err != nil {
		t.Fatal(err)
	}
	if gerr != nil {
		t.Fatal(gerr)
	}
	return v
}

// Options set before the connection exists (Dialer.Setup,
// ListenConfig.Setup) apply to whichever path wins: a fallback's TCP
// socket has them, and an SDP connection's linger of 0 makes its Close a
// reset. A Setup that fails fails the Dial; the setters of a closed SDP
// connection fail as TCP's do.
func TestSetupAppliesToWhicheverPathWins(t *testing.T) {
	sock := startDaemon(t)
	var setups atomic.Int32
	setup := func(o sdp.TCPOptions) error {
		setups.Add(1)
		return errors.Join(o.SetNoDelay(false), o.SetKeepAlive(true), o.SetKeepAlivePeriod(7*time.Second),
			o.SetLinger(0), o.SetReadBuffer(8192), o.SetWriteBuffer(8192))
	}
	lc := sdp.ListenConfig{Socket: sock, Setup: setup}
	ln, err := lc.Listen(context.Background(), "tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	checkTCP := func(what string, c net.Conn) {
		t.Helper()
		if v := sockopt(t, c, unix.IPPROTO_TCP, unix.TCP_NODELAY); v != 0 {
			t.Errorf("%s: TCP_NODELAY %d", what, v)
		}
		if v := sockopt(t, c, unix.SOL_SOCKET, unix.SO_KEEPALIVE); v != 1 {
			t.Errorf("%s: SO_KEEPALIVE %d", what, v)
		}
		if v := sockopt(t, c, unix.IPPROTO_TCP, unix.TCP_KEEPIDLE); v != 7 {
			t.Errorf("%s: TCP_KEEPIDLE %d", what, v)
		}
		if v := sockopt(t, c, unix.SOL_SOCKET, unix.SO_RCVBUF); v >= 64<<10 {
			t.Errorf("%s: SO_RCVBUF %d, want the 8 KiB set (doubled)", what, v)
		}
		rc, _ := c.(*net.TCPConn).SyscallConn()
		var l *unix.Linger
		rc.Control(func(fd uintptr) { l, _ = unix.GetsockoptLinger(int(fd), unix.SOL_SOCKET, unix.SO_LINGER) })
		if l == nil || l.Onoff != 1 || l.Linger != 0 {
			t.Errorf("%s: SO_LINGER %+v", what, l)
		}
	}

	// The fallback to a TCP server.
	tl, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer tl.Close()
	go streamcheck.EchoServer(tl, nil)
	c, err := (&sdp.Dialer{Socket: sock, Setup: setup, HelloTimeout: 20 * time.Second}).DialContext(context.Background(), "tcp", tl.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	checkTCP("the fallback", c)
	echo(t, c)

	// A TCP client of the listener.
	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	raw.Write([]byte("hi"))
	a, err := acceptOne(ln, 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	checkTCP("a TCP client accepted", a)
	a.Close()

	// SDP: both ends set up; the dialer's Close with linger 0 resets.
	before := setups.Load()
	c1, c2, err := pair(t, &sdp.Dialer{Socket: sock, NoFallback: true, Setup: setup}, ln)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if n := setups.Load() - before; n != 2 {
		t.Errorf("Setup ran %d times for an SDP pair, want 2", n)
	}
	c1.Close()
	c2.SetReadDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.ReadAll(c2); !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("after a Close with linger 0 the peer read %v, want a reset", err)
	}
	for name, set := range map[string]func() error{
		"SetNoDelay":         func() error { return c1.(*sdp.Conn).SetNoDelay(true) },
		"SetKeepAlive":       func() error { return c1.(*sdp.Conn).SetKeepAlive(true) },
		"SetKeepAlivePeriod": func() error { return c1.(*sdp.Conn).SetKeepAlivePeriod(time.Second) },
		"SetLinger":          func() error { return c1.(*sdp.Conn).SetLinger(1) },
		"SetReadBuffer":      func() error { return c1.(*sdp.Conn).SetReadBuffer(1) },
		"SetWriteBuffer":     func() error { return c1.(*sdp.Conn).SetWriteBuffer(1) },
	} {
		if err := set(); !errors.Is(err, net.ErrClosed) {
			t.Errorf("%s after Close: %v, want net.ErrClosed", name, err)
		}
	}

	// A Setup that fails.
	no := errors.New("no")
	if _, err := (&sdp.Dialer{Socket: sock, NoFallback: true, Setup: func(sdp.TCPOptions) error { return no }}).DialContext(
		context.Background(), "tcp", ln.Addr().String()); !errors.Is(err, no) {
		t.Errorf("a Dial whose Setup failed: %v", err)
	}
}

// A server that takes the MPA Request and never answers it: Dial falls
// back to TCP once HelloTimeout has passed, on a connection of its own
// (the server's second), or fails with ErrNoOffload under NoFallback.
func TestHelloTimeout(t *testing.T) {
	sock := startDaemon(t)
	tl, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer tl.Close()
	firsts := make(chan string, 8)
	go func() {
		for {
			c, err := tl.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				b := make([]byte, 16)
				n, _ := io.ReadFull(c, b)
				firsts <- string(b[:n])
				if string(b[:n]) == "MPA ID Req Frame" {
					io.Copy(io.Discard, c) // and never answer
					return
				}
				c.Write(b[:n]) // a TCP echo of the first 16
			}()
		}
	}()
	d := &sdp.Dialer{Socket: sock, HelloTimeout: 500 * time.Millisecond}
	start := time.Now()
	c, err := d.DialContext(context.Background(), "tcp", tl.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	took := time.Since(start)
	if _, ok := c.(*net.TCPConn); !ok {
		t.Fatalf("dialed a %T, want the TCP fallback", c)
	}
	if took < d.HelloTimeout {
		t.Errorf("fell back after %v, before the HelloTimeout of %v", took, d.HelloTimeout)
	}
	t.Logf("fell back after %v", took)
	if f := <-firsts; f != "MPA ID Req Frame" {
		t.Fatalf("the server's first connection started %q, want an MPA Request", f)
	}
	c.Write([]byte("0123456789abcdef"))
	if f := <-firsts; f != "0123456789abcdef" {
		t.Fatalf("the fallback connection started %q", f)
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	got := make([]byte, 16)
	if _, err := io.ReadFull(c, got); err != nil || string(got) != "0123456789abcdef" {
		t.Fatalf("the fallback's echo: %q %v", got, err)
	}

	d.NoFallback = true
	if _, err := d.DialContext(context.Background(), "tcp", tl.Addr().String()); !errors.Is(err, sdp.ErrNoOffload) {
		t.Fatalf("NoFallback past the HelloTimeout: %v, want ErrNoOffload", err)
	}
}

// expectReject sends MPA Requests of both revisions to addr, and fails
// unless each is answered with a rejecting Reply, then the close.
func expectReject(t *testing.T, addr string) {
	t.Helper()
	for _, rev := range []uint8{1, 2} {
		raw, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer raw.Close()
		cfg := mpa.Config{Revision: rev, IRD: 2, ORD: 2, PrivateData: make([]byte, sdp.HelloLen)}
		req, err := cfg.Request()
		if err != nil {
			t.Fatal(err)
		}
		b, _ := req.Append(nil)
		if _, err := raw.Write(b); err != nil {
			t.Fatal(err)
		}
		raw.SetReadDeadline(time.Now().Add(20 * time.Second))
		got, err := io.ReadAll(raw)
		if err != nil {
			t.Fatalf("revision %d: reading the Reply: %v", rev, err)
		}
		reply, n, err := mpa.ParseFrame(got, true)
		if err != nil || n != len(got) || !reply.Reject || reply.Revision != rev {
			t.Fatalf("revision %d: got %q: %+v, %v; want a rejecting Reply, then the close", rev, got, reply, err)
		}
	}
}

// A listener whose daemon cannot be had refuses SDP clients as one that
// will not offload them: the Request is rejected and Dial falls back.
func TestListenerWithoutDaemonRefuses(t *testing.T) {
	sock := startDaemon(t)
	lc := sdp.ListenConfig{Socket: filepath.Join(t.TempDir(), "none.sock")}
	ln, err := lc.Listen(context.Background(), "tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	expectReject(t, ln.Addr().String())
	go streamcheck.EchoServer(ln, nil)
	c, err := (&sdp.Dialer{Socket: sock, HelloTimeout: 20 * time.Second}).DialContext(context.Background(), "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := c.(*net.TCPConn); !ok {
		t.Fatalf("dialed a %T, want the TCP fallback", c)
	}
	echo(t, c)
}

// An orderly close is orderly on the wire too: each end's Close sends its
// DisConn, then the connection closes with a FIN each way, and neither
// daemon sees a reset or a broken connection. (Close freed the EP at once
// after asking for the graceful disconnect, which the daemon, as DAT's
// ep_free, turned into an abort: the peer's connection ended Broken, with
// a warning in its daemon's log.)
func TestOrderlyCloseIsNotAReset(t *testing.T) {
	leakcheck.Check(t)
	sock := filepath.Join(t.TempDir(), "lo.sock")
	var log testenv.Buffer
	d, err := daemon.New(daemon.Options{Iface: "lo", Socket: sock, Logger: slog.New(slog.NewTextHandler(&log, nil))})
	if err != nil {
		t.Fatalf("daemon: %v", err)
	}
	go d.Serve()
	t.Cleanup(func() { d.Close() })
	ln := listen(t, sock)
	for round := range 3 {
		c1, c2, err := pair(t, &sdp.Dialer{Socket: sock, NoFallback: true}, ln)
		if err != nil {
			t.Fatal(err)
		}
		msg := bytes.Repeat([]byte{byte(round)}, 256<<10)
		go func() {
			// the server echoes, then closes at the client's EOF
			io.Copy(c2, c2)
			c2.Close()
		}()
		if _, err := c1.Write(msg); err != nil {
			t.Fatal(err)
		}
		back := make([]byte, len(msg))
		if _, err := io.ReadFull(c1, back); err != nil || !bytes.Equal(back, msg) {
			t.Fatalf("echo: %v", err)
		}
		c1.Close()
		for i := 0; d.Counts()["ep"] != 0; i++ {
			if i == 2000 {
				t.Fatalf("round %d: %d EPs left 20 s after both closed", round, d.Counts()["ep"])
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	for _, line := range strings.Split(log.String(), "\n") {
		if strings.Contains(line, "level=WARN") && strings.Contains(line, `msg="connection ended"`) {
			t.Errorf("an orderly close logged as a broken connection: %s", line)
		}
	}
}
