package systest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/client"
	"github.com/softrnic/softrnic/completion"
	"github.com/softrnic/softrnic/ctl"
	"github.com/softrnic/softrnic/internal/topology"
	"github.com/softrnic/softrnic/mpa"
)

// Issue 14: a dead client holds nothing. An application process is killed
// with SIGKILL at each phase of a connection's life, on each datapath; the
// daemon must free everything it owned (its QPs, LMRs, EVDs, PSPs: the
// Stats counts go back to what they were) and its port must take a new
// listener within a second of the kill; the peer application, on the other
// host, must see the connection end (or its connect fail) at once rather
// than at a timeout; and a process started again on the same port must work
// at once. The times are logged: run with -v to see them.
//
// The victim runs on host B; the peer and an observer (which reads B's
// counts and tries B's port) are sessions of this process. A victim is
// this test binary run again (TestKillVictim).
//
//	sudo go test ./systest -run 'TestKilled' -v
func TestKilledClientFreesItsResources(t *testing.T) {
	for _, dp := range killDatapaths() {
		t.Run(dp, func(t *testing.T) {
			r := newKillRig(t, dp)
			var portFreed, objsFreed, peerSaw, refused []time.Duration
			for _, ph := range killPhases {
				t.Run(ph.name, func(t *testing.T) {
					for rep := range killReps {
						m := r.killOnce(t, ph)
						msg := fmt.Sprintf("%s %s #%d: objects freed %v", dp, ph.name, rep, rounded(m.objs))
						if ph.port {
							msg += fmt.Sprintf(", port listenable %v (then a connect to it NON_PEER_REJECTED in %v)", rounded(m.port), rounded(m.refused))
							refused = append(refused, m.refused)
						}
						if m.peerEvent != 0 {
							msg += fmt.Sprintf(", peer saw %v after %v", m.peerEvent, rounded(m.peer))
						}
						t.Log(msg)
						objsFreed = append(objsFreed, m.objs)
						if m.port > 0 {
							portFreed = append(portFreed, m.port)
						}
						if m.peer > 0 {
							peerSaw = append(peerSaw, m.peer)
						}
						if t.Failed() {
							return
						}
					}
					// A process started again on the port works at once.
					r.echo(t)
				})
				if t.Failed() {
					return
				}
			}
			checkKillMedian(t, dp+": SIGKILL to port listenable again", portFreed)
			checkKillMedian(t, dp+": SIGKILL to the dead client's objects freed", objsFreed)
			checkKillMedian(t, dp+": SIGKILL to the peer's disconnect or failed connect", peerSaw)
			checkKillMedian(t, dp+": connect to a port nobody listens on, to NON_PEER_REJECTED", refused)
		})
	}
}

// A daemon killed mid-transfer: the peer's consumer on the other host sees
// its connection end at once (on the xdp datapath the XDP program goes with
// the daemon and B's kernel resets the peer's next segment; on the kernel
// datapath B's kernel closes the daemon's sockets), and a daemon started
// again serves a new process on the same port at once.
func TestKilledDaemonMidTransfer(t *testing.T) {
	for _, dp := range killDatapaths() {
		t.Run(dp, func(t *testing.T) {
			r := newKillRig(t, dp)
			var peerSaw, restarted []time.Duration
			for rep := range killReps {
				c := r.startVictim(t, "target")
				c.waitLine(t, "listening")
				pc := r.peerConnect(t)
				c.waitLine(t, "ready")
				if ev := pc.waitEvent(t); ev != client.Established {
					t.Fatalf("peer's connect: %v, want ESTABLISHED", ev)
				}
				remote := pc.remoteBuffer(t)
				w := r.peer.startWriter(pc.ep, pc.req, remote, 64<<10)
				w.waitCompleted(t, 64)
				killed := time.Now()
				if err := r.daemonB.Process.Kill(); err != nil {
					t.Fatal(err)
				}
				_ = r.daemonB.Wait()
				ev, d := pc.waitEnd(t, killed)
				w.stop()
				c.kill()
				if ev != client.Broken && ev != client.Disconnected {
					t.Fatalf("rep %d: the peer saw %v after B's daemon died, want BROKEN or DISCONNECTED", rep, ev)
				}
				pc.free()
				start := time.Now()
				r.startDaemonB(t)
				r.echo(t)
				t.Logf("%s #%d: peer saw %v %v after the kill; restarted daemon served a new process in %v",
					dp, rep, ev, rounded(d), rounded(time.Since(start)))
				peerSaw = append(peerSaw, d)
				restarted = append(restarted, time.Since(start))
			}
			checkKillMedian(t, dp+": daemon SIGKILL to the peer's disconnect", peerSaw)
			slices.Sort(restarted)
			t.Logf("%s: daemon restarted to a new process served: median %v", dp, rounded(restarted[len(restarted)/2]))
		})
	}
}

// TestKillVictim is the victim of the SIGKILL tests: the test binary run
// again with SOFTRNIC_KILL_VICTIM naming what to do. It prints "ready" when
// it has reached the phase it is to be killed in.
func TestKillVictim(t *testing.T) {
	mode := os.Getenv("SOFTRNIC_KILL_VICTIM")
	if mode == "" {
		t.Skip("the victim process of TestKilled*: runs only when they start it")
	}
	if err := runVictim(mode); err != nil {
		fmt.Fprintf(os.Stderr, "kill victim %s: %v\n", mode, err)
		os.Exit(1)
	}
	os.Exit(0)
}

