package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/softrnic/softrnic/client"
	"github.com/softrnic/softrnic/daemon"
)

// TestMain lets the test binary run as softrnicd itself.
func TestMain(m *testing.M) {
	if os.Getenv("SOFTRNICD_TEST_MAIN") != "" {
		os.Args = append([]string{"softrnicd"}, strings.Fields(os.Getenv("SOFTRNICD_ARGS"))...)
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func run(t *testing.T, args string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "SOFTRNICD_TEST_MAIN=1", "SOFTRNICD_ARGS="+args)
	return cmd
}

func TestBadFlagsAndInterface(t *testing.T) {
	out, err := run(t, "").CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), "usage") {
		t.Fatalf("no --iface: %v %s", err, out)
	}
	out, err = run(t, "--iface nosuch0 --socket "+filepath.Join(t.TempDir(), "s")).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(out), "no such interface") {
		t.Fatalf("missing interface: %v %s", err, out)
	}
	out, err = run(t, "--iface lo --datapath xdp --socket "+filepath.Join(t.TempDir(), "s")).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "lo has no Ethernet address") {
		t.Fatalf("xdp on lo: %v %s", err, out)
	}
	out, err = run(t, "--iface lo --datapath xdp --xdp-mode fast --socket "+filepath.Join(t.TempDir(), "s")).CombinedOutput()
	if err == nil || !strings.Contains(string(out), `unknown XDP mode "fast"`) {
		t.Fatalf("bad --xdp-mode: %v %s", err, out)
	}
}

// SIGTERM: the daemon closes its connections gracefully (the peer sees
// DISCONNECTED, not BROKEN), removes its socket and exits 0.
func TestSIGTERMClosesGracefully(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "d.sock")
	cmd := run(t, "--iface lo --log-level info --socket "+sock)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	must(t, cmd.Start())
	defer cmd.Process.Kill()
	for i := 0; ; i++ {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		if i > 200 {
			t.Fatal("socket never appeared")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The peer: an in-process daemon with its own application.
	peerSock := filepath.Join(dir, "peer.sock")
	peer, err := daemon.New(daemon.Options{Iface: "lo", Socket: peerSock, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	must(t, err)
	go peer.Serve()
	defer peer.Close()

	ctx := context.Background()
	l, _ := net.Listen("tcp4", "127.0.0.1:0")
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	type side struct {
		ia              *client.IA
		pz              *client.PZ
		dto, conn, reqs *client.EVD
		ep              *client.EP
	}
	mk := func(path string) *side {
		s := &side{}
		var err error
		s.ia, err = client.Open(ctx, client.Options{Socket: path})
		must(t, err)
		s.pz, _ = s.ia.CreatePZ()
		s.dto, _ = s.ia.CreateEVD(client.EVDOptions{Depth: 16, Kind: client.DTOEvents})
		s.conn, _ = s.ia.CreateEVD(client.EVDOptions{Depth: 16, Kind: client.ConnectionEvents})
		s.reqs, _ = s.ia.CreateEVD(client.EVDOptions{Depth: 16, Kind: client.CREvents})
		s.ep, err = s.ia.CreateEP(client.EPAttr{PZ: s.pz, RecvEVD: s.dto, RequestEVD: s.dto, ConnectEVD: s.conn, SQDepth: 4, RQDepth: 4})
		must(t, err)
		return s
	}
	a, b := mk(sock), mk(peerSock)
	defer b.ia.Close()
	_, err = b.ia.CreatePSP(uint16(port), b.reqs, false)
	must(t, err)
	must(t, a.ep.Connect("127.0.0.1:"+strconv.Itoa(port), nil, 5*time.Second))
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	ev, err := b.reqs.Wait(wctx)
	must(t, err)
	must(t, ev.CR.Accept(b.ep, nil))
	if ev, err := b.conn.Wait(wctx); err != nil || ev.Conn != client.Established {
		t.Fatalf("%v %v", ev.Conn, err)
	}

	must(t, cmd.Process.Signal(syscall.SIGTERM))
	if ev, err := b.conn.Wait(wctx); err != nil || ev.Conn != client.Disconnected {
		t.Fatalf("peer after SIGTERM: %v %v", ev.Conn, err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("daemon exit: %v: %s", err, stderr.Bytes())
	}
	// The process exits only after Close has finished: sessions ended,
	// the device closed (on the xdp datapath: the interface's NAPI
	// setting restored, the program detached).
	if !bytes.Contains(stderr.Bytes(), []byte("softrnicd stopped")) {
		t.Errorf("the daemon exited before its Close finished; it said:\n%s", stderr.Bytes())
	}
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Fatalf("socket after SIGTERM: %v", err)
	}
}

// --stats prints the running daemon's statistics, the watchdog's stall
// count among them; against no daemon it fails with a message.
func TestStatsFlag(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "d.sock")
	srv, err := daemon.New(daemon.Options{Iface: "lo", Socket: sock, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	must(t, err)
	done := make(chan error, 1)
	go func() { done <- srv.Serve() }()
	defer func() { srv.Close(); <-done }()
	out, err := run(t, "--stats --socket "+sock).CombinedOutput()
	if err != nil {
		t.Fatalf("--stats: %v: %s", err, out)
	}
	for _, want := range []string{"sessions 1\n", "ep 0\n", "stalls 0\n"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("--stats printed %q, want a line %q", out, want)
		}
	}
	out, err = run(t, "--stats --socket "+filepath.Join(t.TempDir(), "none.sock")).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(out), "softrnicd --stats:") {
		t.Fatalf("--stats without a daemon: %v %s", err, out)
	}
}
