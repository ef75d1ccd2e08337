package rnic

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/softrnic/softrnic/internal/testenv"
	"github.com/softrnic/softrnic/internal/topology"
	"github.com/softrnic/softrnic/tcp"
)

// A server that is not iWARP answers the MPA Request with an HTTP error:
// the connect fails at once (with the kernel datapath's error, not a
// timeout), the poller that ran it keeps serving, the next connection on
// the same device works, and the device closes promptly. On the xdp
// datapath the MPA layer's abort from inside the TCP engine's Receive
// once re-entered the QP's lock and froze the poller for good.
func TestNonIWARPServerDoesNotStallTheDevice(t *testing.T) {
	testenv.RequireRoot(t)
	for _, datapath := range []string{"kernel", "xdp"} {
		for _, keepOpen := range []bool{false, true} {
			name := datapath + "/answer-and-close"
			if keepOpen {
				name = datapath + "/answer-and-stay"
			}
			t.Run(name, func(t *testing.T) { testNonIWARPServer(t, datapath, keepOpen) })
		}
	}
}

func testNonIWARPServer(t *testing.T, datapath string, keepOpen bool) {
	tp := topology.NewTest(t, topology.Options{MTU: 1500})
	// A: the plain TCP server and, on another port, a good RNIC.
	bad, err := tp.A.ListenTCP(netip.AddrPortFrom(tp.A.Addr.Addr(), 8080))
	must(t, err)
	defer bad.Close()
	stay := make(chan struct{})
	defer close(stay)
	go func() {
		for {
			c, err := bad.AcceptTCP()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 512)
				_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
				if _, err := c.Read(buf); err != nil {
					return
				}
				_, _ = io.WriteString(c, "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
				if keepOpen {
					<-stay
				}
			}()
		}
	}()
	good := newHost(t)
	var ln *Listener
	must(t, tp.A.Do(func() error {
		var err error
		ln, err = good.dev.Listen(net.JoinHostPort(tp.A.Addr.Addr().String(), "4791"), ListenOptions{})
		return err
	}))
	defer ln.Close()

	// B: the device under test.
	var dev *Device
	var q1, q2 *QP
	if datapath == "xdp" {
		s := newXDPSide(t, tp.B, XDPOptions{Pollers: 1, TCP: tcp.Options{TimeWait: time.Second}})
		dev = s.dev
		q1, _, _ = s.qp(t, 0, 16)
		q2, _, _ = s.qp(t, 0, 16)
	} else {
		h := newHost(t)
		dev = h.dev
		q1, q2 = h.qp(QPAttr{}), h.qp(QPAttr{})
	}
	start := time.Now()
	err = tp.B.Do(func() error {
		_, err := q1.Connect(context.Background(), net.JoinHostPort(tp.A.Addr.Addr().String(), "8080"), ConnectOptions{Timeout: 20 * time.Second})
		return err
	})
	took := time.Since(start)
	if err == nil {
		t.Fatal("connect to an HTTP server succeeded")
	}
	if errors.Is(err, ErrTimedOut) || took > 10*time.Second {
		t.Fatalf("connect to an HTTP server: %v after %v; want a prompt failure", err, took)
	}
	t.Logf("connect to an HTTP server: %v after %v", err, took.Round(time.Millisecond))

	if p := dev.Poller(0); p != nil {
		done := make(chan error, 1)
		go func() { done <- p.Do(func(*tcp.Stack, tcp.Time) {}) }()
		select {
		case err := <-done:
			must(t, err)
		case <-time.After(5 * time.Second):
			t.Fatal("the poller no longer takes calls")
		}
	}
	// The next connection on the same device (and poller) works.
	s2 := good.qp(QPAttr{})
	connectVia(t, tp.B, ln, net.JoinHostPort(tp.A.Addr.Addr().String(), "4791"), q2, s2)
	waitEvent(t, q2, Established)

	closed := make(chan struct{})
	start = time.Now()
	go func() { dev.Close(); close(closed) }()
	select {
	case <-closed:
		t.Logf("device closed in %v", time.Since(start).Round(time.Millisecond))
	case <-time.After(5 * time.Second):
		t.Fatal("the device did not close within 5 s")
	}
}

// A client that is not iWARP (an HTTP request, shorter than an MPA
// header) is refused as soon as its first 16 octets show it, on both
// datapaths: the connection closes at once instead of after the request
// timeout, and the listener goes on serving.
func TestNonIWARPClientRefusedAtOnce(t *testing.T) {
	testenv.RequireRoot(t)
	for _, datapath := range []string{"kernel", "xdp"} {
		t.Run(datapath, func(t *testing.T) {
			tp := topology.NewTest(t, topology.Options{MTU: 1500})
			var dev *Device
			if datapath == "xdp" {
				dev = newXDPSide(t, tp.B, XDPOptions{Pollers: 1}).dev
			} else {
				dev = newHost(t).dev
			}
			addr := net.JoinHostPort(tp.B.Addr.Addr().String(), "4791")
			var ln *Listener
			must(t, tp.B.Do(func() error {
				var err error
				ln, err = dev.Listen(addr, ListenOptions{RequestTimeout: 20 * time.Second})
				return err
			}))
			defer ln.Close()
			c, err := tp.A.DialTCP(netip.MustParseAddrPort(addr), 5*time.Second)
			must(t, err)
			defer c.Close()
			start := time.Now()
			_, err = io.WriteString(c, "GET / HTTP/1.0\r\n\r\n")
			must(t, err)
			_ = c.SetReadDeadline(time.Now().Add(15 * time.Second))
			if _, err := io.ReadAll(c); err != nil && !errors.Is(err, syscall.ECONNRESET) {
				t.Fatalf("read: %v after %v", err, time.Since(start))
			}
			if took := time.Since(start); took > 5*time.Second {
				t.Fatalf("the connection closed after %v, want at once", took)
			}
		})
	}
}