// killReps is how many times each phase runs per datapath: the 1 s goal is
// checked on the median, so that one scheduling hiccup of a busy 2-core
// host does not fail the test, while a cause that holds the port for
// seconds always does.
const killReps = 3

const (
	// killGoal is the bound from SIGKILL to freed resources and
	// to the peer's event, checked on the median of the repetitions.
	killGoal = time.Second
	// killLimit bounds every single wait: beyond it something holds on
	// for a timeout (the 5 s close timeout, the 10 s MPA timeout).
	killLimit = 4 * time.Second
	// killPortB is the victim's port on B; killPortA the peer's on A.
	killPortB = 19411
	killPortA = 19412
	// killBuf is each application's registered buffer.
	killBuf = 4 << 20
)

// killPhase is one moment to kill the victim at: the victim runs mode and
// prints "ready" once in the phase. With connect the peer connects to the
// victim's port first, its buffer in the private data; port says the
// victim listened on killPortB, which must come back.
type killPhase struct {
	name          string
	mode          string
	connect, port bool
}

var killPhases = []killPhase{
	// A PSP and nothing else.
	{name: "listening", mode: "listen", port: true},
	// The victim connects to the peer, which holds the request
	// unanswered; after the kill the peer accepts and must learn at
	// once that the initiator is gone.
	{name: "connecting", mode: "connect"},
	// The peer connects; the victim holds the connection request
	// unanswered (a CR pending): the peer's connect must fail at once.
	{name: "accepting", mode: "accept", connect: true, port: true},
	// The victim RDMA-Writes into the peer's memory.
	{name: "mid-write", mode: "write", connect: true, port: true},
	// The peer RDMA-Writes into the victim's memory (softrnic-perf
	// write_bw's server, the report).
	{name: "write-target", mode: "target", connect: true, port: true},
	// The victim has RDMA Reads of the peer's memory outstanding: read
	// responses are being placed in its LMR.
	{name: "reads-outstanding", mode: "read", connect: true, port: true},
	// The victim has asked for a graceful disconnect behind a queue of
	// Writes.
	{name: "disconnecting", mode: "disconnect", connect: true, port: true},
}

// killRig is two hosts with a daemon each, the peer application on A and
// the observer on B.
type killRig struct {
	net          *topology.Pair
	dir          string
	sockA, sockB string
	args         []string
	daemonB      *exec.Cmd
	peer         *killApp
	obs          *killApp
	baseline     ctl.StatsReply
}

// killDatapaths are the datapaths the SIGKILL tests run on: both daemons
// on the kernel datapath, then both on xdp. SOFTRNIC_KILL_DATAPATHS
// chooses others, e.g. "kernel/xdp,xdp/kernel" for mixed pairs (the
// victim's host B first, then the peer's A).
func killDatapaths() []string {
	if v := os.Getenv("SOFTRNIC_KILL_DATAPATHS"); v != "" {
		return strings.Split(v, ",")
	}
	return []string{"kernel", "xdp"}
}

func newKillRig(t *testing.T, datapath string) *killRig {
	t.Helper()
	r := &killRig{net: topology.NewTest(t, topology.Options{}), dir: t.TempDir()}
	build(t, r.dir)
	r.sockA, r.sockB = filepath.Join(r.dir, "a.sock"), filepath.Join(r.dir, "b.sock")
	// The datapath of B, the victim's host, and of A (the same, or
	// "B/A" for a mixed pair).
	dpB, dpA, mixed := strings.Cut(datapath, "/")
	if !mixed {
		dpA = dpB
	}
	var argsA []string
	// Each host's poller gets a CPU of its own, as in hack/demo.sh.
	if dpA == "xdp" {
		argsA = []string{"--datapath", "xdp", "--cpus", "0"}
	}
	if dpB == "xdp" {
		r.args = []string{"--datapath", "xdp", "--cpus", "1"}
	}
	startDaemon(t, r.dir, r.net.A, r.sockA, argsA...)
	r.startDaemonB(t)
	r.peer = openKillAppT(t, r.sockA, "peer")
	return r
}

// startDaemonB (re)starts B's daemon and the observer's session with it,
// and takes the counts a dead victim must leave behind.
func (r *killRig) startDaemonB(t *testing.T) {
	t.Helper()
	if r.obs != nil {
		r.obs.ia.Close()
	}
	r.daemonB = startDaemon(t, r.dir, r.net.B, r.sockB, r.args...)
	r.obs = openKillAppT(t, r.sockB, "observer")
	// The observer's session is B's only one once startDaemon's probe
	// connection has been seen to close.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		st, err := r.obs.ia.Stats()
		if err != nil {
			t.Fatal(err)
		}
		if r.baseline = st; st.Sessions == 1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("B's daemon has %d sessions, want the observer's alone", st.Sessions)
		}
	}
}

// killMeasure is what one kill took.
type killMeasure struct {
	objs, port, peer time.Duration
	peerEvent        client.ConnEvent
	// refused: how long a connect to the freed port took to fail.
	refused time.Duration
}

