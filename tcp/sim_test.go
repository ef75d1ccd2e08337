package tcp_test

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/softrnic/softrnic/header"
	"github.com/softrnic/softrnic/tcp"
	"github.com/softrnic/softrnic/tcp/sim"
)

var secret = [16]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}

func newStack(t testing.TB, o tcp.Options) *tcp.Stack {
	t.Helper()
	o.Secret = secret
	s, err := tcp.NewStack(o)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// pair is a client and a server endpoint over a simulated network.
type pair struct {
	net            *sim.Network
	client, server *sim.Endpoint
	cconn          *tcp.Conn
	listener       *tcp.Listener
}

const port = 7000

// newPair connects A (client) to B (server) over links ab and ba; client
// sends up octets and the server down, each closing when done if close.
func newPair(t testing.TB, seed uint64, o tcp.Options, ab, ba *sim.Link, up, down uint64, close bool) *pair {
	t.Helper()
	a, b := newStack(t, o), newStack(t, o)
	n := sim.New(seed, a, b, ab, ba)
	p := &pair{net: n}
	p.server = &sim.Endpoint{Seed: 2, PeerSeed: 1, Total: down, CloseWhenDone: close}
	p.client = &sim.Endpoint{Seed: 1, PeerSeed: 2, Total: up, CloseWhenDone: close}
	l, err := b.Listen(netip.Addr{}, port, p.server)
	if err != nil {
		t.Fatal(err)
	}
	p.listener = l
	c, err := a.Connect(n.Now, n.A.Addr, 0, netip.AddrPortFrom(n.B.Addr, port), p.client)
	if err != nil {
		t.Fatal(err)
	}
	p.cconn = c
	p.client.Conn = c
	trace(n)
	return p
}

// transferred: both sides got everything and, with close, both closed.
func (p *pair) done(close bool) bool {
	ok := p.client.Recvd == p.server.Total && p.server.Recvd == p.client.Total
	if close {
		ok = ok && p.client.Closed && p.server.Closed
	}
	return ok
}

func (p *pair) check(t testing.TB, what string) {
	t.Helper()
	for _, e := range []*sim.Endpoint{p.client, p.server} {
		if e.Corrupt != nil {
			t.Fatalf("%s: data corrupted: %v", what, e.Corrupt)
		}
	}
}

func TestHandshakeTransferClose(t *testing.T) {
	link := func() *sim.Link { return &sim.Link{Delay: 5 * time.Millisecond} }
	p := newPair(t, 1, tcp.Options{}, link(), link(), 100000, 50000, true)
	if !p.net.Run(time.Minute, func() bool {
		return p.client.Recvd == 50000 && p.server.Recvd == 100000 && p.client.PeerClosed && p.server.PeerClosed
	}) {
		t.Fatalf("transfer did not finish: client sent %d recvd %d, server sent %d recvd %d, client %v server %v",
			p.client.Sent, p.client.Recvd, p.server.Sent, p.server.Recvd, p.cconn.State(), p.server.Conn.State())
	}
	p.check(t, "transfer")
	// The active closer... both closed at once: one of them ends in
	// TIME-WAIT for 2*MSL, the other closes.
	if !p.net.Run(2*time.Minute, func() bool { return p.client.Closed && p.server.Closed }) {
		t.Fatalf("not closed: client %v server %v", p.cconn.State(), p.server.Conn.State())
	}
	if p.client.Err != nil || p.server.Err != nil {
		t.Fatalf("orderly close ended with errors %v / %v", p.client.Err, p.server.Err)
	}
	if n := p.net.A.Stack.Conns() + p.net.B.Stack.Conns(); n != 0 {
		t.Fatalf("%d connections left", n)
	}
}

// trace prints segments (for debugging: SOFTRNIC_TCP_TRACE=N prints the
// first N).
func trace(n *sim.Network) {
	limit := 0
	fmt.Sscan(os.Getenv("SOFTRNIC_TCP_TRACE"), &limit)
	if limit == 0 {
		return
	}
	count := 0
	n.Tap = func(from *sim.Host, b []byte) {
		if count >= limit {
			return
		}
		count++
		t := header.TCP(b)
		var o header.TCPOptions
		header.ParseTCPOptions(t.Options(), &o)
		name := "A"
		if from == n.B {
			name = "B"
		}
		fmt.Printf("%8.3fms %s flags=%02x seq=%d ack=%d len=%d win=%d sack=%v\n", float64(n.Now)/1e6-1000, name, t.Flags(), t.Seq(), t.Ack(), len(t.Payload()), t.Window(), o.SACK[:o.NumSACK])
	}
}

func newRand(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, 42)) }
