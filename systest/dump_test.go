package systest

import (
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/softrnic/softrnic/internal/testenv"
	"github.com/softrnic/softrnic/internal/topology"
)

// softrnicd logs every QP's state when it gets SIGUSR1, on either datapath,
// and goes on serving.
func TestDaemonDumpsOnSIGUSR1(t *testing.T) {
	testenv.RequireRoot(t)
	tp := topology.NewTest(t, topology.Options{})
	dir := t.TempDir()
	build(t, dir)
	for i, dp := range []string{"kernel", "xdp"} {
		t.Run(dp, func(t *testing.T) {
			sock := filepath.Join(dir, fmt.Sprintf("dump%d.sock", i))
			d, err := startDaemonProc(tp.A, dir, "A", sock, "--datapath", dp)
			if err != nil {
				t.Fatal(err)
			}
			defer d.kill()
			app, err := openApp(sock, "dump", 4096)
			if err != nil {
				t.Fatal(err)
			}
			defer app.ia.Close()
			if _, err := app.endpoint(nil); err != nil {
				t.Fatal(err)
			}
			if err := d.cmd.Process.Signal(syscall.SIGUSR1); err != nil {
				t.Fatal(err)
			}
			for deadline := time.Now().Add(10 * time.Second); !strings.Contains(d.out.String(), `qp="qp `); time.Sleep(20 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("no QP in the log after SIGUSR1:\n%s", d.out.String())
				}
			}
			if !d.running() {
				t.Fatalf("the daemon ended after SIGUSR1: %v", d.err)
			}
			if _, err := app.ia.CreatePZ(); err != nil {
				t.Fatalf("the daemon does not serve after SIGUSR1: %v", err)
			}
		})
	}
}