// killOnce runs the victim to the phase, kills it and measures.
func (r *killRig) killOnce(t *testing.T, ph killPhase) (m killMeasure) {
	t.Helper()
	var pcr *client.EVD
	if ph.mode == "connect" {
		// The peer listens on A and leaves the request pending.
		var err error
		if pcr, err = r.peer.ia.CreateEVD(client.EVDOptions{Depth: 8, Kind: client.CREvents}); err != nil {
			t.Fatal(err)
		}
		defer pcr.Free()
		psp, err := r.peer.ia.CreatePSP(killPortA, pcr, false)
		if err != nil {
			t.Fatalf("peer listens on A: %v", err)
		}
		defer psp.Free()
	}
	c := r.startVictim(t, ph.mode, "SOFTRNIC_SERVER="+fmt.Sprintf("%s:%d", r.net.A.Addr.Addr(), killPortA))
	defer c.kill()
	var pc *killPeer
	var w *killWriter
	var pending *client.CR
	switch {
	case ph.connect:
		c.waitLine(t, "listening")
		pc = r.peerConnect(t)
		defer pc.free()
		c.waitLine(t, "ready")
		if ph.mode != "accept" {
			if ev := pc.waitEvent(t); ev != client.Established {
				t.Fatalf("peer's connect: %v, want ESTABLISHED", ev)
			}
		}
		if ph.mode == "target" {
			w = r.peer.startWriter(pc.ep, pc.req, pc.remoteBuffer(t), 64<<10)
			defer w.stop()
			w.waitCompleted(t, 64)
		}
	case ph.mode == "connect":
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		ev, err := pcr.Wait(ctx)
		cancel()
		if err != nil || ev.CR == nil {
			t.Fatalf("the victim's connection request never reached the peer: %+v %v\n%s", ev, err, c.output())
		}
		pending = ev.CR
		c.waitLine(t, "ready")
	default:
		c.waitLine(t, "ready")
	}

	killed := c.kill()
	var wg sync.WaitGroup
	if pc != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m.peerEvent, m.peer = pc.waitEnd(t, killed)
		}()
	}
	m.objs, m.port = r.waitFreed(t, killed, ph.port)
	wg.Wait()
	if w != nil {
		w.stop()
	}
	switch {
	case pc == nil:
	case m.peerEvent == client.TimedOut:
		t.Errorf("the peer's connect timed out instead of failing at once")
	case ph.mode == "accept" && m.peerEvent == client.Established:
		t.Errorf("the peer's connect to a dead listener was established")
	}
	if pending != nil {
		// Now the peer accepts the dead initiator's request: the accept
		// fails, or the connection ends at once.
		pc := r.peer.acceptOn(t, pending)
		defer pc.free()
		start := time.Now()
		if pc.acceptErr != nil {
			m.peer, m.peerEvent = time.Since(start), client.NonPeerRejected
		} else {
			ev, d := pc.waitEnd(t, start)
			if ev != client.Broken && ev != client.Disconnected {
				t.Errorf("the peer accepted a dead initiator's request and saw %v, want BROKEN or DISCONNECTED", ev)
			}
			m.peer, m.peerEvent = d, ev
		}
	}
	if ph.port {
		// With the port free, a connect to it finds no listener and
		// fails at once (NON_PEER_REJECTED), on both datapaths.
		start := time.Now()
		pc := r.peerConnect(t)
		ev := pc.waitEvent(t)
		d := time.Since(start)
		pc.free()
		if ev != client.NonPeerRejected || d > killLimit {
			t.Errorf("connect to B's port with no listener: %v after %v, want NON_PEER_REJECTED at once", ev, rounded(d))
		}
		m.refused = d
	}
	return m
}

