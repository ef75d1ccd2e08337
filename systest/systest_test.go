// Package systest runs the built binaries as a user would: daemons in two
// network namespaces and application processes talking through them.
package systest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	stdnet "net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/softrnic/softrnic/internal/capture"
	"github.com/softrnic/softrnic/internal/pcap"
	"github.com/softrnic/softrnic/internal/testenv"
	"github.com/softrnic/softrnic/internal/topology"
)

// build compiles the commands into dir.
func build(t *testing.T, dir string) {
	t.Helper()
	gobin := testenv.RequireTool(t, "go")
	cmd := exec.Command(gobin, "build", "-o", dir+"/", "github.com/softrnic/softrnic/cmd/softrnicd", "github.com/softrnic/softrnic/cmd/softrnic-example",
		"github.com/softrnic/softrnic/cmd/softrnic-perf")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
}

// TestTwoHostsSeveralApplications: a softrnicd in each of two namespaces,
// four client processes on one host and four servers on the other, running
// at once; each pair moves 128 MiB by RDMA Write (verified by SHA-256 at the
// server) and 128 MiB back by RDMA Read (compared at the client), plus
// Sends: 1 GiB of mixed traffic in all.
func TestTwoHostsSeveralApplications(t *testing.T) {
	twoHosts(t, topology.Options{}, [2][]string{nil, nil})
}

// The same on the accelerated datapath: softrnicd --datapath xdp against
// itself and against softrnicd on the kernel's TCP, in both XDP modes,
// on veth with one receive queue and with two, on a clean link and on one
// that loses, reorders and duplicates segments (in process, as tc-netem
// would: this kernel has no sch_netem).
func TestTwoHostsXDP(t *testing.T) {
	testenv.RequireRoot(t)
	xdp := func(mode string) []string { return []string{"--datapath", "xdp", "--xdp-mode", mode} }
	for _, mode := range []string{"generic", "native"} {
		for _, queues := range []int{1, 2} {
			for _, peer := range []string{"xdp", "kernel"} {
				for _, impaired := range []bool{false, true} {
					// The lossy link in two of the four
					// mode and queue combinations: each
					// lossy xdp-xdp run takes 45 s.
					if impaired && (mode == "generic") != (queues == 1) {
						continue
					}
					name := fmt.Sprintf("%s-%dq-xdp-%s", mode, queues, peer)
					if impaired {
						name += "-lossy"
					}
					t.Run(name, func(t *testing.T) {
						args := [2][]string{xdp(mode), xdp(mode)}
						if peer == "kernel" {
							args[1] = nil
						}
						if impaired {
							// Each xdp daemon degrades both
							// directions of its link, so against
							// the kernel every segment crosses one
							// impaired hop, and between two xdp
							// daemons two.
							for i := range args {
								if args[i] != nil {
									args[i] = append(args[i], "--impair", fmt.Sprintf("loss=0.2%%,reorder=0.2%%,duplicate=0.1%%,seed=%d", i+1))
								}
							}
						}
						twoHosts(t, topology.Options{Queues: queues}, args)
					})
				}
			}
		}
	}
}

