package systest

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/softrnic/softrnic/internal/testenv"
	"github.com/softrnic/softrnic/internal/topology"
)

// daplName is the IA name both hosts' dat.conf give softrnic: dtest's
// client uses the name the server sends it.
const daplName = "softrnic0"

// daplFailure matches what dtest and dapltest print when something went
// wrong; neither says so in its exit status (dtest returns 0 after
// FAILED, dapltest the low byte of a DAT_RETURN), so the output is the
// verdict.
var daplFailure = regexp.MustCompile(`(?i)error|fail|warning|mismatch|cannot|bad (connection|disconnect)|bogus|flushed`)

// buildProvider builds libdaplsoftrnic.so.2 into dir and writes a dat.conf
// for each host naming it with that host's daemon; returns the two paths.
func buildProvider(t *testing.T, dir string, net *topology.Pair, sockA, sockB string) (confA, confB string) {
	t.Helper()
	gobin := testenv.RequireTool(t, "go")
	lib := filepath.Join(dir, "libdaplsoftrnic.so.2")
	cmd := exec.Command(gobin, "build", "-buildmode=c-shared", "-o", lib, "github.com/softrnic/softrnic/dapl")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build the provider: %v\n%s", err, out)
	}
	conf := func(name string, h topology.Host, sock string) string {
		p := filepath.Join(dir, name)
		line := fmt.Sprintf("%s u2.0 nonthreadsafe default %s dapl.2.0 \"%s %s\" \"\"\n", daplName, lib, h.Link, sock)
		if err := os.WriteFile(p, []byte(line), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	return conf("a.conf", net.A, sockA), conf("b.conf", net.B, sockB)
}

// dapl runs a DAT program on a host with its dat.conf, line-buffered (the
// servers' ready lines must arrive while they run).
func dapl(h topology.Host, conf string, timeout int, args ...string) *exec.Cmd {
	cmd := h.Command("timeout", append([]string{fmt.Sprint(timeout), "stdbuf", "-oL"}, args...)...)
	cmd.Env = append(os.Environ(), "DAT_OVERRIDE="+conf)
	return cmd
}

// judge fails the test if out shows a failure or lacks want.
func judge(t *testing.T, what string, out string, want ...string) {
	t.Helper()
	if m := daplFailure.FindString(out); m != "" {
		t.Errorf("%s printed %q:\n%s", what, m, out)
		return
	}
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("%s did not print %q:\n%s", what, w, out)
			return
		}
	}
}

