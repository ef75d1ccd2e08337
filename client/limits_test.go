package client_test

import (
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/client"
	"github.com/softrnic/softrnic/ctl"
	"github.com/softrnic/softrnic/daemon"
)

// An EP's rings cost neither side a descriptor: they are blocks of the
// session's region, and EPs share their vector's ready queue and its
// doorbell. Hundreds of EPs, then all freed, leave the count where it was
// after the first (which made the queue).
func TestEPsCostNoDescriptors(t *testing.T) {
	sock, _ := startDaemon(t)
	a := newApp(t, sock, "fds")
	first := a.ep(t)
	before := openFDs(t)
	var eps []*client.EP
	for range 300 {
		eps = append(eps, a.ep(t))
	}
	if after := openFDs(t); after > before+2 {
		t.Fatalf("300 EPs took %d descriptors (daemon and client together)", after-before)
	}
	for _, e := range append(eps, first) {
		must(t, e.Free())
	}
	if after := openFDs(t); after > before+2 {
		t.Fatalf("%d descriptors more after freeing every EP", after-before)
	}
}

// At the descriptor limit a connect fails at once with
// INSUFFICIENT_RESOURCES naming the limit, the daemon logs it, and nothing
// reaches the peer; once descriptors are free again the same EP connects.
func TestConnectAtTheDescriptorLimit(t *testing.T) {
	dir := t.TempDir()
	logFile, err := os.Create(filepath.Join(dir, "softrnicd.log"))
	must(t, err)
	defer logFile.Close()
	logged := func() string { b, _ := os.ReadFile(logFile.Name()); return string(b) }
	sock := filepath.Join(dir, "lo.sock")
	srv, err := daemon.New(daemon.Options{Iface: "lo", Socket: sock, Logger: slog.New(slog.NewTextHandler(logFile, nil))})
	must(t, err)
	done := make(chan error, 1)
	go func() { done <- srv.Serve() }()
	t.Cleanup(func() { srv.Close(); <-done })
	port := freePort(t)
	server, cli := newApp(t, sock, "server"), newApp(t, sock, "client")
	_, err = server.ia.CreatePSP(port, server.cr, false)
	must(t, err)
	cep := cli.ep(t)
	addr := net.JoinHostPort("127.0.0.1", itoa(port))

	// RLIMIT_NOFILE bounds descriptor numbers: with the soft limit at
	// the lowest free one, no descriptor can be opened.
	var lim unix.Rlimit
	must(t, unix.Getrlimit(unix.RLIMIT_NOFILE, &lim))
	runtime.GC() // files earlier tests dropped close now, not midway
	runtime.GC()
	f, err := os.Open(os.DevNull)
	must(t, err)
	lowest := f.Fd()
	f.Close()
	low := lim
	low.Cur = uint64(lowest)
	must(t, unix.Setrlimit(unix.RLIMIT_NOFILE, &low))
	// A descriptor below the limit freed since (a finalizer closing a
	// dropped file) is taken here, so that the daemon finds none.
	var held []*os.File
	for {
		f, err := os.Open(os.DevNull)
		if err != nil {
			break
		}
		held = append(held, f)
	}
	err = cep.Connect(addr, nil, 10*time.Second)
	for _, f := range held {
		f.Close()
	}
	must(t, unix.Setrlimit(unix.RLIMIT_NOFILE, &lim))
	var ce *ctl.Error
	if !errors.As(err, &ce) || ce.Status != ctl.InsufficientResources || !strings.Contains(ce.Message, "RLIMIT_NOFILE") {
		t.Fatalf("connect at the descriptor limit: %v, want INSUFFICIENT_RESOURCES naming RLIMIT_NOFILE", err)
	}
	if log := logged(); !strings.Contains(log, "out of resources") || !strings.Contains(log, "RLIMIT_NOFILE") {
		t.Fatalf("the daemon did not log the limit:\n%s", log)
	}
	if st, _ := cep.State(); st != client.Unconnected {
		t.Fatalf("EP in %v after a refused connect", st)
	}

	must(t, cep.Connect(addr, nil, 10*time.Second))
	ev := wait(t, server.cr)
	if ev.Type != client.ConnectionRequest {
		t.Fatalf("server got %+v", ev)
	}
	must(t, ev.CR.Accept(server.ep(t), nil))
	if ev := wait(t, cli.conn); ev.Conn != client.Established {
		t.Fatalf("client: %+v", ev)
	}
}
