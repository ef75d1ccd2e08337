package daemon

import (
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/softrnic/softrnic/ctl"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func TestStartErrors(t *testing.T) {
	dir := t.TempDir()
	if _, err := New(Options{Iface: "nosuch0", Socket: filepath.Join(dir, "x.sock"), Logger: quiet()}); !errors.Is(err, ErrNoInterface) {
		t.Fatalf("missing interface: %v", err)
	}
	if _, err := New(Options{Iface: "lo", Datapath: "xdp", Socket: filepath.Join(dir, "x.sock"), Logger: quiet()}); !errors.Is(err, ErrDatapath) {
		t.Fatalf("xdp: %v", err)
	}
	if _, err := New(Options{Iface: "lo", Datapath: "dpdk", Socket: filepath.Join(dir, "x.sock"), Logger: quiet()}); !errors.Is(err, ErrDatapath) {
		t.Fatalf("unknown datapath: %v", err)
	}

	// A socket a live daemon answers on is refused.
	sock := filepath.Join(dir, "live.sock")
	s, err := New(Options{Iface: "lo", Socket: sock, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve()
	if _, err := New(Options{Iface: "lo", Socket: sock, Logger: quiet()}); !errors.Is(err, ErrSocketInUse) {
		t.Fatalf("second daemon on a live socket: %v", err)
	}
	st, err := os.Stat(sock)
	if err != nil || st.Mode().Perm() != 0o660 || st.Mode().Type() != os.ModeSocket {
		t.Fatalf("socket %v %v", st.Mode(), err)
	}
	s.Close()
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Fatalf("socket left after Close: %v", err)
	}

	// A stale socket file (nobody listening) is replaced.
	stale := filepath.Join(dir, "stale.sock")
	l, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: stale, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	l.Close()
	if _, err := os.Stat(stale); err != nil {
		t.Fatal("the stale socket should still exist")
	}
	s2, err := New(Options{Iface: "lo", Socket: stale, Logger: quiet()})
	if err != nil {
		t.Fatalf("stale socket: %v", err)
	}
	s2.Close()
}

func TestDisconnectPendingRules(t *testing.T) {
	// digest 003 §2: in DISCONNECT_PENDING only an abrupt disconnect is
	// allowed; from DISCONNECTED it is a no-op. The state is set directly:
	// over a real connection DISCONNECT_PENDING lasts microseconds.
	s := &session{objects: map[uint32]any{}}
	e := &ep{h: 1, state: ctl.EPDisconnectPending}
	s.objects[1] = e
	err := s.disconnect(&ctl.Disconnect{EP: 1, Graceful: true})
	var ce *ctl.Error
	if !errors.As(err, &ce) || ce.Status != ctl.InvalidParameter {
		t.Fatalf("graceful while pending: %v", err)
	}
	e.state = ctl.EPDisconnected
	if err := s.disconnect(&ctl.Disconnect{EP: 1, Graceful: true}); err != nil {
		t.Fatalf("from DISCONNECTED: %v", err)
	}
	for _, st := range []uint8{ctl.EPActivePending, ctl.EPCompletionPending, ctl.EPReserved} {
		e.state = st
		if err := s.disconnect(&ctl.Disconnect{EP: 1}); !errors.As(err, &ce) || ce.Status != ctl.InvalidState {
			t.Fatalf("from %s: %v", ctl.EPStateName(st), err)
		}
	}
}
