package daemon

import (
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/softrnic/softrnic/ctl"
	"github.com/softrnic/softrnic/internal/testenv"
	"github.com/softrnic/softrnic/internal/topology"
	"github.com/softrnic/softrnic/tcp"
)

// stallAfter is the tests' threshold (the watchdog looks every 80 ms):
// short, but long beside any scheduling delay of a loaded 2-core host.
const stallAfter = 400 * time.Millisecond

// logBuffer is a log destination the test reads while the daemon writes.
type logBuffer struct{ testenv.Buffer }

// stallRecords are the log's stall records.
func (l *logBuffer) stallRecords() []string {
	var out []string
	for _, line := range strings.Split(l.String(), "\n") {
		if strings.Contains(line, "msg=\"stall: ") {
			out = append(out, line)
		}
	}
	return out
}

// serve starts srv's Serve and returns a function that closes it and
// checks that the watchdog's goroutine is gone.
func serve(t *testing.T, srv *Server) (stop func()) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- srv.Serve() }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			srv.Close()
			<-done
			// The watchdog has closed its done channel when Close
			// returns, and is then returning: on a busy host it may
			// not have run that far yet (CI saw one left). Gone
			// within a second, or it leaked.
			n := goroutinesIn("daemon.startWatchdog")
			for deadline := time.Now().Add(time.Second); n != 0 && time.Now().Before(deadline); {
				time.Sleep(5 * time.Millisecond)
				n = goroutinesIn("daemon.startWatchdog")
			}
			if n != 0 {
				t.Errorf("%d watchdog goroutines left after Close", n)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// goroutinesIn counts the goroutines with fn on their stack (or in their
// "created by" line).
func goroutinesIn(fn string) int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, fn) {
			n++
		}
	}
	return n
}

// waitStalls waits until the daemon has counted want stalls.
func waitStalls(t *testing.T, srv *Server, want uint64) {
	t.Helper()
	deadline := time.Now().Add(20 * stallAfter)
	for srv.Stalls() < want {
		if time.Now().After(deadline) {
			t.Fatalf("%d stalls counted after %v, want %d", srv.Stalls(), 20*stallAfter, want)
		}
		time.Sleep(stallAfter / 10)
	}
}

