package xdpnet_test

// The tests run a Poller on B's end of a topology veth pair (offloads off,
// MTU 1500), with the steering program in generic and in native mode, and
// the kernel's TCP in A as the peer:
//
//   - coexist: while the engine listens, ping A→B and a kernel TCP
//     connection A→B on another port keep working, and the engine's port
//     is reserved in B's kernel;
//   - engine-server: a kernel client in A dials the engine's listener;
//   - engine-client: the engine connects to a kernel listener in A;
//   - both move 32 MiB each way at once, checked octet by octet on both
//     sides, and close cleanly; then the steering counters are checked and
//     the flows must leave the map once the connections are gone.
//
// Goroutines: the Poller's loop (Run), the test goroutine driving the
// kernel side, and one writer goroutine of the kernel side for full duplex.

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/bpf"
	"github.com/softrnic/softrnic/internal/topology"
	"github.com/softrnic/softrnic/tcp"
	"github.com/softrnic/softrnic/tcp/sim"
	"github.com/softrnic/softrnic/xdpnet"
)

const (
	enginePort   = 7001
	kernelPort   = 5001
	kernelBPort  = 6001 // B's kernel listens here while the engine runs
	seedKernel   = 0xa
	seedEngine   = 0xb
	testTimeWait = 2 * time.Second
	transferSize = 32 << 20
)

type env struct {
	tp     *topology.Pair
	p      *xdpnet.Poller
	runErr chan error
}

// start makes the topology and runs a Poller on B's veth end in mode.
func start(tb testing.TB, mode bpf.Mode, opts tcp.Options) *env {
	return startWith(tb, xdpnet.Config{Mode: mode, TCP: opts})
}