// twoHosts runs the daemons with the given extra arguments (A's, B's) and
// the applications between them.
func twoHosts(t *testing.T, opts topology.Options, args [2][]string) {
	net := topology.NewTest(t, opts)
	dir := t.TempDir()
	build(t, dir)
	sockA, sockB := filepath.Join(dir, "a.sock"), filepath.Join(dir, "b.sock")
	daemons := []*exec.Cmd{startDaemon(t, dir, net.A, sockA, args[0]...), startDaemon(t, dir, net.B, sockB, args[1]...)}

	const pairs = 4
	const size = 128 << 20
	var wg sync.WaitGroup
	outs := make([]*bytes.Buffer, 2*pairs)
	errs := make([]error, 2*pairs)
	for i := 0; i < pairs; i++ {
		port := fmt.Sprint(24000 + i)
		srv := startServer(t, net.B.Command("timeout", "120", filepath.Join(dir, "softrnic-example"), "server", "--socket", sockB, "--port", port, "--size", fmt.Sprint(size)),
			"server: listening")
		outs[2*i] = &srv.out
		wg.Add(1)
		go func(i int) { defer wg.Done(); errs[2*i] = srv.Wait() }(i)
	}
	start := time.Now()
	for i := 0; i < pairs; i++ {
		cli := net.A.Command("timeout", "120", filepath.Join(dir, "softrnic-example"), "client", "--socket", sockA,
			"--server", fmt.Sprintf("%s:%d", net.B.Addr.Addr(), 24000+i), "--size", fmt.Sprint(size))
		outs[2*i+1] = new(bytes.Buffer)
		cli.Stdout, cli.Stderr = outs[2*i+1], outs[2*i+1]
		if err := cli.Start(); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func(i int) { defer wg.Done(); errs[2*i+1] = cli.Wait() }(i)
	}
	// Pairs still running after dumpAfter (the slowest, lossy, runs take
	// about 45 s; the applications give up at 60): both daemons log the
	// state of every QP (SIGUSR1), so that a connection that stopped says
	// where.
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	const dumpAfter = 50 * time.Second
	select {
	case <-finished:
	case <-time.After(dumpAfter):
		t.Logf("pairs still running after %v: the daemons dump their state", dumpAfter)
		for _, d := range daemons {
			_ = d.Process.Signal(syscall.SIGUSR1)
		}
		<-finished
	}
	elapsed := time.Since(start)
	for i := range outs {
		role := []string{"server", "client"}[i%2]
		if errs[i] != nil {
			t.Errorf("%s %d: %v\n%s", role, i/2, errs[i], outs[i].String())
			continue
		}
		want := "disconnected, done"
		if role == "client" && !strings.Contains(outs[i].String(), "identical to what was written") {
			t.Errorf("client %d did not verify its Read:\n%s", i/2, outs[i].String())
		}
		if role == "server" && !strings.Contains(outs[i].String(), "SHA-256 ok") {
			t.Errorf("server %d did not verify the Write:\n%s", i/2, outs[i].String())
		}
		if !strings.Contains(outs[i].String(), want) {
			t.Errorf("%s %d did not finish:\n%s", role, i/2, outs[i].String())
		}
	}
	t.Logf("%d pairs, %d MiB moved and verified in %v", pairs, pairs*2*size>>20, elapsed.Round(time.Millisecond))
	if args[0] != nil || args[1] != nil {
		everyOperation(t, net, dir, sockA, sockB)
	}
}

// everyOperation runs the operations the example pair does not, verified,
// with softrnic-perf between the two daemons: Fetch-and-Add (each result
// checked), Sends (each checked by the server) and Reads (compared).
func everyOperation(t *testing.T, net *topology.Pair, dir, sockA, sockB string) {
	t.Helper()
	for i, tc := range [][]string{
		{"atomic_lat", "-n", "2000"},
		{"send_bw", "-s", "1024", "-n", "20000"},
		{"send_lat", "-s", "64", "-n", "1000"},
		{"read_bw", "-s", "65536", "-n", "500"},
	} {
		port := fmt.Sprint(19100 + i)
		args := append(append([]string{filepath.Join(dir, "softrnic-perf")}, tc...), "--verify", "-p", port, "--timeout", "60s")
		srv := startServer(t, net.B.Command("timeout", append([]string{"90"}, append(args, "--socket", sockB)...)...), perfReady)
		cli := net.A.Command("timeout", append([]string{"90"}, append(args, "--socket", sockA, net.B.Addr.Addr().String())...)...)
		cout, err := cli.CombinedOutput()
		if err != nil {
			t.Errorf("%s: client: %v\n%s", tc[0], err, cout)
		}
		if err := srv.Wait(); err != nil {
			t.Errorf("%s: server: %v\n%s", tc[0], err, srv.out.String())
		}
	}
}

