// Package systest runs the built binaries as a user would: daemons in two
// network namespaces and application processes talking through them.
package systest

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/softrnic/softrnic/internal/testenv"
	"github.com/softrnic/softrnic/internal/topology"
)

// build compiles the commands into dir.
func build(t *testing.T, dir string) {
	t.Helper()
	gobin := testenv.RequireTool(t, "go")
	cmd := exec.Command(gobin, "build", "-o", dir+"/", "github.com/softrnic/softrnic/cmd/softrnicd", "github.com/softrnic/softrnic/cmd/softrnic-example")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
}

func waitFor(t *testing.T, path string) {
	t.Helper()
	for i := 0; i < 400; i++ {
		if _, err := os.Stat(path); err == nil {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("%s never appeared", path)
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
	for i, d := range []struct {
		host topology.Host
		sock string
	}{{net.A, sockA}, {net.B, sockB}} {
		cmd := d.host.Command(filepath.Join(dir, "softrnicd"), append([]string{"--iface", d.host.Link, "--socket", d.sock, "--log-level", "warn"}, args[i]...)...)
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		waitFor(t, d.sock)
	}

	const pairs = 4
	const size = 128 << 20
	var wg sync.WaitGroup
	outs := make([]bytes.Buffer, 2*pairs)
	errs := make([]error, 2*pairs)
	for i := 0; i < pairs; i++ {
		port := fmt.Sprint(24000 + i)
		srv := net.B.Command("timeout", "120", filepath.Join(dir, "softrnic-example"), "server", "--socket", sockB, "--port", port, "--size", fmt.Sprint(size))
		srv.Stdout, srv.Stderr = &outs[2*i], &outs[2*i]
		if err := srv.Start(); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func(i int) { defer wg.Done(); errs[2*i] = srv.Wait() }(i)
	}
	// The servers listen once their PSP exists; give them a moment.
	time.Sleep(300 * time.Millisecond)
	start := time.Now()
	for i := 0; i < pairs; i++ {
		cli := net.A.Command("timeout", "120", filepath.Join(dir, "softrnic-example"), "client", "--socket", sockA,
			"--server", fmt.Sprintf("%s:%d", net.B.Addr.Addr(), 24000+i), "--size", fmt.Sprint(size))
		cli.Stdout, cli.Stderr = &outs[2*i+1], &outs[2*i+1]
		if err := cli.Start(); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func(i int) { defer wg.Done(); errs[2*i+1] = cli.Wait() }(i)
	}
	wg.Wait()
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
}