// startWith is start with more of the Poller's configuration (its
// interface and address are B's).
func startWith(tb testing.TB, cfg xdpnet.Config) *env {
	tb.Helper()
	tp := topology.NewTest(tb, topology.Options{MTU: 1500})
	if cfg.TCP.TimeWait == 0 {
		cfg.TCP.TimeWait = testTimeWait
	}
	cfg.Interface, cfg.Queue, cfg.Addr = tp.B.Link, 0, tp.B.Addr.Addr()
	e := &env{tp: tp, runErr: make(chan error, 1)}
	err := tp.B.Do(func() error {
		var err error
		e.p, err = xdpnet.NewPoller(cfg)
		return err
	})
	if err != nil {
		tb.Fatalf("new poller (%v XDP): %v", cfg.Mode, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() { e.runErr <- e.p.Run(ctx) }()
	tb.Cleanup(func() {
		cancel()
		select {
		case err := <-e.runErr:
			if err != nil {
				tb.Errorf("poller run: %v", err)
			}
		case <-time.After(10 * time.Second):
			tb.Errorf("poller did not stop")
		}
		if err := e.p.Close(); err != nil {
			tb.Errorf("poller close: %v", err)
		}
	})
	return e
}

// endpoint is a sim.Endpoint that closes done when its connection ends.
type endpoint struct {
	sim.Endpoint
	done       chan struct{}
	stats      tcp.ConnStats
	stateAtFIN tcp.State
}

func newEndpoint(total uint64) *endpoint {
	return &endpoint{
		Endpoint: sim.Endpoint{Seed: seedEngine, PeerSeed: seedKernel, Total: total, CloseWhenDone: true},
		done:     make(chan struct{}),
	}
}

func (k *endpoint) Event(c *tcp.Conn, ev tcp.Event) {
	k.Endpoint.Event(c, ev)
	switch ev {
	case tcp.EventPeerClosed:
		k.stateAtFIN = c.State()
	case tcp.EventClosed:
		k.stats = c.Stats
		close(k.done)
	}
}

func TestPoller(t *testing.T) {
	for _, mode := range []bpf.Mode{bpf.ModeGeneric, bpf.ModeNative} {
		t.Run(mode.String(), func(t *testing.T) {
			e := start(t, mode, tcp.Options{})
			if got := e.p.Steering().Mode(); got != mode {
				t.Fatalf("steering attached in %v mode, want %v", got, mode)
			}
			t.Run("coexist", func(t *testing.T) { testCoexist(t, e) })
			t.Run("engine-server", func(t *testing.T) { testTransfer(t, e, true) })
			t.Run("engine-client", func(t *testing.T) { testTransfer(t, e, false) })
			t.Run("steering", func(t *testing.T) { testSteering(t, e) })
		})
	}
}

// testCoexist: with the engine listening, B's kernel keeps ICMP and its own
// TCP, and cannot bind the engine's port.
func testCoexist(t *testing.T, e *env) {
	tp := e.tp
	if _, err := e.p.Listen(enginePort+1, newEndpoint(0)); err != nil {
		t.Fatalf("engine listen: %v", err)
	}
	defer func() {
		if err := e.p.CloseListener(enginePort + 1); err != nil {
			t.Errorf("close listener: %v", err)
		}
	}()
	out, err := tp.A.Command("ping", "-c", "3", "-i", "0.2", "-W", "2", tp.B.Addr.Addr().String()).CombinedOutput()
	if err != nil {
		t.Errorf("ping A→B while steering: %v\n%s", err, out)
	}
	// The engine's port is reserved in B's kernel.
	if l, err := tp.B.ListenTCP(netip.AddrPortFrom(tp.B.Addr.Addr(), enginePort+1)); err == nil {
		l.Close()
		t.Error("B's kernel could bind the engine's listening port")
	} else if !errors.Is(err, unix.EADDRINUSE) {
		t.Errorf("bind engine's port: %v, want EADDRINUSE", err)
	}
	// B's kernel TCP on another port.
	ln, err := tp.B.ListenTCP(netip.AddrPortFrom(tp.B.Addr.Addr(), kernelBPort))
	if err != nil {
		t.Fatalf("B kernel listen: %v", err)
	}
	defer ln.Close()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		ln.SetDeadline(time.Now().Add(10 * time.Second))
		c, err := ln.Accept()
		if err != nil {
			t.Errorf("B kernel accept: %v", err)
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		_, _ = io.Copy(c, c) // echo until EOF
	}()
	conn, err := tp.A.DialTCP(netip.AddrPortFrom(tp.B.Addr.Addr(), kernelBPort), 5*time.Second)
	if err != nil {
		t.Fatalf("A kernel dial B's kernel: %v", err)
	}
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	msg := bytes.Repeat([]byte("kernel stays kernel "), 1000)
	go func() {
		_, _ = conn.Write(msg)
		conn.CloseWrite()
	}()
	got, err := io.ReadAll(conn)
	conn.Close()
	if err != nil || !bytes.Equal(got, msg) {
		t.Errorf("kernel echo A→B: %d of %d octets back, err %v", len(got), len(msg), err)
	}
	wg.Wait()
}

// testTransfer: one connection between the engine and A's kernel, 32 MiB
// each way at once, clean close.
func testTransfer(t *testing.T, e *env, engineServer bool) {
	tp := e.tp
	ep := newEndpoint(transferSize)
	startAt := time.Now()
	deadline := startAt.Add(2 * time.Minute)
	var conn *net.TCPConn
	if engineServer {
		if _, err := e.p.Listen(enginePort, ep); err != nil {
			t.Fatalf("engine listen: %v", err)
		}
		defer func() {
			if err := e.p.CloseListener(enginePort); err != nil {
				t.Errorf("close listener: %v", err)
			}
		}()
		var err error
		conn, err = tp.A.DialTCP(netip.AddrPortFrom(tp.B.Addr.Addr(), enginePort), 10*time.Second)
		if err != nil {
			t.Fatalf("kernel dial: %v (poller %+v)", err, e.p.Stats())
		}
	} else {
		ln, err := tp.A.ListenTCP(netip.AddrPortFrom(tp.A.Addr.Addr(), kernelPort))
		if err != nil {
			t.Fatalf("kernel listen: %v", err)
		}
		defer ln.Close()
		if _, err := e.p.Connect(netip.AddrPortFrom(tp.A.Addr.Addr(), kernelPort), ep, 5*time.Second); err != nil {
			t.Fatalf("engine connect: %v", err)
		}
		_ = ln.SetDeadline(time.Now().Add(10 * time.Second))
		conn, err = ln.AcceptTCP()
		if err != nil {
			t.Fatalf("kernel accept: %v (poller %+v)", err, e.p.Stats())
		}
	}
	kr := sim.RunSocket(conn, seedKernel, seedEngine, transferSize, deadline)
	dataTime := time.Since(startAt)
	select {
	case <-ep.done:
	case <-time.After(time.Until(deadline) + 2*testTimeWait):
		t.Fatalf("engine connection not closed; kernel %+v; poller %+v", kr, e.p.Stats())
	}
	closeTime := time.Since(startAt)
	// ep.done was closed on the loop after its last use of ep.
	if kr.Corrupt != nil {
		t.Errorf("kernel received corrupt data: %v", kr.Corrupt)
	}
	if kr.WriteErr != nil || kr.Sent != transferSize {
		t.Errorf("kernel wrote %d of %d octets: %v", kr.Sent, transferSize, kr.WriteErr)
	}
	if kr.ReadErr != nil || kr.Recvd != transferSize {
		t.Errorf("kernel read %d of %d octets, then %v (want EOF)", kr.Recvd, transferSize, kr.ReadErr)
	}
	if ep.Corrupt != nil {
		t.Errorf("engine received corrupt data: %v", ep.Corrupt)
	}
	if ep.Sent != transferSize || ep.Recvd != transferSize {
		t.Errorf("engine sent %d and received %d octets, want %d", ep.Sent, ep.Recvd, transferSize)
	}
	if ep.Err != nil || !ep.PeerClosed {
		t.Errorf("engine connection closed with %v (peer FIN seen %v)", ep.Err, ep.PeerClosed)
	}
	st := e.p.Stats()
	t.Logf("%d MiB each way in %v (%.1f MB/s both ways together), closed after %v (peer FIN in %v)",
		transferSize>>20, dataTime.Round(time.Millisecond), float64(2*transferSize)/dataTime.Seconds()/1e6,
		closeTime.Round(time.Millisecond), ep.stateAtFIN)
	t.Logf("engine conn: %+v", ep.stats)
	t.Logf("poller: %+v", st)
}

// testSteering: the steering program's counters after the transfers, and
// the flows gone from the map once their connections left the Stack.
func testSteering(t *testing.T, e *env) {
	st, err := e.p.Steering().Stats()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("steering: %+v", st)
	if st.SteeredListen == 0 || st.SteeredFlow == 0 {
		t.Errorf("nothing steered: %+v", st)
	}
	if st.RedirectFailed != 0 {
		t.Errorf("%d redirects failed", st.RedirectFailed)
	}
	if st.PassedNotTCP == 0 || st.PassedNoMatch == 0 {
		t.Errorf("ICMP or the kernel's own TCP did not pass: %+v", st)
	}
	deadline := time.Now().Add(3*testTimeWait + time.Second)
	var ps xdpnet.Stats
	for time.Now().Before(deadline) {
		if ps = e.p.Stats(); ps.Flows == 0 && ps.Listens == 0 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if ps.Flows != 0 || ps.Listens != 0 {
		t.Errorf("%d flows and %d listen ports still registered: %+v", ps.Flows, ps.Listens, ps)
	}
	if ps.BadTCPChecksum != 0 || ps.BadIPChecksum != 0 || ps.FlowErrors != 0 {
		t.Errorf("poller errors: %+v", ps)
	}
	if ps.Socket.RXDropped != 0 || ps.Socket.RXInvalidDescs != 0 || ps.Socket.TXInvalidDescs != 0 {
		t.Logf("socket counters: %+v", ps.Socket)
	}
}

// TestPollerConfigErrors: NewPoller says what is wrong with the interface.
func TestPollerConfigErrors(t *testing.T) {
	tp := topology.NewTest(t, topology.Options{MTU: 1500})
	cases := []struct {
		name string
		cfg  xdpnet.Config
	}{
		{"no-interface", xdpnet.Config{Interface: "nonesuch0", Addr: tp.B.Addr.Addr()}},
		{"foreign-address", xdpnet.Config{Interface: tp.B.Link, Addr: tp.A.Addr.Addr()}},
		{"ipv6", xdpnet.Config{Interface: tp.B.Link, Addr: netip.MustParseAddr("2001:db8::1")}},
	}
	for _, c := range cases {
		err := tp.B.Do(func() error {
			p, err := xdpnet.NewPoller(c.cfg)
			if err == nil {
				p.Close()
			}
			return err
		})
		if !errors.Is(err, xdpnet.ErrInterface) {
			t.Errorf("%s: NewPoller: %v, want ErrInterface", c.name, err)
		} else {
			t.Logf("%s: %v", c.name, err)
		}
	}
	// GRO on: generic XDP is refused with the fix in words, native runs.
	if out, err := tp.B.Command("ethtool", "-K", tp.B.Link, "gro", "on").CombinedOutput(); err != nil {
		t.Fatalf("gro on: %v: %s", err, out)
	}
	for _, mode := range []bpf.Mode{bpf.ModeGeneric, bpf.ModeNative} {
		err := tp.B.Do(func() error {
			p, err := xdpnet.NewPoller(xdpnet.Config{Interface: tp.B.Link, Addr: tp.B.Addr.Addr(), Mode: mode})
			if err == nil {
				p.Close()
			}
			return err
		})
		switch {
		case mode == bpf.ModeGeneric && (!errors.Is(err, xdpnet.ErrInterface) || !strings.Contains(err.Error(), "gro off")):
			t.Errorf("generic XDP with GRO on: %v", err)
		case mode == bpf.ModeNative && err != nil:
			t.Errorf("native XDP with GRO on: %v", err)
		}
	}
	if out, err := tp.B.Command("ethtool", "-K", tp.B.Link, "gro", "off").CombinedOutput(); err != nil {
		t.Fatalf("gro off: %v: %s", err, out)
	}
	if out, err := tp.B.Command("ip", "link", "set", tp.B.Link, "down").CombinedOutput(); err != nil {
		t.Fatalf("link down: %v: %s", err, out)
	}
	err := tp.B.Do(func() error {
		_, err := xdpnet.NewPoller(xdpnet.Config{Interface: tp.B.Link, Addr: tp.B.Addr.Addr()})
		return err
	})
	if !errors.Is(err, xdpnet.ErrInterface) {
		t.Errorf("down: NewPoller: %v, want ErrInterface", err)
	}
}

// countHandler counts what it receives; done closes at want octets or
// when the connection closes.
type countHandler struct {
	recvd, want uint64
	done        chan struct{}
	once        sync.Once
}

func (h *countHandler) Receive(c *tcp.Conn, b []byte) int {
	h.recvd += uint64(len(b))
	if h.recvd >= h.want {
		h.once.Do(func() { close(h.done) })
	}
	return len(b)
}

func (h *countHandler) Event(c *tcp.Conn, ev tcp.Event) {
	if ev == tcp.EventClosed {
		h.once.Do(func() { close(h.done) })
	}
}

// BenchmarkEngineReceive: a kernel sender in A, the engine receiving over
// AF_XDP in B (1 MiB per op). Connection setup is not timed.
func BenchmarkEngineReceive(b *testing.B) {
	for _, mode := range []bpf.Mode{bpf.ModeGeneric, bpf.ModeNative} {
		b.Run(mode.String(), func(b *testing.B) {
			e := start(b, mode, tcp.Options{})
			total := uint64(b.N) << 20
			h := &countHandler{want: total, done: make(chan struct{})}
			if _, err := e.p.Listen(enginePort, h); err != nil {
				b.Fatal(err)
			}
			conn, err := e.tp.A.DialTCP(netip.AddrPortFrom(e.tp.B.Addr.Addr(), enginePort), 10*time.Second)
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Close()
			deadline := time.Now().Add(time.Minute + time.Duration(b.N)*50*time.Millisecond)
			_ = conn.SetDeadline(deadline)
			buf := make([]byte, 256<<10)
			b.SetBytes(1 << 20)
			b.ResetTimer()
			for sent := uint64(0); sent < total; {
				n, err := conn.Write(buf[:min(uint64(len(buf)), total-sent)])
				sent += uint64(n)
				if err != nil {
					b.Fatalf("kernel wrote %d of %d: %v", sent, total, err)
				}
			}
			select {
			case <-h.done:
			case <-time.After(time.Until(deadline)):
				b.Fatal("engine did not receive everything in time")
			}
			b.StopTimer()
			var got uint64
			_ = e.p.Do(func(*tcp.Stack, tcp.Time) { got = h.recvd })
			if got < total {
				b.Fatalf("engine received %d of %d", got, total)
			}
		})
	}
}

// BenchmarkEngineSend: the engine sends to a kernel TCP receiver over
// AF_XDP (b.N MiB); the counterpart of BenchmarkEngineReceive.
func BenchmarkEngineSend(b *testing.B) {
	for _, mode := range []bpf.Mode{bpf.ModeGeneric, bpf.ModeNative} {
		b.Run(mode.String(), func(b *testing.B) {
			e := start(b, mode, tcp.Options{})
			ln, err := e.tp.A.ListenTCP(netip.AddrPortFrom(e.tp.A.Addr.Addr(), kernelPort))
			if err != nil {
				b.Fatal(err)
			}
			defer ln.Close()
			total := uint64(b.N) << 20
			ep := newEndpoint(total)
			ep.Endpoint.Seed = 0 // no pattern check at the kernel end
			b.SetBytes(1 << 20)
			b.ResetTimer()
			if _, err := e.p.Connect(netip.AddrPortFrom(e.tp.A.Addr.Addr(), kernelPort), ep, 5*time.Second); err != nil {
				b.Fatal(err)
			}
			conn, err := ln.AcceptTCP()
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Close()
			_ = conn.SetDeadline(time.Now().Add(time.Minute + time.Duration(b.N)*50*time.Millisecond))
			n, err := io.Copy(io.Discard, conn)
			if err != nil || uint64(n) != total {
				b.Fatalf("kernel received %d of %d: %v", n, total, err)
			}
			b.StopTimer()
			var st tcp.ConnStats
			select {
			case <-ep.done:
				st = ep.stats
			case <-time.After(10 * time.Second):
			}
			b.Logf("engine: %+v, poller %+v", st, e.p.Stats())
		})
	}
}

// A peer off the link: the engine reaches 10.99.0.1, an address of A's
// that B routes through A, and moves 4 MiB to the kernel there; an address
// B has no route for is refused with a clear error.
func TestPollerRoutedPeer(t *testing.T) {
	e := start(t, bpf.ModeGeneric, tcp.Options{})
	peer := netip.AddrPortFrom(xdpnet.OffLinkPeer(t, e.tp), kernelPort)
	ln, err := e.tp.A.ListenTCP(peer)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	const total = 4 << 20
	ep := newEndpoint(total)
	if _, err := e.p.Connect(peer, ep, 5*time.Second); err != nil {
		t.Fatalf("connect through the gateway: %v", err)
	}
	_ = ln.SetDeadline(time.Now().Add(10 * time.Second))
	conn, err := ln.AcceptTCP()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(time.Minute))
	n, err := io.Copy(io.Discard, conn)
	if err != nil || n != total {
		t.Fatalf("kernel received %d of %d: %v", n, total, err)
	}
	_, err = e.p.Connect(netip.MustParseAddrPort("198.51.100.1:9"), newEndpoint(0), time.Second)
	if err == nil || !strings.Contains(err.Error(), "no route through") {
		t.Fatalf("connect without a route: %v", err)
	}
}

// A veth peer with its offloads on sends partial checksums: the Stack
// drops those segments, and the poller says why, once, in words an
// operator can act on.
func TestPollerWarnsAboutPeerOffloads(t *testing.T) {
	tp := topology.NewTest(t, topology.Options{MTU: 1500, Offloads: true})
	warned := make(chan string, 4)
	var p *xdpnet.Poller
	if err := tp.B.Do(func() error {
		var err error
		p, err = xdpnet.NewPoller(xdpnet.Config{Interface: tp.B.Link, Addr: tp.B.Addr.Addr(), Mode: bpf.ModeNative,
			TCP: tcp.Options{TimeWait: testTimeWait}, Warn: func(m string) { warned <- m }})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	defer func() { cancel(); <-done; p.Close() }()
	if _, err := p.Listen(enginePort, newEndpoint(0)); err != nil {
		t.Fatal(err)
	}
	// The kernel's SYNs (and their retries) carry partial checksums.
	go func() {
		if c, err := tp.A.DialTCP(netip.AddrPortFrom(tp.B.Addr.Addr(), enginePort), 8*time.Second); err == nil {
			c.Close()
		}
	}()
	select {
	case m := <-warned:
		if !strings.Contains(m, "offloads on") || !strings.Contains(m, "ethtool -K") {
			t.Fatalf("warning %q", m)
		}
		t.Logf("warning: %s", m)
	case <-time.After(20 * time.Second):
		t.Fatalf("no warning; poller %+v", p.Stats())
	}
}