// waitFreed waits until B's counts are back to the baseline and, with
// port, until killPortB takes a new listener; it returns both times since
// the kill.
func (r *killRig) waitFreed(t *testing.T, killed time.Time, port bool) (objs, portAt time.Duration) {
	t.Helper()
	var last ctl.StatsReply
	var lastErr error
	for objs == 0 || (port && portAt == 0) {
		if port && portAt == 0 {
			psp, err := r.obs.ia.CreatePSP(killPortB, r.obs.cr, false)
			if err == nil {
				portAt = time.Since(killed)
				if err := psp.Free(); err != nil {
					t.Fatal(err)
				}
			} else {
				lastErr = err
			}
		}
		if objs == 0 {
			st, err := r.obs.ia.Stats()
			if err != nil {
				t.Fatal(err)
			}
			if killCounts(st) == killCounts(r.baseline) {
				objs = time.Since(killed)
			}
			last = st
		}
		if time.Since(killed) > killLimit {
			if objs == 0 {
				t.Errorf("%v after the kill B's daemon still holds the victim's objects: %+v, want %+v", rounded(killLimit), last, r.baseline)
			}
			if port && portAt == 0 {
				t.Errorf("%v after the kill B's port %d still takes no listener: %v", rounded(killLimit), killPortB, lastErr)
			}
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
	return
}

// echo checks that a process started now listens on the victim's port at
// once (its first CreatePSP must succeed) and moves data: the peer
// RDMA-Writes a pattern and Sends; the process checks the pattern and
// disconnects gracefully.
func (r *killRig) echo(t *testing.T) {
	t.Helper()
	c := r.startVictim(t, "echo")
	defer c.kill()
	c.waitLine(t, "listening")
	pc := r.peerConnect(t)
	defer pc.free()
	if ev := pc.waitEvent(t); ev != client.Established {
		t.Fatalf("restarted process: peer's connect %v\n%s", ev, c.output())
	}
	remote := pc.remoteBuffer(t)
	fillKillPattern(r.peer.buf.Bytes[:killEchoLen], byte(time.Now().UnixNano()))
	if err := pc.ep.PostWrite(1, []client.Segment{{LMR: r.peer.lmr, Length: killEchoLen}}, remote, client.Signaled); err != nil {
		t.Fatal(err)
	}
	if err := pc.ep.PostSend(2, []client.Segment{{LMR: r.peer.lmr, Length: 8}}, client.Signaled); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		ev, err := pc.req.Wait(ctx)
		cancel()
		if err != nil || ev.Status != completion.Success {
			t.Fatalf("restarted process: peer's Write or Send: %+v %v\n%s", ev, err, c.output())
		}
	}
	c.waitLine(t, "ok")
	if err := c.wait(10 * time.Second); err != nil {
		t.Fatalf("restarted process: %v\n%s", err, c.output())
	}
	if ev, _ := pc.waitEnd(t, time.Now()); ev != client.Disconnected {
		t.Errorf("restarted process disconnected gracefully, the peer saw %v", ev)
	}
}

const killEchoLen = 64 << 10

// killCounts are the object counts of a Stats reply.
func killCounts(st ctl.StatsReply) [7]uint32 {
	return [7]uint32{st.Sessions, st.PZ, st.LMR, st.EVD, st.EP, st.PSP, st.CR}
}

// checkKillMedian fails the test when the median of ds is above killGoal, and
// logs the distribution.
func checkKillMedian(t *testing.T, what string, ds []time.Duration) {
	t.Helper()
	if len(ds) == 0 {
		return
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	med := s[len(s)/2]
	t.Logf("%s: median %v, min %v, max %v over %d", what, rounded(med), rounded(s[0]), rounded(s[len(s)-1]), len(s))
	if med > killGoal {
		t.Errorf("%s: median %v, above the goal of %v", what, rounded(med), killGoal)
	}
}

func rounded(d time.Duration) time.Duration { return d.Round(100 * time.Microsecond) }

// victim is a process started by startVictim.
type victim struct {
	cmd    *exec.Cmd
	lines  chan string
	out    *killOutput
	done   chan error
	exited error
	killed bool
}

type killOutput struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *killOutput) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *killOutput) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startVictim runs the test binary as a victim in mode, on B's daemon.
func (r *killRig) startVictim(t *testing.T, mode string, env ...string) *victim {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestKillVictim$", "-test.count=1")
	cmd.Env = append(append(os.Environ(), "SOFTRNIC_KILL_VICTIM="+mode, "SOFTRNIC_SOCKET="+r.sockB,
		"SOFTRNIC_PORT="+strconv.Itoa(killPortB)), env...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	c := &victim{cmd: cmd, lines: make(chan string, 16), out: &killOutput{}, done: make(chan error, 1)}
	cmd.Stderr = c.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			c.out.Write([]byte(sc.Text() + "\n"))
			c.lines <- sc.Text()
		}
		close(c.lines)
		c.done <- cmd.Wait()
	}()
	return c
}

// waitLine waits for the victim to print want.
func (c *victim) waitLine(t *testing.T, want string) {
	t.Helper()
	timeout := time.After(20 * time.Second)
	for {
		select {
		case l, ok := <-c.lines:
			if !ok {
				t.Fatalf("the victim ended before printing %q:\n%s", want, c.output())
			}
			if strings.TrimSpace(l) == want {
				return
			}
		case <-timeout:
			// Its goroutines' stacks say where it waits.
			_ = c.cmd.Process.Signal(syscall.SIGQUIT)
			_ = c.wait(5 * time.Second)
			t.Fatalf("the victim did not print %q within 20 s:\n%s", want, c.output())
		}
	}
}

func (c *victim) output() string { return c.out.String() }

// kill sends SIGKILL (once) and waits for the process to be gone; it
// returns when the signal was sent.
func (c *victim) kill() time.Time {
	if c.killed {
		return time.Time{}
	}
	c.killed = true
	at := time.Now()
	_ = c.cmd.Process.Signal(syscall.SIGKILL)
	_ = c.wait(10 * time.Second)
	return at
}

// wait waits for the process to end and returns how it ended.
func (c *victim) wait(timeout time.Duration) error {
	if c.done == nil {
		return c.exited
	}
	limit := time.After(timeout)
	lines := c.lines
	for {
		select {
		case _, ok := <-lines: // drained, so that the reader can finish
			if !ok {
				lines = nil
			}
		case c.exited = <-c.done:
			c.done = nil
			return c.exited
		case <-limit:
			return fmt.Errorf("still running after %v", timeout)
		}
	}
}

// killApp is an application's resources: one buffer registered for every
// access, and EVDs for requests and connection events.
type killApp struct {
	ia  *client.IA
	pz  *client.PZ
	buf *client.Buffer
	lmr *client.LMR
	cr  *client.EVD
}

