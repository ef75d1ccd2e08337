package daemon

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/softrnic/softrnic/client"
	"github.com/softrnic/softrnic/ctl"
	"github.com/softrnic/softrnic/mpa"
)

func TestIBPrivate(t *testing.T) {
	b := ibPrivate(ibNotYet, 0x010203, 0xa0b0c0)
	if len(b) != ibPrivateLen || string(b[:4]) != "SRIB" {
		t.Fatalf("encoded % x", b)
	}
	reason, src, dst, ok := parseIBPrivate(append(b, 1, 2, 3)) // a later version may append
	if !ok || reason != ibNotYet || src != 0x010203 || dst != 0xa0b0c0 {
		t.Fatalf("parsed %d %#x %#x %v", reason, src, dst, ok)
	}
	bad := func(f func(b []byte) []byte) []byte { return f(ibPrivate(ibOK, 1, 2)) }
	for name, b := range map[string][]byte{
		"empty":   nil,
		"short":   ibPrivate(ibOK, 1, 2)[:ibPrivateLen-1],
		"magic":   bad(func(b []byte) []byte { b[0] ^= 1; return b }),
		"version": bad(func(b []byte) []byte { b[4] = ibVersion + 1; return b }),
	} {
		if _, _, _, ok := parseIBPrivate(b); ok {
			t.Errorf("%s: accepted % x", name, b)
		}
	}
}

// Both sides of a pair agree on which connects, whatever the order.
func TestIBActiveRule(t *testing.T) {
	a, b := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")
	for _, c := range []struct {
		la     netip.Addr
		lq     uint32
		ra     netip.Addr
		rq     uint32
		active bool
	}{
		{a, 9, b, 1, true}, // the address decides first
		{b, 1, a, 9, false},
		{a, 1, a, 2, true}, // then the QPN
		{a, 2, a, 1, false},
	} {
		if got := ibActive(c.la, c.lq, c.ra, c.rq); got != c.active {
			t.Errorf("(%v, %d) to (%v, %d): active %v", c.la, c.lq, c.ra, c.rq, got)
		}
		if ibActive(c.ra, c.rq, c.la, c.lq) == ibActive(c.la, c.lq, c.ra, c.rq) {
			t.Errorf("(%v, %d) and (%v, %d) both active or both passive", c.la, c.lq, c.ra, c.rq)
		}
	}
}

// ibServer is a daemon on lo with its IB-connection port on a free port.
func ibServer(t *testing.T, timeout, park time.Duration) (*Server, string, uint16) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "d.sock")
	port := freeLoopbackPort(t)
	srv, err := New(Options{Iface: "lo", Socket: sock, Logger: quiet(), IBConnPort: int(port), IBConnTimeout: timeout, IBConnParkTimeout: park})
	if err != nil {
		t.Fatal(err)
	}
	if srv.ib == nil {
		t.Fatal("no IB-connection listener")
	}
	serve(t, srv)
	return srv, sock, port
}

