package tcp_test

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/softrnic/softrnic/tcp"
	"github.com/softrnic/softrnic/tcp/sim"
)

// guarded is a Handler that fails the test when the engine calls it while
// one of its calls runs, or while outside is set (the test is making an
// application call). The hooks misbehave from inside the callbacks, as the
// MPA layer does when a peer lies: they abort or close the connection.
type guarded struct {
	sim.Endpoint
	t       *testing.T
	in      bool
	outside bool
	// onReceive, onFill and onEvent run inside the callback.
	onReceive func(c *tcp.Conn)
	onFill    func(c *tcp.Conn)
	onEvent   func(c *tcp.Conn, ev tcp.Event)
}

func (g *guarded) enter(what string) {
	g.t.Helper()
	if g.in {
		g.t.Errorf("%s called inside another Handler call", what)
	}
	if g.outside {
		g.t.Errorf("%s called from inside an application call", what)
	}
	g.in = true
}

func (g *guarded) Receive(c *tcp.Conn, b []byte) int {
	g.enter("Receive")
	defer func() { g.in = false }()
	n := g.Endpoint.Receive(c, b)
	if g.onReceive != nil {
		g.onReceive(c)
	}
	return n
}

func (g *guarded) Event(c *tcp.Conn, ev tcp.Event) {
	g.enter("Event " + ev.String())
	defer func() { g.in = false }()
	g.Endpoint.Event(c, ev)
	if g.onEvent != nil {
		g.onEvent(c, ev)
	}
}

func (g *guarded) Fill(c *tcp.Conn, dst []byte) int {
	g.enter("Fill")
	defer func() { g.in = false }()
	if g.onFill != nil {
		g.onFill(c)
	}
	if c.State() == tcp.StateClosed {
		return 0
	}
	n := min(len(dst), 1000)
	sim.FillPattern(g.Seed, g.Sent, dst[:n])
	g.Sent += uint64(n)
	return n
}

// count is how many times ev was delivered.
func (g *guarded) count(ev tcp.Event) int {
	n := 0
	for _, e := range g.Events {
		if e == ev {
			n++
		}
	}
	return n
}

// guardedPair connects a client and a server guarded Handler over a sim
// network.
func guardedPair(t *testing.T) (n *sim.Network, cli, srv *guarded, cc *tcp.Conn) {
	a, b := newStack(t, tcp.Options{}), newStack(t, tcp.Options{})
	n = sim.New(1, a, b, plainLink(), plainLink())
	cli = &guarded{t: t, Endpoint: sim.Endpoint{Seed: 1, PeerSeed: 2}}
	srv = &guarded{t: t, Endpoint: sim.Endpoint{Seed: 2, PeerSeed: 1}}
	if _, err := b.Listen(netip.Addr{}, port, srv); err != nil {
		t.Fatal(err)
	}
	cc, err := a.Connect(n.Now, n.A.Addr, 0, netip.AddrPortFrom(n.B.Addr, port), cli)
	if err != nil {
		t.Fatal(err)
	}
	return n, cli, srv, cc
}

// A Handler that aborts or closes its connection from inside Receive,
// Fill or Event is not called again until that call has returned; its
// EventClosed follows, once; the peer sees the reset.
func TestHandlerNeverReentered(t *testing.T) {
	for _, tc := range []struct {
		name string
		arm  func(cli, srv *guarded)
	}{
		{"abort in Receive", func(cli, srv *guarded) { srv.onReceive = func(c *tcp.Conn) { c.Abort() } }},
		{"abort in Fill", func(cli, srv *guarded) {
			cli.onFill = func(c *tcp.Conn) {
				if cli.Sent > 3000 {
					c.Abort()
				}
			}
		}},
		{"abort in Established", func(cli, srv *guarded) {
			srv.onEvent = func(c *tcp.Conn, ev tcp.Event) {
				if ev == tcp.EventEstablished {
					c.Abort()
				}
			}
		}},
		{"close then abort in Receive", func(cli, srv *guarded) {
			srv.onReceive = func(c *tcp.Conn) { c.Close(); c.Abort(); c.Abort() }
		}},
		{"abort in PeerClosed", func(cli, srv *guarded) {
			cli.onFill = func(c *tcp.Conn) {
				if cli.Sent >= 5000 {
					c.Close()
				}
			}
			srv.onEvent = func(c *tcp.Conn, ev tcp.Event) {
				if ev == tcp.EventPeerClosed {
					c.Abort()
				}
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, cli, srv, _ := guardedPair(t)
			cli.t, srv.t = t, t
			tc.arm(cli, srv)
			if !n.Run(time.Minute, func() bool { return cli.Closed && srv.Closed }) {
				t.Fatalf("not closed: client %v, server %v", cli.Events, srv.Events)
			}
			for _, g := range []*guarded{cli, srv} {
				if k := g.count(tcp.EventClosed); k != 1 {
					t.Errorf("EventClosed delivered %d times: %v", k, g.Events)
				}
				if i := slices.Index(g.Events, tcp.EventClosed); i != len(g.Events)-1 {
					t.Errorf("events after EventClosed: %v", g.Events)
				}
			}
			if cli.Err == nil && srv.Err == nil {
				t.Errorf("an abort ended without an error on either side")
			}
		})
	}
}

// An application call (here, as from a poller's Do function) never calls
// the Handler: the events it raises wait for the Stack's next Input,
// Advance or Output.
func TestApplicationCallsDeferEvents(t *testing.T) {
	n, cli, _, cc := guardedPair(t)
	if !n.Run(time.Second, func() bool { return cli.Established }) {
		t.Fatal("no handshake")
	}
	cli.outside = true
	cc.Abort()
	cc.Abort()
	cli.outside = false
	if cli.Closed {
		t.Fatal("EventClosed delivered inside Abort")
	}
	n.A.Stack.Advance(n.Now)
	if !cli.Closed || cli.count(tcp.EventClosed) != 1 {
		t.Fatalf("after Advance: events %v", cli.Events)
	}
}

// A listener closed by the application resets its unaccepted connections
// without calling their Handler from inside Listener.Close.
func TestListenerCloseDefersEvents(t *testing.T) {
	a, b := newStack(t, tcp.Options{}), newStack(t, tcp.Options{})
	n := sim.New(1, a, b, plainLink(), plainLink())
	srv := &guarded{t: t}
	l, err := b.Listen(netip.Addr{}, port, srv)
	if err != nil {
		t.Fatal(err)
	}
	cli := &guarded{t: t}
	if _, err := a.Connect(n.Now, n.A.Addr, 0, netip.AddrPortFrom(n.B.Addr, port), cli); err != nil {
		t.Fatal(err)
	}
	if !n.Run(time.Second, func() bool { return srv.Established && l.Pending() == 1 }) {
		t.Fatal("no handshake")
	}
	srv.outside = true
	l.Close()
	srv.outside = false
	if srv.Closed {
		t.Fatal("EventClosed delivered inside Listener.Close")
	}
	if !n.Run(time.Second, func() bool { return srv.Closed && cli.Closed }) {
		t.Fatalf("server %v, client %v", srv.Events, cli.Events)
	}
}