func openKillApp(sock, name string) (*killApp, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ia, err := client.Open(ctx, client.Options{Socket: sock, Name: name})
	if err != nil {
		return nil, err
	}
	a := &killApp{ia: ia}
	err = func() error {
		if a.pz, err = ia.CreatePZ(); err != nil {
			return err
		}
		if a.buf, err = ia.Alloc(killBuf); err != nil {
			return err
		}
		if a.lmr, err = a.pz.RegisterLMR(a.buf, client.LocalWrite|client.RemoteWrite|client.RemoteRead); err != nil {
			return err
		}
		a.cr, err = ia.CreateEVD(client.EVDOptions{Depth: 8, Kind: client.CREvents})
		return err
	}()
	if err != nil {
		ia.Close()
		return nil, err
	}
	return a, nil
}

func openKillAppT(t *testing.T, sock, name string) *killApp {
	t.Helper()
	a, err := openKillApp(sock, name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.ia.Close() })
	return a
}

// killConn is an EP with EVDs of its own, so that nothing of an earlier one is
// left to read.
type killConn struct {
	a              *killApp
	ep             *client.EP
	recv, req, cev *client.EVD
}

func (a *killApp) newConn() (*killConn, error) {
	c := &killConn{a: a}
	var err error
	if c.recv, err = a.ia.CreateEVD(client.EVDOptions{Depth: 256, Kind: client.DTOEvents}); err != nil {
		return nil, err
	}
	if c.req, err = a.ia.CreateEVD(client.EVDOptions{Depth: 256, Kind: client.DTOEvents}); err != nil {
		return nil, err
	}
	if c.cev, err = a.ia.CreateEVD(client.EVDOptions{Depth: 8, Kind: client.ConnectionEvents}); err != nil {
		return nil, err
	}
	// Peer-to-peer (RFC 6581): the passive side may send first (the
	// victim's Writes and Reads), which plain MPA forbids until the
	// initiator has.
	c.ep, err = a.ia.CreateEP(client.EPAttr{PZ: a.pz, RecvEVD: c.recv, RequestEVD: c.req, ConnectEVD: c.cev,
		SQDepth: 64, RQDepth: 16, IRD: 8, ORD: 8, PeerToPeer: true})
	return c, err
}

// free frees the EP and its EVDs (best effort: the daemon may be gone).
func (c *killConn) free() {
	if c.ep != nil {
		_ = c.ep.Free()
	}
	for _, e := range []*client.EVD{c.recv, c.req, c.cev} {
		if e != nil {
			_ = e.Free()
		}
	}
}

// waitConnEvent waits for the next connection event of c's EP.
func (c *killConn) waitConnEvent(ctx context.Context) (client.ConnEvent, error) {
	for {
		ev, err := c.cev.Wait(ctx)
		if err != nil {
			return 0, err
		}
		if ev.Type == client.ConnectionEvent {
			return ev.Conn, nil
		}
	}
}

// killPeer is the peer's side of one connection.
type killPeer struct {
	*killConn
	acceptErr error
}

// connect connects a new EP of the peer to addr with its buffer in the
// private data.
func (a *killApp) connect(t *testing.T, addr string) *killPeer {
	t.Helper()
	c, err := a.newConn()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.ep.Connect(addr, encodeKillBuffer(a.lmr), 30*time.Second); err != nil {
		c.free()
		t.Fatal(err)
	}
	return &killPeer{killConn: c}
}

// acceptOn accepts cr on a new EP of the peer.
func (a *killApp) acceptOn(t *testing.T, cr *client.CR) *killPeer {
	t.Helper()
	c, err := a.newConn()
	if err != nil {
		t.Fatal(err)
	}
	return &killPeer{killConn: c, acceptErr: cr.Accept(c.ep, encodeKillBuffer(a.lmr))}
}

// waitEvent waits for the next connection event of the peer's EP.
func (pc *killPeer) waitEvent(t *testing.T) client.ConnEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	ev, err := pc.waitConnEvent(ctx)
	if err != nil {
		t.Fatalf("peer's connection event: %v", err)
	}
	return ev
}

// waitEnd waits up to killLimit past since for the connection to end (or
// the connect to fail): the event other than ESTABLISHED, and when it came.
func (pc *killPeer) waitEnd(t *testing.T, since time.Time) (client.ConnEvent, time.Duration) {
	ctx, cancel := context.WithDeadline(context.Background(), since.Add(killLimit))
	defer cancel()
	for {
		ev, err := pc.waitConnEvent(ctx)
		if err != nil {
			t.Errorf("%v after the kill the peer has seen no end of its connection: %v", rounded(killLimit), err)
			return 0, 0
		}
		if ev != client.Established {
			return ev, time.Since(since)
		}
	}
}

// remoteBuffer is the buffer the other side advertised in its private
// data (the accept's, for an active connection).
func (pc *killPeer) remoteBuffer(t *testing.T) client.RemoteBuffer {
	t.Helper()
	info, err := pc.ep.Query()
	if err != nil {
		t.Fatal(err)
	}
	rb, err := decodeKillBuffer(info.PrivateData)
	if err != nil {
		t.Fatal(err)
	}
	return rb
}

