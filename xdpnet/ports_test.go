package xdpnet_test

import (
	"errors"
	"net"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/softrnic/softrnic/bpf"
	"github.com/softrnic/softrnic/internal/testenv"
	"github.com/softrnic/softrnic/tcp"
	"github.com/softrnic/softrnic/xdpnet"
)

// stateHandler reports when its connection is established, and when it
// closes.
type stateHandler struct {
	up, down         chan struct{}
	upOnce, downOnce sync.Once
}

func newStateHandler() *stateHandler {
	return &stateHandler{up: make(chan struct{}), down: make(chan struct{})}
}

func (h *stateHandler) Receive(c *tcp.Conn, b []byte) int { return len(b) }

func (h *stateHandler) Event(c *tcp.Conn, ev tcp.Event) {
	switch ev {
	case tcp.EventEstablished:
		h.upOnce.Do(func() { close(h.up) })
	case tcp.EventClosed:
		h.downOnce.Do(func() { close(h.down) })
	}
}

// kernelSink listens in A's kernel on port and keeps every connection it
// accepts until the test ends.
func kernelSink(t *testing.T, e *env, port uint16) {
	t.Helper()
	ln, err := e.tp.A.ListenTCP(netip.AddrPortFrom(e.tp.A.Addr.Addr(), port))
	if err != nil {
		t.Fatalf("kernel listen on %d: %v", port, err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		for _, c := range conns {
			c.Close()
		}
	})
}

// waitPorts waits until the poller holds want ports; it returns what it
// last saw.
func waitPorts(p *xdpnet.Poller, want int, within time.Duration) int {
	deadline := time.Now().Add(within)
	for {
		// Stats are published after each Do: one makes them fresh.
		_ = p.Do(func(*tcp.Stack, tcp.Time) {})
		got := p.Stats().Ports
		if got == want || time.Now().After(deadline) {
			return got
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Issue 16, one port reservation per port: connections from the engine to
// two remote ends share local ports, since the steering program and the
// Stack tell them apart by 4-tuple; each port is held by one kernel
// socket, released with the last connection on it.
func TestPortsSharedBetweenRemoteEnds(t *testing.T) {
	testenv.RequireRoot(t)
	e := start(t, bpf.ModeNative, tcp.Options{})
	const perRemote = 20
	remotes := []uint16{kernelPort + 100, kernelPort + 101}
	for _, port := range remotes {
		kernelSink(t, e, port)
	}
	var conns []*tcp.Conn
	var hs []*stateHandler
	for _, port := range remotes {
		for range perRemote {
			h := newStateHandler()
			c, err := e.p.Connect(netip.AddrPortFrom(e.tp.A.Addr.Addr(), port), h, 5*time.Second)
			if err != nil {
				t.Fatalf("connect to %d: %v", port, err)
			}
			conns, hs = append(conns, c), append(hs, h)
		}
	}
	for i, h := range hs {
		select {
		case <-h.up:
		case <-time.After(10 * time.Second):
			t.Fatalf("connection %d not established", i)
		}
	}
	if got := waitPorts(e.p, perRemote, 0); got != perRemote {
		t.Errorf("%d connections to %d remote ends hold %d ports, want %d", len(conns), len(remotes), got, perRemote)
	}
	// Every 4-tuple differs.
	seen := map[tcp.FourTuple]bool{}
	if err := e.p.Do(func(*tcp.Stack, tcp.Time) {
		for _, c := range conns {
			seen[c.ID()] = true
		}
	}); err != nil {
		t.Fatal(err)
	}
	if len(seen) != len(conns) {
		t.Errorf("%d connections on %d 4-tuples", len(conns), len(seen))
	}
	// Aborted, the connections leave the Stack, and the sweep gives the
	// ports back.
	if err := e.p.Do(func(*tcp.Stack, tcp.Time) {
		for _, c := range conns {
			c.Abort()
		}
	}); err != nil {
		t.Fatal(err)
	}
	if got := waitPorts(e.p, 0, 5*time.Second); got != 0 {
		t.Errorf("%d ports still held after every connection was aborted", got)
	}
}

// A descriptor limit that stops a Connect is named in its error, which
// wraps ErrResources: it is this host's shortage, not the peer's answer.
func TestConnectAtTheDescriptorLimit(t *testing.T) {
	testenv.RequireRoot(t)
	e := start(t, bpf.ModeNative, tcp.Options{})
	kernelSink(t, e, kernelPort+102)
	remote := netip.AddrPortFrom(e.tp.A.Addr.Addr(), kernelPort+102)
	// The neighbour resolved first: what follows only reserves ports.
	if _, err := e.p.Connect(remote, newStateHandler(), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	var old syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &old); err != nil {
		t.Fatal(err)
	}
	low := old
	low.Cur = uint64(openFDs(t) + 8)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &old); err != nil {
			t.Fatal(err)
		}
	}()
	var err error
	for range 32 {
		if _, err = e.p.Connect(remote, newStateHandler(), 5*time.Second); err != nil {
			break
		}
	}
	if !errors.Is(err, xdpnet.ErrResources) || !strings.Contains(err.Error(), "RLIMIT_NOFILE") {
		t.Fatalf("connect at the descriptor limit: %v, want ErrResources naming RLIMIT_NOFILE", err)
	}
	t.Logf("at the limit: %v", err)
}

// openFDs is the number of descriptors the process holds.
func openFDs(t *testing.T) int {
	t.Helper()
	fds, err := filepath.Glob("/proc/self/fd/*")
	if err != nil {
		t.Fatal(err)
	}
	return len(fds)
}
