package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/softrnic/softrnic/client"
	"github.com/softrnic/softrnic/daemon"
	"github.com/softrnic/softrnic/internal/testenv"
)

// TestHostileConsumer runs testdata/hostile.c, a DAT program that hands
// the provider freed handles, handles of another IA, calls in the wrong EP
// state, oversized posts and memory it does not own, through libdat2 and
// the provider built as make build builds it, against a daemon on the
// loopback. Every check must get its DAT error (or an error completion);
// after it, the provider and the daemon still serve.
func TestHostileConsumer(t *testing.T) { runDATProgram(t, "hostile.c") }

// TestDATSemantics runs testdata/semantics.c: the calls and flags dtest
// and dapltest leave out, checked for what DAT says they do.
func TestDATSemantics(t *testing.T) { runDATProgram(t, "semantics.c") }

// TestDATNeighbourWrites runs testdata/neighbours.c: a thread writes
// beside a buffer (on its first and last pages) while another registers
// and deregisters it, 200 times; no write may be lost.
func TestDATNeighbourWrites(t *testing.T) { runDATProgram(t, "neighbours.c") }

// runDATProgram builds the provider and testdata/src, runs it against a
// daemon on the loopback, and fails on its failures; afterwards the daemon
// must still serve and hold no EP or PSP.
func runDATProgram(t *testing.T, src string) {
	cc := testenv.RequireTool(t, "cc")
	gobin := testenv.RequireTool(t, "go")
	if _, err := os.Stat("/usr/include/dat2/udat.h"); err != nil {
		testenv.Unmet(t, "needs the DAT headers (libdapl-dev; make deps installs it)")
	}
	dir := t.TempDir()
	lib := filepath.Join(dir, "libdaplsoftrnic.so.2")
	if out, err := exec.Command(gobin, "build", "-buildmode=c-shared", "-o", lib, ".").CombinedOutput(); err != nil {
		t.Fatalf("build the provider: %v\n%s", err, out)
	}
	prog := filepath.Join(dir, "prog")
	if out, err := exec.Command(cc, "-O1", "-Wall", "-o", prog, filepath.Join("testdata", src), "-ldat2", "-lpthread").CombinedOutput(); err != nil {
		t.Fatalf("cc: %v\n%s", err, out)
	}
	sock := filepath.Join(dir, "lo.sock")
	srv, err := daemon.New(daemon.Options{Iface: "lo", Socket: sock, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve() }()
	defer func() {
		srv.Close()
		<-done
	}()
	conf := filepath.Join(dir, "dat.conf")
	line := fmt.Sprintf("test0 u2.0 nonthreadsafe default %s dapl.2.0 \"lo %s\" \"\"\n", lib, sock)
	if err := os.WriteFile(conf, []byte(line), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, prog, "test0", fmt.Sprint(freePort(t)))
	cmd.Env = append(os.Environ(), "DAT_OVERRIDE="+conf)
	out, err := cmd.CombinedOutput()
	t.Logf("%s", out)
	if err != nil {
		t.Fatalf("%s: %v", src, err)
	}
	ia, err := client.Open(context.Background(), client.Options{Socket: sock, Name: "after"})
	if err != nil {
		t.Fatalf("the daemon no longer serves: %v", err)
	}
	// The session's end is taken down in the background: wait for it.
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := ia.Stats()
		if err == nil && st.EP == 0 && st.PSP == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("after %s: %+v, %v (want no EP or PSP left)", src, st, err)
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	ia.Close()
}

func freePort(t *testing.T) uint16 {
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return uint16(l.Addr().(*net.TCPAddr).Port)
}

// Connection qualifiers map to ports as libdaplofa maps them, so that the
// two meet: up to 65535 as is, larger folded into 33534..65534.
func TestQualPort(t *testing.T) {
	for _, c := range []struct {
		q    uint64
		port uint16
	}{{45248, 45248}, {62001, 62001}, {0xffff, 0xffff}, {0x10000, 65536%32001 + 33534}, {1 << 40, uint16((1<<40)%32001 + 33534)}} {
		if got := qualPort(qualOf(c.q)); got != c.port {
			t.Errorf("qualifier %d: port %d, want %d", c.q, got, c.port)
		}
	}
}