func encodeKillBuffer(l *client.LMR) []byte {
	b := make([]byte, 12)
	binary.BigEndian.PutUint32(b, l.Context)
	binary.BigEndian.PutUint64(b[4:], l.Address(0))
	return b
}

func decodeKillBuffer(b []byte) (client.RemoteBuffer, error) {
	if len(b) < 12 {
		return client.RemoteBuffer{}, fmt.Errorf("private data %x: no buffer in it", b)
	}
	return client.RemoteBuffer{Context: binary.BigEndian.Uint32(b), Address: binary.BigEndian.Uint64(b[4:])}, nil
}

// killWriter RDMA-Writes size octets at a time to a remote buffer, keeping the
// send queue full, until stopped or a completion fails.
type killWriter struct {
	cancel    context.CancelFunc
	done      chan struct{}
	mu        sync.Mutex
	completed int
	err       error
}

func (a *killApp) startWriter(ep *client.EP, req *client.EVD, to client.RemoteBuffer, size int) *killWriter {
	ctx, cancel := context.WithCancel(context.Background())
	w := &killWriter{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		err := killWriteLoop(ctx, a, ep, req, to, size, func() {
			w.mu.Lock()
			w.completed++
			w.mu.Unlock()
		})
		w.mu.Lock()
		w.err = err
		w.mu.Unlock()
	}()
	return w
}

// killWriteLoop is the writer's body, shared with the victim.
func killWriteLoop(ctx context.Context, a *killApp, ep *client.EP, req *client.EVD, to client.RemoteBuffer, size int, completed func()) error {
	for i := uint64(0); ctx.Err() == nil; i++ {
		off := (i * uint64(size)) % (killBuf - uint64(size))
		err := ep.PostWrite(i, []client.Segment{{LMR: a.lmr, Offset: off, Length: uint32(size)}},
			client.RemoteBuffer{Context: to.Context, Address: to.Address + off}, client.Signaled)
		if errors.Is(err, client.ErrQueueFull) {
			ev, err := req.Wait(ctx)
			if err != nil {
				return err
			}
			if ev.Status != completion.Success {
				return fmt.Errorf("write completion: %v", ev.Status)
			}
			completed()
			continue
		}
		if err != nil {
			return err
		}
	}
	return ctx.Err()
}