// TestDAPLPrograms runs Debian's unmodified uDAPL test programs over
// softrnic through libdaplsoftrnic.so.2, on each datapath: two namespaces, a
// softrnicd in each, dtest (connect with private data, Send/Recv, 1000 RDMA
// Writes, RDMA Reads, a Send ping-pong) waiting and polling, then dapltest's
// server with transaction tests (Send/Recv, RDMA Write and Read with one to
// four segments, waiting and polling, several threads and EPs, a reserved
// service point), performance tests (RDMA Write and Read, blocking and
// polling) and the quit command.
func TestDAPLPrograms(t *testing.T) {
	testenv.RequireRoot(t)
	dtest := testenv.RequireTool(t, "dtest")
	dapltest := testenv.RequireTool(t, "dapltest")
	testenv.RequireTool(t, "stdbuf")
	for _, dp := range []string{"kernel", "xdp"} {
		t.Run(dp, func(t *testing.T) {
			net := topology.NewTest(t, topology.Options{})
			dir := t.TempDir()
			build(t, dir)
			sockA, sockB := filepath.Join(dir, "a.sock"), filepath.Join(dir, "b.sock")
			var args []string
			if dp == "xdp" {
				args = []string{"--datapath", "xdp"}
			}
			startDaemon(t, dir, net.A, sockA, args...)
			startDaemon(t, dir, net.B, sockB, args...)
			confA, confB := buildProvider(t, dir, net, sockA, sockB)

			// dtest, waiting and polling (-p); 1 MiB buffers: 1000
			// Writes of 1 MiB each way.
			for _, mode := range [][]string{nil, {"-p"}} {
				srvArgs := append([]string{dtest, "-s", "-P", daplName, "-b", "1048576"}, mode...)
				srv := startServer(t, dapl(net.B, confB, 120, srvArgs...), "waiting for client connection")
				waitListen(t, net.B, 15828)
				cliArgs := append([]string{dtest, "-P", daplName, "-b", "1048576", "-h", net.B.Addr.Addr().String()}, mode...)
				out, err := dapl(net.A, confA, 120, cliArgs...).CombinedOutput()
				if err != nil {
					t.Errorf("dtest %v client: %v", mode, err)
				}
				// Not which string the Read brought back: dtest copies
				// each side's string into its buffer and reads the
				// peer's at once, unordered with the peer's copy
				// (dtest.c do_rdma_read_with_msg), so a fast client
				// may read the server's buffer before its string is in.
				judge(t, fmt.Sprintf("dtest %v client", mode), string(out), "CONNECTED!", "RDMA write buffer contains: server",
					"RCV RDMA read buffer contains:", "Message PingPong", "DAPL Test Complete. PASSED")
				if err := srv.Wait(); err != nil {
					t.Errorf("dtest %v server: %v", mode, err)
				}
				judge(t, fmt.Sprintf("dtest %v server", mode), srv.out.String(), "DAPL Test Complete. PASSED")
			}

			srv := startServer(t, dapl(net.B, confB, 300, dapltest, "-T", "S", "-D", daplName), "Service Point Ready")
			server := net.B.Addr.Addr().String()
			for _, tc := range [][]string{
				{"-T", "T", "-i", "500", "-t", "1", "-w", "1", "client", "SR", "256", "server", "SR", "256"},
				{"-T", "T", "-i", "200", "-t", "1", "-w", "1", "client", "SR", "1024", "3", "server", "SR", "256", "4",
					"client", "RW", "4096", "1", "server", "RW", "2048", "4", "server", "RR", "1024", "1", "client", "RR", "2048", "4"},
				{"-T", "T", "-P", "-i", "200", "-t", "1", "-w", "1", "client", "RW", "4096", "1", "server", "RW", "2048", "4",
					"server", "RR", "1024", "1", "client", "RR", "2048", "4", "client", "SR", "1024", "3", "-f", "server", "SR", "256", "3", "-f"},
				{"-T", "T", "-i", "100", "-t", "2", "-w", "4", "client", "SR", "256", "server", "SR", "256", "server", "RW", "4096", "server", "RR", "4096", "4"},
				{"-T", "T", "-r", "-i", "100", "-t", "1", "-w", "2", "client", "SR", "256", "server", "SR", "256", "client", "RR", "8192", "2"},
				{"-T", "P", "-i", "2048", "-m", "b", "RW", "4096", "2"},
				{"-T", "P", "-i", "2048", "-m", "p", "RR", "32768", "1"},
				{"-T", "P", "-i", "1024", "-p", "1", "-m", "p", "RW", "4", "1"},
			} {
				args := append([]string{dapltest, tc[0], tc[1], "-s", server, "-D", daplName}, tc[2:]...)
				out, err := dapl(net.A, confA, 120, args...).CombinedOutput()
				if err != nil {
					t.Errorf("dapltest %v: %v", tc, err)
				}
				want := []string{"End of Work -- Client Exiting"}
				if tc[1] == "T" {
					want = append(want, "----- Stats ---- :", "Total WQE")
				} else {
					want = append(want, "Operation Throughput", "Latency")
				}
				judge(t, fmt.Sprintf("dapltest %v", tc), string(out), want...)
			}
			out, err := dapl(net.A, confA, 60, dapltest, "-T", "Q", "-s", server, "-D", daplName).CombinedOutput()
			if err != nil {
				t.Errorf("dapltest -T Q: %v\n%s", err, out)
			}
			if err := srv.Wait(); err != nil {
				t.Errorf("dapltest server: %v", err)
			}
			judge(t, "dapltest server", srv.out.String(), "Exiting.")
		})
	}
}

// waitListen waits until a TCP port listens on the host.
func waitListen(t *testing.T, h topology.Host, port int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		out, _ := h.Command("ss", "-Hltn", fmt.Sprintf("sport = :%d", port)).Output()
		if len(bytes.TrimSpace(out)) > 0 {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("nothing listens on port %d in %s", port, h.Namespace)
}