// A session's poll loop that sleeps idle is never stalled; one blocked on
// the session's lock (held here, as a deadlock would) after a wake-up is
// reported once per episode, with its name and every goroutine's stack,
// and counted; released and blocked again, it is counted again. Close
// stops the watchdog.
func TestStallSessionLoop(t *testing.T) {
	var logs logBuffer
	sock := filepath.Join(t.TempDir(), "d.sock")
	srv, err := New(Options{Iface: "lo", Socket: sock, StallAfter: stallAfter,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	stop := serve(t, srv)
	if n := goroutinesIn("daemon.startWatchdog"); n != 1 {
		t.Fatalf("%d watchdog goroutines, want 1", n)
	}
	c, err := net.Dial("unixpacket", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sess := onlySession(t, srv)

	// Idle for three thresholds: asleep on its channel, not stalled.
	time.Sleep(3 * stallAfter)
	if n := srv.Stalls(); n != 0 {
		t.Fatalf("an idle session loop was counted stalled %d times:\n%s", n, logs.String())
	}

	name := fmt.Sprintf("session %d poll loop", sess.id)
	for round := uint64(1); round <= 2; round++ {
		sess.mu.Lock()
		sess.kick() // it wakes and blocks on mu
		waitStalls(t, srv, round)
		time.Sleep(2 * stallAfter) // still stalled: not reported again
		recs := logs.stallRecords()
		n := srv.Stalls()
		sess.mu.Unlock()
		if n != round || uint64(len(recs)) != round {
			t.Fatalf("round %d: %d stalls counted, %d logged, want %d", round, n, len(recs), round)
		}
		rec := recs[round-1]
		for _, want := range []string{"level=ERROR", name, "goroutine ", "daemon.(*session).poll", "sync.(*Mutex).Lock", fmt.Sprintf("stalls=%d", round)} {
			if !strings.Contains(rec, want) {
				t.Fatalf("round %d: the stall record lacks %q:\n%.2000s", round, want, rec)
			}
		}
		// Recovered: it steps and sleeps again; the watchdog sees it.
		time.Sleep(2 * stallAfter)
	}
	if n := srv.Stalls(); n != 2 {
		t.Fatalf("after recovering: %d stalls", n)
	}
	c.Close()
	stop()
}

// onlySession waits for the server's one session.
func onlySession(t *testing.T, srv *Server) *session {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		srv.mu.Lock()
		for s := range srv.sessions {
			srv.mu.Unlock()
			return s
		}
		srv.mu.Unlock()
		if time.Now().After(deadline) {
			t.Fatal("no session")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// The Stats reply carries the daemon's stall count.
func TestStatsReplyStalls(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "d.sock")
	srv, err := New(Options{Iface: "lo", Socket: sock, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	serve(t, srv)
	srv.watch.stalls.Add(3) // as three episodes would
	c, err := net.Dial("unixpacket", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	req, _ := ctl.Marshal(ctl.Header{Op: ctl.OpStats, ID: 1}, &struct{}{})
	if _, err := c.Write(req); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, ctl.MaxMessage)
	n, err := c.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	h, body, err := ctl.ParseHeader(buf[:n])
	if err != nil || h.Status != ctl.Success {
		t.Fatalf("reply %+v %v", h, err)
	}
	var r ctl.StatsReply
	if err := ctl.Unmarshal(body, &r); err != nil {
		t.Fatal(err)
	}
	if r.Stalls != 3 || r.Sessions != 1 {
		t.Fatalf("stats %+v, want 3 stalls and 1 session", r)
	}
}

// On the xdp datapath: an idle poller (asleep in ppoll, up to a second at
// a time) is never stalled; a turn blocked in a Do function, then in an
// Async function, is reported once per episode with the poller's name and
// stacks, and counted by the daemon and in the poller's Stats.
func TestStallXDPPoller(t *testing.T) {
	tp := topology.NewTest(t, topology.Options{MTU: 1500})
	var logs logBuffer
	var srv *Server
	err := tp.B.Do(func() error {
		var err error
		srv, err = New(Options{Iface: tp.B.Link, Datapath: "xdp", Pollers: 1, NAPI: "keep", StallAfter: stallAfter,
			Socket: filepath.Join(t.TempDir(), "b.sock"), Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	serve(t, srv)
	p := srv.dev.Pollers()[0]

	time.Sleep(2500 * time.Millisecond) // idle: sleeps of up to a second, six thresholds
	if n, ps := srv.Stalls(), p.Stats().Stalls; n != 0 || ps != 0 {
		t.Fatalf("an idle poller was counted stalled (daemon %d, poller %d):\n%s", n, ps, logs.String())
	}

	blockers := []struct {
		name  string
		block func(release chan struct{}) <-chan struct{}
		frame string // a function on the blocked loop's stack
	}{
		{"Do", func(release chan struct{}) <-chan struct{} {
			done := make(chan struct{})
			go func() {
				defer close(done)
				_ = p.Do(func(*tcp.Stack, tcp.Time) { <-release })
			}()
			return done
		}, "xdpnet.(*Poller).turn"},
		{"Async", func(release chan struct{}) <-chan struct{} {
			done := make(chan struct{})
			p.Async(func() { <-release; close(done) })
			return done
		}, "xdpnet.(*Poller).runAsync"},
	}
	for i, b := range blockers {
		round := uint64(i + 1)
		release := make(chan struct{})
		returned := b.block(release)
		waitStalls(t, srv, round)
		time.Sleep(2 * stallAfter)
		n, ps, recs := srv.Stalls(), p.Stats().Stalls, logs.stallRecords()
		close(release)
		<-returned
		if n != round || ps != round || uint64(len(recs)) != round {
			t.Fatalf("%s: daemon counted %d, poller %d, %d logged; want %d", b.name, n, ps, len(recs), round)
		}
		for _, want := range []string{"level=ERROR", p.Name(), "goroutine ", b.frame} {
			if !strings.Contains(recs[i], want) {
				t.Fatalf("%s: the stall record lacks %q:\n%.2000s", b.name, want, recs[i])
			}
		}
		time.Sleep(2 * stallAfter)
	}
	if err := p.Do(func(*tcp.Stack, tcp.Time) {}); err != nil {
		t.Fatalf("Do after the stalls: %v", err)
	}
}
