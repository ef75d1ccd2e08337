package daemon

import (
	"context"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/softrnic/softrnic/client"
)

// A session that goes with no request beyond its Hello (a device list, a
// search for the daemon's socket: one at each program's start) is not
// logged at Info; a client's session is, opened with the name it gave and
// closed.
func TestLooksAreNotLoggedAsSessions(t *testing.T) {
	srv, sock, log := loggedDaemon(t)
	settled := func() {
		t.Helper()
		for i := 0; srv.Counts()["sessions"] != 0; i++ {
			if i == 500 {
				t.Fatal("sessions left after their clients closed")
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	// a connect and nothing more (the socket search)
	c, err := net.Dial("unixpacket", sock)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	// a Hello and nothing more (a device list)
	ia, err := client.Open(context.Background(), client.Options{Socket: sock, Name: "lister"})
	if err != nil {
		t.Fatal(err)
	}
	ia.Close()
	settled()
	if out := log.String(); strings.Contains(out, "session") {
		t.Errorf("looks at the daemon logged as sessions:\n%s", out)
	}
	ia, err = client.Open(context.Background(), client.Options{Socket: sock, Name: "worker"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ia.CreatePZ(); err != nil {
		t.Fatal(err)
	}
	ia.Close()
	settled()
	out := log.String()
	if !strings.Contains(out, `msg="session opened"`) || !strings.Contains(out, "client=worker") ||
		!strings.Contains(out, `msg="session closed"`) {
		t.Errorf("a client's session not logged, opened with its name and closed:\n%s", out)
	}
	if strings.Contains(out, "lister") {
		t.Errorf("the look logged:\n%s", out)
	}
}

// A session held open with no request beyond Hello is no look: it holds
// the daemon's descriptors and a mapping, and is logged once it has been
// open for lookWindow, with the name its client gave.
func TestIdleSessionsAreLogged(t *testing.T) {
	_, sock, log := loggedDaemon(t)
	ia, err := client.Open(context.Background(), client.Options{Socket: sock, Name: "holder"})
	if err != nil {
		t.Fatal(err)
	}
	defer ia.Close()
	c, err := net.Dial("unixpacket", sock) // connected, nothing sent
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	deadline := time.Now().Add(lookWindow + 10*time.Second)
	for strings.Count(log.String(), `msg="session opened"`) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("two sessions held open %v, not both logged:\n%s", lookWindow+10*time.Second, log.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if out := log.String(); !strings.Contains(out, "client=holder idle=2s") {
		t.Errorf("the idle session's line has not its client's name:\n%s", out)
	}
}

// loggedDaemon serves a daemon on lo whose log is kept, at Info.
func loggedDaemon(t *testing.T) (*Server, string, *logBuffer) {
	sock := filepath.Join(t.TempDir(), "d.sock")
	log := new(logBuffer)
	srv, err := New(Options{Iface: "lo", Socket: sock, Logger: slog.New(slog.NewTextHandler(log, nil))})
	if err != nil {
		t.Fatal(err)
	}
	serve(t, srv)
	return srv, sock, log
}
