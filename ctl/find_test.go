package ctl

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/softrnic/softrnic/internal/testenv"
)

// FindSocket finds the one daemon socket in SocketDir, and says why when
// there is none or several. Each case runs in a private mount namespace
// where a directory of the test's is SocketDir (so, as root).
func TestFindSocket(t *testing.T) {
	if dir := os.Getenv("SOFTRNIC_FIND_SOCKET_CASE"); dir != "" {
		p, err := FindSocket()
		if err != nil {
			os.Stdout.WriteString("error: " + err.Error())
		} else {
			os.Stdout.WriteString("found: " + p)
		}
		return
	}
	testenv.RequireRoot(t)
	testenv.RequireTool(t, "unshare")
	if err := os.MkdirAll(SocketDir, 0o755); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	run := func() string {
		cmd := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c",
			`mount --bind "$1" `+SocketDir+` && exec "$2" -test.run='^TestFindSocket$'`, "sh", dir, os.Args[0])
		cmd.Env = append(os.Environ(), "SOFTRNIC_FIND_SOCKET_CASE="+dir)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		return string(out)
	}
	listen := func(name string) net.Listener {
		l, err := net.Listen("unixpacket", filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		return l
	}
	if out := run(); !strings.Contains(out, "error: no softrnicd socket in /run/softrnic") {
		t.Errorf("none: %s", out)
	}
	if err := os.WriteFile(filepath.Join(dir, "plain.sock"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	veth0 := listen("veth0.sock")
	if out := run(); !strings.Contains(out, "found: /run/softrnic/veth0.sock") {
		t.Errorf("one, beside a file that is not a socket: %s", out)
	}
	stale, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: filepath.Join(dir, "stale.sock"), Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	stale.SetUnlinkOnClose(false)
	stale.Close()
	if out := run(); !strings.Contains(out, "found: /run/softrnic/veth0.sock") {
		t.Errorf("one live, one left by a daemon killed: %s", out)
	}
	// a daemon too busy to accept, its backlog full, is alive: the probe
	// neither waits for it nor passes it over
	veth0.Close()
	full := testenv.FullSocket(t, filepath.Join(dir, "full.sock"))
	if out := run(); !strings.Contains(out, "found: /run/softrnic/full.sock") {
		t.Errorf("one live with its backlog full, one left by a daemon killed: %s", out)
	}
	full.Close()
	if out := run(); !strings.Contains(out, "error: 2 sockets in /run/softrnic and no softrnicd answers on any") {
		t.Errorf("two sockets, no daemon: %s", out)
	}
	listen("veth0.sock")
	listen("veth1.sock")
	if out := run(); !strings.Contains(out, "error: 2 softrnicd sockets in /run/softrnic") {
		t.Errorf("two: %s", out)
	}
}