// startDaemon runs softrnicd on a host and waits for its socket.
func startDaemon(t *testing.T, dir string, h topology.Host, sock string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := h.Command(filepath.Join(dir, "softrnicd"), append([]string{"--iface", h.Link, "--socket", sock, "--log-level", "warn"}, args...)...)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	// The socket file may be a dead daemon's: wait until one answers.
	for i := 0; ; i++ {
		c, err := stdnet.Dial("unixpacket", sock)
		if err == nil {
			c.Close()
			return cmd
		}
		if i == 500 {
			t.Fatalf("softrnicd never answered on %s: %v", sock, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// perfReady is the line a softrnic-perf server prints once it listens.
const perfReady = "Waiting for client to connect"

// server is a server process started by startServer.
type server struct {
	cmd *exec.Cmd
	// out has its standard output and error, all of them once Wait
	// has returned.
	out    bytes.Buffer
	copied chan struct{}
}

// startServer starts cmd, a server, and returns once it has printed a line
// containing ready (it does once it listens), so that a client started
// next finds it. It fails the test if the server ends first, and kills the
// server when the test ends if it still runs.
func startServer(t *testing.T, cmd *exec.Cmd, ready string) *server {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = w, w
	err = cmd.Start()
	w.Close()
	if err != nil {
		r.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	s := &server{cmd: cmd, copied: make(chan struct{})}
	br := bufio.NewReader(r)
	for {
		line, err := br.ReadString('\n')
		s.out.WriteString(line)
		if strings.Contains(line, ready) {
			break
		}
		if err != nil {
			r.Close()
			werr := cmd.Wait()
			t.Fatalf("%v ended before printing %q: %v\n%s", cmd.Args, ready, werr, s.out.String())
		}
	}
	go func() {
		defer close(s.copied)
		defer r.Close()
		_, _ = io.Copy(&s.out, br)
	}()
	return s
}

// Wait waits for the server to end and for the rest of its output.
func (s *server) Wait() error {
	err := s.cmd.Wait()
	<-s.copied
	return err
}

// xdpAttached reports whether an XDP program is attached to the host's link.
func xdpAttached(t *testing.T, h topology.Host) bool {
	out, err := h.Command("ip", "-d", "link", "show", "dev", h.Link).CombinedOutput()
	if err != nil {
		t.Fatalf("ip link: %v %s", err, out)
	}
	return strings.Contains(string(out), "prog/xdp")
}

// A SIGKILLed xdp daemon leaves nothing behind: its XDP program goes with
// it (a bpf_link), the kernel resets the connections it had, so the peer's
// application sees its connection broken at once rather than hanging, and a
// daemon started again on the same socket serves new connections.
func TestXDPDaemonKilled(t *testing.T) {
	net := topology.NewTest(t, topology.Options{})
	dir := t.TempDir()
	build(t, dir)
	sockA, sockB := filepath.Join(dir, "a.sock"), filepath.Join(dir, "b.sock")
	da := startDaemon(t, dir, net.A, sockA, "--datapath", "xdp")
	startDaemon(t, dir, net.B, sockB)
	if !xdpAttached(t, net.A) {
		t.Fatal("no XDP program on A's link while the daemon runs")
	}
	perf := func(h topology.Host, sock string, args ...string) *exec.Cmd {
		return h.Command("timeout", append([]string{"60", filepath.Join(dir, "softrnic-perf"), args[0], "--socket", sock}, args[1:]...)...)
	}
	// A long transfer from B to A: B keeps sending, so once A's daemon
	// has gone its segments reach A's kernel, which owns no such
	// connection and resets it.
	var cliOut bytes.Buffer
	srv := startServer(t, perf(net.A, sockA, "write_bw", "-s", "65536", "-D", "40s", "-p", "19001"), perfReady)
	cli := perf(net.B, sockB, "write_bw", "-s", "65536", "-D", "40s", "-p", "19001", net.A.Addr.Addr().String())
	cli.Stdout, cli.Stderr = &cliOut, &cliOut
	if err := cli.Start(); err != nil {
		t.Fatal(err)
	}
	cliDone := make(chan error, 1)
	go func() { cliDone <- cli.Wait() }()
	time.Sleep(2 * time.Second)
	select {
	case err := <-cliDone:
		t.Fatalf("the transfer ended before the kill: %v\n%s", err, cliOut.String())
	default:
	}
	killed := time.Now()
	if err := da.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = da.Wait()
	if xdpAttached(t, net.A) {
		t.Error("the XDP program outlived the daemon")
	}
	select {
	case err := <-cliDone:
		t.Logf("B's application ended %v after the kill: %v\n%s", time.Since(killed).Round(time.Millisecond), err, cliOut.String())
		if err == nil {
			t.Errorf("B's application reported success for a transfer cut short")
		}
		if time.Since(killed) > 15*time.Second {
			t.Errorf("B's application took %v to notice", time.Since(killed))
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("B's application still runs 20 s after A's daemon died:\n%s", cliOut.String())
	}
	// A's application, whose daemon died, is told so.
	srvDone := make(chan error, 1)
	go func() { srvDone <- srv.Wait() }()
	select {
	case err := <-srvDone:
		if err == nil || !strings.Contains(srv.out.String(), "softrnicd went away") {
			t.Errorf("A's application: %v\n%s", err, srv.out.String())
		}
	case <-time.After(10 * time.Second):
		t.Errorf("A's application still waits 10 s after its daemon died:\n%s", srv.out.String())
	}

	// Again, with a new daemon on A.
	startDaemon(t, dir, net.A, sockA, "--datapath", "xdp")
	srv2 := startServer(t, perf(net.A, sockA, "write_bw", "-s", "4096", "-n", "2000", "-p", "19002", "--verify"), perfReady)
	if out, err := perf(net.B, sockB, "write_bw", "-s", "4096", "-n", "2000", "-p", "19002", "--verify", net.A.Addr.Addr().String()).CombinedOutput(); err != nil {
		t.Fatalf("after the restart: %v\n%s", err, out)
	}
	if err := srv2.Wait(); err != nil {
		t.Fatalf("server after the restart: %v\n%s", err, srv2.out.String())
	}
}

// The xdp daemon's default NAPI mode on veth is adaptive: while a 64 KiB
// Write stream arrives (for 8 s, so that even on a loaded machine it
// passes 150,000 frames a second for long enough), the receiving host's
// interface runs its NAPI in a kernel thread; once the stream has stopped it goes back to softirq, and a
// daemon stopped by SIGTERM leaves the setting as it found it.
func TestXDPAdaptiveNAPI(t *testing.T) {
	net, dir, sockA, sockB, db := twoXDPDaemons(t)
	threaded := func() string {
		out, err := net.B.Command("cat", "/sys/class/net/"+net.B.Link+"/threaded").CombinedOutput()
		if err != nil {
			t.Fatalf("read threaded: %v %s", err, out)
		}
		return strings.TrimSpace(string(out))
	}
	if got := threaded(); got != "0" {
		t.Fatalf("B's NAPI threaded %q before any traffic", got)
	}
	perf := func(h topology.Host, sock string, args ...string) *exec.Cmd {
		return h.Command("timeout", append([]string{"60", filepath.Join(dir, "softrnic-perf"), "write_bw", "--socket", sock}, args...)...)
	}
	srv := startServer(t, perf(net.B, sockB, "-s", "65536", "-D", "8s", "-p", "19201"), perfReady)
	cli := perf(net.A, sockA, "-s", "65536", "-D", "8s", "-p", "19201", net.B.Addr.Addr().String())
	var cliOut bytes.Buffer
	cli.Stdout, cli.Stderr = &cliOut, &cliOut
	if err := cli.Start(); err != nil {
		t.Fatal(err)
	}
	cliDone := make(chan error, 1)
	go func() { cliDone <- cli.Wait() }()
	seen := false
	for !seen {
		select {
		case err := <-cliDone:
			t.Fatalf("the stream ended (%v) and B's NAPI was never threaded during it\n%s", err, cliOut.String())
		case <-time.After(20 * time.Millisecond):
			seen = threaded() == "1"
		}
	}
	if err := <-cliDone; err != nil {
		t.Fatalf("client: %v\n%s", err, cliOut.String())
	}
	if err := srv.Wait(); err != nil {
		t.Fatalf("server: %v\n%s", err, srv.out.String())
	}
	for deadline := time.Now().Add(10 * time.Second); threaded() != "0"; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("B's NAPI still threaded 10 s after the stream ended")
		}
	}
	// Threaded by hand, as an operator might: SIGTERM puts back what the
	// daemon found at start.
	if out, err := net.B.Command("sh", "-c", "echo 1 > /sys/class/net/"+net.B.Link+"/threaded").CombinedOutput(); err != nil {
		t.Fatalf("set threaded: %v %s", err, out)
	}
	if err := db.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := db.Wait(); err != nil {
		t.Fatalf("daemon B after SIGTERM: %v", err)
	}
	if got := threaded(); got != "0" {
		t.Errorf("after SIGTERM B's NAPI threaded is %q, want the 0 it had at start", got)
	}
}

// twoXDPDaemons builds the commands into a new directory and starts an xdp
// softrnicd on each host of a new pair; it returns the pair, the
// directory, the daemons' sockets and B's daemon.
func twoXDPDaemons(t *testing.T) (net *topology.Pair, dir, sockA, sockB string, db *exec.Cmd) {
	t.Helper()
	net = topology.NewTest(t, topology.Options{})
	dir = t.TempDir()
	build(t, dir)
	sockA, sockB = filepath.Join(dir, "a.sock"), filepath.Join(dir, "b.sock")
	startDaemon(t, dir, net.A, sockA, "--datapath", "xdp")
	db = startDaemon(t, dir, net.B, sockB, "--datapath", "xdp")
	return net, dir, sockA, sockB, db
}

// A server that exits as soon as its connection is Disconnected still
// completes the TCP close it owes: the client's FIN was answered with the
// server's, and if that one is lost, the server's daemon must send it again.
// Here the server's first FIN never reaches the client's host (a tc filter
// on A's link drops every FIN from the server's port until the server has
// exited); once the filter is gone, B's retransmission must reach A, and the
// connection ends in order on the wire: the server's FIN seen again, no RST
// from either side, the client disconnected well within the 5 s A's daemon
// waits for a peer's FIN before it resets the connection.
//
// Seen on the lossy link of TestTwoHostsXDP under load: the exiting
// server's QP was destroyed a millisecond after the client's FIN, Destroy
// aborted the connection, and a TCP ABORT in LAST-ACK deletes the
// connection and sends nothing (RFC 9293 §3.10.5), so the lost FIN was
// never sent again: A's daemon reset the connection after 5 s, or B's stack
// reset A's retransmitted FIN, and the client's disconnect ended BROKEN
// (since a335307 the daemon reports the disconnect the client asked for as
// DISCONNECTED whatever its end, so the wire is what tells). The client's
// host runs the kernel datapath so that the filter (tc ingress, before the
// kernel's TCP) sees B's segments; B runs the accelerated datapath.
func TestServerExitCompletesTheClose(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireTool(t, "tc")
	testenv.RequireTool(t, "tcpdump")
	net := topology.NewTest(t, topology.Options{})
	dir := t.TempDir()
	build(t, dir)
	sockA, sockB := filepath.Join(dir, "a.sock"), filepath.Join(dir, "b.sock")
	startDaemon(t, dir, net.A, sockA)
	startDaemon(t, dir, net.B, sockB, "--datapath", "xdp", "--xdp-mode", "native")

	const port = 24100
	run := func(name string, args ...string) string {
		t.Helper()
		out, err := net.A.Command(name, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	// What is redirected to a device that is down is dropped. The
	// server's segments carry no IP options (its engine sends none), so
	// TCP's flags are at offset 33. tcpdump sees the dropped FIN too: it
	// taps the link before tc ingress.
	run("ip", "link", "add", "sink0", "type", "veth", "peer", "name", "sink1")
	run("tc", "qdisc", "add", "dev", net.A.Link, "clsact")
	run("tc", "filter", "add", "dev", net.A.Link, "ingress", "protocol", "ip", "pref", "1", "u32",
		"match", "u8", "0x06", "0xff", "at", "9", // TCP
		"match", "u16", fmt.Sprint(port), "0xffff", "at", "20", // from the server's port
		"match", "u8", "0x01", "0x01", "at", "33", // FIN
		"action", "mirred", "egress", "redirect", "dev", "sink0")
	pcapPath := filepath.Join(dir, "close.pcap")
	cap, err := capture.Start(net.A, net.A.Link, fmt.Sprintf("tcp port %d", port), pcapPath)
	if err != nil {
		t.Fatal(err)
	}

	srv := startServer(t, net.B.Command("timeout", "60", filepath.Join(dir, "softrnic-example"), "server", "--socket", sockB,
		"--port", fmt.Sprint(port), "--size", fmt.Sprint(1<<20)), "server: listening")
	cli := net.A.Command("timeout", "60", filepath.Join(dir, "softrnic-example"), "client", "--socket", sockA,
		"--server", fmt.Sprintf("%s:%d", net.B.Addr.Addr(), port), "--size", fmt.Sprint(1<<20))
	var cliOut bytes.Buffer
	cli.Stdout, cli.Stderr = &cliOut, &cliOut
	if err := cli.Start(); err != nil {
		t.Fatal(err)
	}
	cliDone := make(chan error, 1)
	go func() { cliDone <- cli.Wait() }()
	if err := srv.Wait(); err != nil || !strings.Contains(srv.out.String(), "disconnected, done") {
		t.Fatalf("server: %v\n%s", err, srv.out.String())
	}
	exited := time.Now()
	stats := run("tc", "-s", "filter", "show", "dev", net.A.Link, "ingress")
	run("tc", "filter", "del", "dev", net.A.Link, "ingress", "pref", "1")
	dropped := 0
	if m := regexp.MustCompile(`Sent \d+ bytes (\d+) pkt`).FindStringSubmatch(stats); m != nil {
		dropped, _ = strconv.Atoi(m[1])
	}
	if dropped == 0 {
		t.Fatalf("the filter dropped no FIN from the server: the test did not exercise the loss\n%s", stats)
	}
	err = <-cliDone
	took := time.Since(exited)
	if err != nil || !strings.Contains(cliOut.String(), "disconnected, done") {
		t.Fatalf("client, %v after the server exited: %v\n%s", took.Round(time.Millisecond), err, cliOut.String())
	}
	if err := cap.Stop(); err != nil {
		t.Fatal(err)
	}
	serverFINs, resets := closeSegments(t, pcapPath, port)
	if serverFINs <= dropped || len(resets) > 0 {
		t.Errorf("the server sent its FIN %d times (%d dropped), resets %v: the close did not complete in order", serverFINs, dropped, resets)
	}
	if took > 4*time.Second {
		t.Errorf("the client was disconnected %v after the server exited: the server's FIN was not sent again", took.Round(time.Millisecond))
	}
	t.Logf("the server's FIN sent %d times, %d dropped; the client was disconnected %v after the server exited",
		serverFINs, dropped, took.Round(time.Millisecond))
}

// closeSegments reads a capture of one connection: how many segments from
// port carried a FIN, and the source of every RST.
func closeSegments(t *testing.T, path string, port uint16) (fins int, resets []string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rd, err := pcap.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	for {
		p, err := rd.Next()
		if errors.Is(err, io.EOF) {
			return fins, resets
		}
		if err != nil {
			t.Fatal(err)
		}
		seg, err := pcap.DecodeTCP(rd.LinkType, p)
		if err != nil {
			continue
		}
		if seg.Flags&pcap.FlagFIN != 0 && seg.Src.Port() == port {
			fins++
		}
		if seg.Flags&pcap.FlagRST != 0 {
			resets = append(resets, seg.Src.String())
		}
	}
}