// openSession is an IA of the daemon at sock, closed at the test's end, and
// a PZ of it.
func openSession(t *testing.T, sock string) (*client.IA, *client.PZ) {
	t.Helper()
	ia, err := client.Open(context.Background(), client.Options{Socket: sock, Name: "test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ia.Close() })
	pz, err := ia.CreatePZ()
	if err != nil {
		t.Fatal(err)
	}
	return ia, pz
}

type ibEP struct {
	ep  *client.EP
	dto *client.EVD
	buf *client.Buffer
	lmr *client.LMR
}

func newIBEP(t *testing.T, ia *client.IA, pz *client.PZ) *ibEP {
	t.Helper()
	dto, err := ia.CreateEVD(client.EVDOptions{Depth: 16, Kind: client.DTOEvents})
	if err != nil {
		t.Fatal(err)
	}
	buf, err := ia.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { buf.Free() })
	lmr, err := pz.RegisterLMR(buf, client.LocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	ep, err := ia.CreateEP(client.EPAttr{PZ: pz, RecvEVD: dto, RequestEVD: dto, SQDepth: 8, RQDepth: 8, IRD: 4, ORD: 4,
		MPARevision: 2, PeerToPeer: true})
	if err != nil {
		t.Fatal(err)
	}
	if ep.QPN() == 0 {
		t.Fatal("EP with a QP but QPN 0")
	}
	return &ibEP{ep: ep, dto: dto, buf: buf, lmr: lmr}
}

func waitState(t *testing.T, e *client.EP, want client.EPState, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		st, ok := e.PostableState()
		if ok && st == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("EP %d in %s after %v, want %s", e.Handle(), ctl.EPStateName(uint8(st)), within, ctl.EPStateName(uint8(want)))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Two QPs of one daemon connected by naming each other, in either order
// of their RTRs, with the second one late by less than the park time (the
// request waits for it) and by more (the request is rejected as "not
// yet" and tried again); a Send then goes across.
func TestIBConnect(t *testing.T) {
	srv, sock, _ := ibServer(t, 10*time.Second, 400*time.Millisecond)
	ia, pz := openSession(t, sock)
	for _, c := range []struct {
		name        string
		activeFirst bool
		secondWaits time.Duration
	}{
		{"active first, parked", true, 100 * time.Millisecond},
		{"active first, retried", true, 1200 * time.Millisecond},
		{"passive first", false, 100 * time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			a, b := newIBEP(t, ia, pz), newIBEP(t, ia, pz)
			if a.ep.QPN() > b.ep.QPN() {
				a, b = b, a // a is the active side: the lower QPN
			}
			if err := b.ep.PostRecv(1, []client.Segment{{LMR: b.lmr, Length: 64}}); err != nil {
				t.Fatal(err)
			}
			first, second := a, b
			if !c.activeFirst {
				first, second = b, a
			}
			if err := first.ep.ConnectQP("127.0.0.1", second.ep.QPN()); err != nil {
				t.Fatal(err)
			}
			time.Sleep(c.secondWaits)
			if err := second.ep.ConnectQP("127.0.0.1", first.ep.QPN()); err != nil {
				t.Fatal(err)
			}
			waitState(t, a.ep, client.EPState(ctl.EPConnected), 5*time.Second)
			waitState(t, b.ep, client.EPState(ctl.EPConnected), 5*time.Second)
			copy(a.buf.Bytes, "over an IB-style connection")
			if err := a.ep.PostSend(2, []client.Segment{{LMR: a.lmr, Length: 27}}, client.Signaled); err != nil {
				t.Fatal(err)
			}
			for _, side := range []*ibEP{a, b} {
				ev, _, err := side.dto.WaitTimeout(5*time.Second, 1)
				if err != nil || ev.Status != 0 {
					t.Fatalf("completion %+v %v", ev, err)
				}
			}
			if got := string(b.buf.Bytes[:27]); got != "over an IB-style connection" {
				t.Fatalf("received %q", got)
			}
			for _, side := range []*ibEP{a, b} {
				if err := side.ep.Free(); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
	srv.ib.mu.Lock()
	defer srv.ib.mu.Unlock()
	if len(srv.ib.expect) != 0 {
		t.Fatalf("expectations left: %v", srv.ib.expect)
	}
}

// A registration that sees no connection fails its QP within the
// daemon's time, on the passive side (nobody connects) and the active
// one (nobody expects it), and leaves nothing behind.
func TestIBConnectTimesOut(t *testing.T) {
	srv, sock, _ := ibServer(t, 600*time.Millisecond, 200*time.Millisecond)
	ia, pz := openSession(t, sock)
	passive, active := newIBEP(t, ia, pz), newIBEP(t, ia, pz)
	if err := passive.ep.ConnectQP("127.0.0.1", 0); err != nil { // QPN 0 is lower: passive
		t.Fatal(err)
	}
	if err := active.ep.ConnectQP("127.0.0.1", 1<<24); err != nil { // nobody has it
		t.Fatal(err)
	}
	start := time.Now()
	for _, e := range []*ibEP{passive, active} {
		waitState(t, e.ep, client.EPState(ctl.EPDisconnected), 5*time.Second)
	}
	if d := time.Since(start); d < 400*time.Millisecond {
		t.Fatalf("failed after %v, before the daemon's time", d)
	}
	// A second ConnectQP of the failed EP is refused until it is reset.
	if err := passive.ep.ConnectQP("127.0.0.1", 0); !errors.Is(err, &ctl.Error{Status: ctl.InvalidState}) {
		t.Fatalf("ConnectQP of a DISCONNECTED EP: %v", err)
	}
	srv.ib.mu.Lock()
	left := len(srv.ib.expect)
	srv.ib.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d expectations left", left)
	}
	// Freed while it waits, an EP leaves no expectation either.
	waiting := newIBEP(t, ia, pz)
	if err := waiting.ep.ConnectQP("127.0.0.1", 0); err != nil {
		t.Fatal(err)
	}
	if err := waiting.ep.Free(); err != nil {
		t.Fatal(err)
	}
	srv.ib.mu.Lock()
	left = len(srv.ib.expect)
	srv.ib.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d expectations left after the EP was freed", left)
	}
}

// ibRequest sends an MPA Request with private data pd to the port and
// returns the reply's private data, or the error that ended the
// connection without a reply.
func ibRequest(t *testing.T, port uint16, pd []byte) (mpa.Frame, error) {
	t.Helper()
	return ibRequestFrom(t, "127.0.0.1", port, pd)
}

// ibRequestFrom is ibRequest from the loopback address from.
func ibRequestFrom(t *testing.T, from string, port uint16, pd []byte) (mpa.Frame, error) {
	t.Helper()
	c := sendIBRequest(t, from, port, pd)
	defer c.Close()
	return readFrame(c, 5*time.Second)
}

// sendIBRequest connects from the loopback address from to the port and
// sends an MPA Request with private data pd.
func sendIBRequest(t *testing.T, from string, port uint16, pd []byte) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	c, err := d.Dial("tcp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(int(port))))
	if err != nil {
		t.Fatal(err)
	}
	cfg := mpa.Config{PeerToPeer: true, PrivateData: pd}
	f, err := cfg.Request()
	if err != nil {
		t.Fatal(err)
	}
	wire, _ := f.Append(nil)
	if _, err := c.Write(wire); err != nil {
		t.Fatal(err)
	}
	return c
}

// At most maxParked requests wait for QPs not yet in RTR: one more is
// refused as busy at once. A daemon that closes refuses those waiting as
// "not yet", so that their active sides try again (a daemon restarted)
// rather than wait.
func TestIBConnParkedBoundAndClose(t *testing.T) {
	port := freeLoopbackPort(t)
	srv, err := New(Options{Iface: "lo", Socket: filepath.Join(t.TempDir(), "d.sock"), Logger: quiet(), IBConnPort: int(port),
		IBConnTimeout: 10 * time.Second, IBConnParkTimeout: 60 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	stop := serve(t, srv)
	defer stop()
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := range maxParked {
		conns = append(conns, sendIBRequest(t, "127.0.0.1", port, ibPrivate(ibOK, uint32(100+i), uint32(1<<24-1-i))))
	}
	parked := func() int {
		srv.ib.mu.Lock()
		defer srv.ib.mu.Unlock()
		return len(srv.ib.parked)
	}
	for deadline := time.Now().Add(30 * time.Second); parked() < maxParked; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d requests parked after 30 s", parked(), maxParked)
		}
	}
	f, err := ibRequest(t, port, ibPrivate(ibOK, 99, 12345))
	wantReject(t, "a request beyond the bound", f, err, ibBusy)

	stop()
	for i, c := range conns {
		f, err := readFrame(c, 10*time.Second)
		wantReject(t, fmt.Sprintf("parked request %d at the daemon's close", i), f, err, ibNotYet)
	}
}

func readFrame(c net.Conn, within time.Duration) (mpa.Frame, error) {
	_ = c.SetReadDeadline(time.Now().Add(within))
	var b []byte
	buf := make([]byte, 1024)
	for {
		n, err := c.Read(buf)
		b = append(b, buf[:n]...)
		if f, _, perr := mpa.ParseFrame(b, true); perr == nil {
			return f, nil
		}
		if err != nil {
			return mpa.Frame{}, err
		}
	}
}

func wantReject(t *testing.T, what string, f mpa.Frame, err error, reason uint8) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	r, _, _, ok := parseIBPrivate(f.PrivateData)
	if !f.Reject || !ok || r != reason {
		t.Fatalf("%s: reply %+v, want a Reject for reason %d", what, f, reason)
	}
}

// Whatever a peer sends to the port is answered, or ends, cleanly.
func TestIBConnHostile(t *testing.T) {
	srv, sock, port := ibServer(t, 10*time.Second, 300*time.Millisecond)

	// Private data too short, or not ours.
	f, err := ibRequest(t, port, []byte("SRIB"))
	wantReject(t, "short private data", f, err, ibMalformed)
	f, err = ibRequest(t, port, nil)
	wantReject(t, "no private data", f, err, ibMalformed)
	pd := ibPrivate(ibOK, 1, 1)
	binary.BigEndian.PutUint32(pd, 0xdeadbeef)
	f, err = ibRequest(t, port, pd)
	wantReject(t, "wrong magic", f, err, ibMalformed)

	// A QPN nobody expects: parked, then "not yet".
	start := time.Now()
	f, err = ibRequest(t, port, ibPrivate(ibOK, 5, 1<<24))
	wantReject(t, "unknown QPN", f, err, ibNotYet)
	if d := time.Since(start); d < 250*time.Millisecond {
		t.Errorf("unknown QPN rejected after %v, before the park time", d)
	}

	// The QPN of a QP that expects another peer's.
	ia, pz := openSession(t, sock)
	e := newIBEP(t, ia, pz)
	if err := e.ep.ConnectQP("127.0.0.1", 0); err != nil {
		t.Fatal(err)
	}
	f, err = ibRequest(t, port, ibPrivate(ibOK, 77, e.ep.QPN()))
	wantReject(t, "another peer's request", f, err, ibOther)
	// The right QPNs from another address.
	f, err = ibRequestFrom(t, "127.0.0.2", port, ibPrivate(ibOK, 0, e.ep.QPN()))
	wantReject(t, "a request from another address", f, err, ibOther)
	if st, _ := e.ep.PostableState(); st != client.EPState(ctl.EPUnconnected) {
		t.Fatalf("the expecting EP went to %s", ctl.EPStateName(uint8(st)))
	}

	// Garbage instead of an MPA Request, and a peer that says nothing:
	// closed, never answered with a connection.
	for name, send := range map[string][]byte{"garbage": []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), "stall": nil} {
		c, err := net.Dial("tcp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(int(port))))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write(send); err != nil {
			t.Fatal(err)
		}
		f, err := readFrame(c, 5*time.Second)
		var ne net.Error
		if err == nil && !f.Reject || errors.As(err, &ne) && ne.Timeout() {
			t.Errorf("%s: %+v %v, want the connection closed", name, f, err)
		}
		c.Close()
	}

	// Nothing is left parked, and the daemon still serves.
	srv.ib.mu.Lock()
	parked := len(srv.ib.parked)
	srv.ib.mu.Unlock()
	if parked != 0 {
		t.Fatalf("%d requests left parked", parked)
	}
	if _, err := ia.Stats(); err != nil {
		t.Fatal(err)
	}
}

// FuzzIBPrivate: any private data a peer sends is parsed without a panic,
// and what parses encodes back to its first 16 octets.
func FuzzIBPrivate(f *testing.F) {
	f.Add(ibPrivate(ibOK, 1, 2))
	f.Add([]byte("SRIB"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		reason, src, dst, ok := parseIBPrivate(b)
		if !ok {
			return
		}
		want := ibPrivate(reason, src, dst)
		copy(want[6:8], b[6:8]) // reserved octets are ignored
		if string(want) != string(b[:ibPrivateLen]) {
			t.Fatalf("% x parsed as %d %d %d, encodes to % x", b, reason, src, dst, want)
		}
	})
}

// An EP that waits for an InfiniBand-style connection cannot be connected
// another way meanwhile: its expectation, running out later, would end
// that connection. Reset gives the wait up, and the EP can connect again.
func TestIBWaitingEPConnectsNoOtherWay(t *testing.T) {
	srv, sock, _ := ibServer(t, 10*time.Second, 200*time.Millisecond)
	ia, pz := openSession(t, sock)
	dto, err := ia.CreateEVD(client.EVDOptions{Depth: 16, Kind: client.DTOEvents})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := ia.CreateEVD(client.EVDOptions{Depth: 16, Kind: client.ConnectionEvents})
	if err != nil {
		t.Fatal(err)
	}
	ep, err := ia.CreateEP(client.EPAttr{PZ: pz, RecvEVD: dto, RequestEVD: dto, ConnectEVD: conn, SQDepth: 8, RQDepth: 8,
		MPARevision: 2, PeerToPeer: true})
	if err != nil {
		t.Fatal(err)
	}
	passive := &ibEP{ep: ep}
	if err := passive.ep.ConnectQP("127.0.0.1", 0); err != nil { // QPN 0 is lower: passive
		t.Fatal(err)
	}
	if err := passive.ep.Connect("127.0.0.1:1", nil, time.Second); !errors.Is(err, &ctl.Error{Status: ctl.InvalidState}) {
		t.Fatalf("Connect of an EP waiting for an IB-style connection: %v, want INVALID_STATE", err)
	}
	if err := passive.ep.Reset(); err != nil {
		t.Fatal(err)
	}
	srv.ib.mu.Lock()
	left := len(srv.ib.expect)
	srv.ib.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d expectations left after Reset", left)
	}
	if err := passive.ep.ConnectQP("127.0.0.1", 0); err != nil {
		t.Fatalf("ConnectQP after Reset: %v", err)
	}
}