// waitCompleted waits until n Writes have completed.
func (w *killWriter) waitCompleted(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		w.mu.Lock()
		c, err := w.completed, w.err
		w.mu.Unlock()
		if c >= n {
			return
		}
		if err != nil {
			t.Fatalf("writer: %v after %d completions", err, c)
		}
		if time.Now().After(deadline) {
			t.Fatalf("writer: %d completions in 20 s", c)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (w *killWriter) stop() {
	w.cancel()
	<-w.done
}

// peerConnect starts the peer's connect to the victim's port on B.
func (r *killRig) peerConnect(t *testing.T) *killPeer {
	t.Helper()
	return r.peer.connect(t, fmt.Sprintf("%s:%d", r.net.B.Addr.Addr(), killPortB))
}

// runVictim is the victim process's body.
func runVictim(mode string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	a, err := openKillApp(os.Getenv("SOFTRNIC_SOCKET"), "kill-victim-"+mode)
	if err != nil {
		return err
	}
	port, _ := strconv.Atoi(os.Getenv("SOFTRNIC_PORT"))
	say := func(s string) { fmt.Println(s) }
	waitConn := func(c *killConn, want client.ConnEvent) error {
		ev, err := c.waitConnEvent(ctx)
		if err == nil && ev != want {
			err = fmt.Errorf("connection event %v, want %v", ev, want)
		}
		return err
	}
	if mode == "write-stalled" {
		// Connect to a peer that accepts and never reads, and write
		// until no completion comes for 300 ms.
		c, err := a.newConn()
		if err != nil {
			return err
		}
		if err := c.ep.Connect(os.Getenv("SOFTRNIC_SERVER"), nil, 30*time.Second); err != nil {
			return err
		}
		if err := waitConn(c, client.Established); err != nil {
			return err
		}
		said := false
		for i := uint64(0); ctx.Err() == nil; i++ {
			err := c.ep.PostWrite(i, []client.Segment{{LMR: a.lmr, Length: 256 << 10}}, client.RemoteBuffer{Context: 0x100, Address: 0}, client.Signaled)
			if !errors.Is(err, client.ErrQueueFull) {
				if err != nil {
					return err
				}
				continue
			}
			wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			ev, err := c.req.Wait(wctx)
			cancel()
			if err != nil && !said {
				said = true
				say("ready")
			}
			if err == nil && ev.Status != completion.Success {
				return fmt.Errorf("write completion: %v", ev.Status)
			}
		}
		return nil
	}
	if mode == "connect" {
		c, err := a.newConn()
		if err != nil {
			return err
		}
		if err := c.ep.Connect(os.Getenv("SOFTRNIC_SERVER"), nil, 30*time.Second); err != nil {
			return err
		}
		say("ready")
		<-ctx.Done()
		return nil
	}
	// Every other mode listens first, on the first try: a process
	// started after a dead one must find the port free.
	if _, err := a.ia.CreatePSP(uint16(port), a.cr, false); err != nil {
		return fmt.Errorf("listen at once: %w", err)
	}
	if mode == "listen" {
		say("ready")
		<-ctx.Done()
		return nil
	}
	say("listening")
	c, err := a.newConn()
	if err != nil {
		return err
	}
	if mode == "echo" {
		if err := c.ep.PostRecv(1, []client.Segment{{LMR: a.lmr, Offset: killBuf - 64, Length: 64}}); err != nil {
			return err
		}
	}
	ev, err := a.cr.Wait(ctx)
	if err != nil {
		return err
	}
	if mode == "accept" {
		say("ready")
		<-ctx.Done()
		return nil
	}
	info, err := ev.CR.Query()
	if err != nil {
		return err
	}
	remote, err := decodeKillBuffer(info.PrivateData)
	if err != nil {
		return err
	}
	if err := ev.CR.Accept(c.ep, encodeKillBuffer(a.lmr)); err != nil {
		return err
	}
	if err := waitConn(c, client.Established); err != nil {
		return err
	}
	switch mode {
	case "target":
		say("ready")
		<-ctx.Done()
		return nil
	case "write":
		n := 0
		return killWriteLoop(ctx, a, c.ep, c.req, remote, 256<<10, func() {
			if n++; n == 32 {
				say("ready")
			}
		})
	case "read":
		// Reads of 512 KiB, the send queue kept full: IRD/ORD 8 are on
		// the wire at a time, the rest wait behind them.
		n := 0
		for i := uint64(0); ctx.Err() == nil; i++ {
			off := (i * (512 << 10)) % (killBuf - (512 << 10))
			err := c.ep.PostRead(i, client.Segment{LMR: a.lmr, Offset: off, Length: 512 << 10},
				client.RemoteBuffer{Context: remote.Context, Address: remote.Address + off}, client.Signaled)
			if errors.Is(err, client.ErrQueueFull) {
				ev, err := c.req.Wait(ctx)
				if err != nil {
					return err
				}
				if ev.Status != completion.Success {
					return fmt.Errorf("read completion: %v", ev.Status)
				}
				if n++; n == 16 {
					say("ready")
				}
				continue
			}
			if err != nil {
				return err
			}
		}
		return nil
	case "disconnect":
		for i := range 64 {
			off := uint64(i) * (64 << 10)
			if err := c.ep.PostWrite(uint64(i), []client.Segment{{LMR: a.lmr, Offset: off, Length: 64 << 10}},
				client.RemoteBuffer{Context: remote.Context, Address: remote.Address + off}, client.Signaled); err != nil {
				return err
			}
		}
		if err := c.ep.Disconnect(true); err != nil {
			return err
		}
		say("ready")
		<-ctx.Done()
		return nil
	case "echo":
		ev, err := c.recv.Wait(ctx)
		if err != nil {
			return err
		}
		if ev.Status != completion.Success {
			return fmt.Errorf("receive: %v", ev.Status)
		}
		if !checkKillPattern(a.buf.Bytes[:killEchoLen]) {
			return errors.New("the peer's Write did not arrive intact")
		}
		say("ok")
		if err := c.ep.Disconnect(true); err != nil {
			return err
		}
		return waitConn(c, client.Disconnected)
	}
	return fmt.Errorf("unknown mode %q", mode)
}

// fillKillPattern writes a pattern seeded by its first octet.
func fillKillPattern(b []byte, seed byte) {
	for i := range b {
		b[i] = seed + byte(i*7+i>>8)
	}
}

func checkKillPattern(b []byte) bool {
	want := make([]byte, len(b))
	fillKillPattern(want, b[0])
	return bytes.Equal(b, want)
}

// A victim killed while a peer misbehaves must not hold its objects either,
// and the peer's connection must end at once: a peer that connected to the
// victim's port and has not sent its MPA Request yet (silent); a server
// that took the victim's MPA Request and never answers it; a server that
// accepted it and then stopped reading (the victim's Writes fill the
// socket buffers). The peers are plain kernel TCP sockets on host A.
func TestKilledClientWithStalledPeer(t *testing.T) {
	for _, dp := range killDatapaths() {
		t.Run(dp, func(t *testing.T) {
			r := newKillRig(t, dp)
			var objsFreed, peerSaw []time.Duration
			for _, name := range []string{"silent-connection-at-listener", "server-not-answering", "peer-not-reading"} {
				// Each case stands alone: one that fails does not stop
				// the next.
				t.Run(name, func(t *testing.T) {
					for rep := range killReps {
						objs, peer := r.killWithRawPeer(t, name)
						t.Logf("%s %s #%d: objects freed %v, the raw peer's connection closed %v", dp, name, rep, rounded(objs), rounded(peer))
						objsFreed = append(objsFreed, objs)
						peerSaw = append(peerSaw, peer)
						if t.Failed() {
							return
						}
					}
					r.echo(t)
				})
			}
			checkKillMedian(t, dp+": SIGKILL to the dead client's objects freed", objsFreed)
			checkKillMedian(t, dp+": SIGKILL to the raw peer's connection closed", peerSaw)
		})
	}
}

// rawPeerHolds says, for each case of TestKilledClientWithStalledPeer, what
// keeps the raw peer's connection open when it stays open.
var rawPeerHolds = map[string]string{
	"silent-connection-at-listener": "the victim's listener closed, but not the connection waiting in it for its MPA Request (rnic Listener.Close)",
	"server-not-answering":          "the victim's connect, cancelled by the daemon, still waits for the MPA Reply (rnic QP.Connect)",
	"peer-not-reading":              "the aborted QP's transmit is still blocked on the peer's closed window (rnic QP.Disconnect)",
}

// killWithRawPeer runs one case of TestKilledClientWithStalledPeer.
func (r *killRig) killWithRawPeer(t *testing.T, name string) (objs, peer time.Duration) {
	t.Helper()
	var raw *net.TCPConn
	var c *victim
	port := false
	switch name {
	case "silent-connection-at-listener":
		c = r.startVictim(t, "listen")
		defer c.kill()
		c.waitLine(t, "ready")
		var err error
		raw, err = r.net.A.DialTCP(netip.AddrPortFrom(r.net.B.Addr.Addr(), killPortB), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		// B's listener takes the connection (a handshake ACK still in
		// flight would be reset by the listener's close, the easy case).
		time.Sleep(50 * time.Millisecond)
		port = true
	case "server-not-answering":
		ln, err := r.net.A.ListenTCP(netip.AddrPortFrom(r.net.A.Addr.Addr(), killPortA))
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		c = r.startVictim(t, "connect", "SOFTRNIC_SERVER="+fmt.Sprintf("%s:%d", r.net.A.Addr.Addr(), killPortA))
		defer c.kill()
		_ = ln.SetDeadline(time.Now().Add(10 * time.Second))
		if raw, err = ln.AcceptTCP(); err != nil {
			t.Fatalf("the victim never connected to the raw peer: %v\n%s", err, c.output())
		}
		// The victim waits for the MPA Reply, which never comes.
		readMPARequest(t, raw)
		c.waitLine(t, "ready")
	case "peer-not-reading":
		ln, err := r.net.A.ListenTCP(netip.AddrPortFrom(r.net.A.Addr.Addr(), killPortA))
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		c = r.startVictim(t, "write-stalled", "SOFTRNIC_SERVER="+fmt.Sprintf("%s:%d", r.net.A.Addr.Addr(), killPortA))
		defer c.kill()
		_ = ln.SetDeadline(time.Now().Add(10 * time.Second))
		if raw, err = ln.AcceptTCP(); err != nil {
			t.Fatalf("the victim never connected to the raw peer: %v\n%s", err, c.output())
		}
		acceptMPA(t, raw)
		// The victim writes until nothing completes for a while: the
		// socket buffers are full.
		c.waitLine(t, "ready")
	}
	defer raw.Close()
	// The peer learns without reading (reading would drain the buffers
	// and let a blocked write of the daemon go on): the kernel's state of
	// its socket leaves ESTABLISHED when B's FIN or RST arrives.
	killed := c.kill()
	ended := make(chan time.Duration, 1)
	go func() {
		for time.Since(killed) < killLimit {
			if st := tcpState(raw); st != unix.BPF_TCP_ESTABLISHED {
				ended <- time.Since(killed)
				return
			}
			time.Sleep(time.Millisecond)
		}
		ended <- 0
	}()
	objs, _ = r.waitFreed(t, killed, port)
	peer = <-ended
	if peer == 0 {
		t.Errorf("%v after the kill the raw peer's connection is still open: %s", rounded(killLimit), rawPeerHolds[name])
	}
	return objs, peer
}

// tcpState is the kernel's TCP state of c (unix.BPF_TCP_*).
func tcpState(c *net.TCPConn) uint8 {
	var st uint8
	rc, err := c.SyscallConn()
	if err != nil {
		return 0
	}
	_ = rc.Control(func(fd uintptr) {
		if info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO); err == nil {
			st = info.State
		}
	})
	return st
}

// acceptMPA reads an MPA Request on c and accepts it, as a responder that
// then never reads again would.
func acceptMPA(t *testing.T, c *net.TCPConn) {
	t.Helper()
	req := readMPARequest(t, c)
	cfg := mpa.Config{CRC: true, IRD: 8, ORD: 8}
	reply, _, err := cfg.Accept(&req)
	if err != nil {
		t.Fatalf("raw peer: accept: %v", err)
	}
	wire, err := reply.Append(nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write(wire); err != nil {
		t.Fatalf("raw peer: MPA Reply: %v", err)
	}
}

// readMPARequest reads the MPA Request that arrives on c.
func readMPARequest(t *testing.T, c *net.TCPConn) mpa.Frame {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	defer c.SetReadDeadline(time.Time{})
	buf := make([]byte, 0, mpa.FrameHeaderLen+mpa.MaxPrivateData)
	var req mpa.Frame
	for {
		n, err := c.Read(buf[len(buf):cap(buf)])
		if err != nil {
			t.Fatalf("raw peer: MPA Request: %v", err)
		}
		buf = buf[:len(buf)+n]
		f, _, err := mpa.ParseFrame(buf, false)
		if errors.Is(err, mpa.ErrShortFrame) {
			continue
		}
		if err != nil {
			t.Fatalf("raw peer: MPA Request: %v", err)
		}
		req = f
		break
	}
	return req
}
