package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/softrnic/softrnic/daemon"
	"github.com/softrnic/softrnic/mpa"
)

// TestMain lets the test binary run as softrnic-perf.
func TestMain(m *testing.M) {
	if os.Getenv("SOFTRNIC_PERF_MAIN") != "" {
		os.Args = append([]string{"softrnic-perf"}, strings.Fields(os.Getenv("SOFTRNIC_PERF_ARGS"))...)
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func perf(args string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "SOFTRNIC_PERF_MAIN=1", "SOFTRNIC_PERF_ARGS="+args)
	return cmd
}

// startDaemon runs a daemon on loopback for the test; it returns the
// daemon's socket.
func startDaemon(t *testing.T) string {
	sock := filepath.Join(t.TempDir(), "d.sock")
	d, err := daemon.New(daemon.Options{Iface: "lo", Socket: sock, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	go d.Serve()
	t.Cleanup(func() { d.Close() })
	return sock
}

// freePort is a loopback TCP port that was free a moment ago.
func freePort(t *testing.T) int {
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startServer starts a softrnic-perf server and returns once it waits for
// its client; the rest of its standard output arrives on the channel when
// it closes. The server is killed when the test ends if still running.
func startServer(t *testing.T, args string, stderr io.Writer) (*exec.Cmd, <-chan string) {
	srv := perf(args)
	out, err := srv.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	srv.Stderr = stderr
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Process.Kill() })
	r := bufio.NewReader(out)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("server %q ended before waiting for its client: %v", args, err)
		}
		if strings.Contains(line, "Waiting for client") {
			break
		}
	}
	rest := make(chan string, 1)
	go func() { b, _ := io.ReadAll(r); rest <- string(b) }()
	return srv, rest
}

// TestEveryTest runs each test, server and client as separate processes
// through one daemon, with --verify and --json; the bandwidth tests also
// with -q (server and client each wait for all the queue pairs).
func TestEveryTest(t *testing.T) {
	sock := startDaemon(t)
	for _, tc := range []struct {
		test string
		size int
		qps  int
	}{{"write_bw", 4096, 1}, {"read_bw", 4096, 1}, {"send_bw", 100, 1}, {"write_lat", 2, 1}, {"read_lat", 8, 1}, {"send_lat", 2, 1}, {"atomic_lat", 8, 1},
		{"write_bw", 4096, 4}, {"read_bw", 4096, 4}, {"send_bw", 100, 3}} {
		t.Run(fmt.Sprintf("%s/q%d", tc.test, tc.qps), func(t *testing.T) {
			common := fmt.Sprintf("%s -s %d -q %d -p %d --socket %s --verify --timeout 60s", tc.test, tc.size, tc.qps, freePort(t), sock)
			srv, _ := startServer(t, common, os.Stderr)
			cli := perf(common + " -n 300 --json 127.0.0.1")
			cli.Stderr = os.Stderr
			res, err := cli.Output()
			if err != nil {
				t.Fatalf("client: %v\n%s", err, res)
			}
			var results []Result
			if err := json.Unmarshal(res, &results); err != nil || len(results) != 1 {
				t.Fatalf("json: %v\n%s", err, res)
			}
			r := results[0]
			if r.Test != tc.test || r.Bytes != tc.size || r.Iterations != 300 {
				t.Fatalf("%+v", r)
			}
			if strings.HasSuffix(tc.test, "_bw") && (r.BWAvgMBps <= 0 || r.BWPeakMBps < r.BWAvgMBps || !r.Verified && tc.test != "send_bw") {
				t.Fatalf("bandwidth %+v", r)
			}
			if strings.HasSuffix(tc.test, "_lat") && !(r.TMinUs > 0 && r.TMinUs <= r.TTypUs && r.TTypUs <= r.P99Us && r.P99Us <= r.TMaxUs) {
				t.Fatalf("latency %+v", r)
			}
			done := make(chan error, 1)
			go func() { done <- srv.Wait() }()
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("server: %v", err)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("server did not finish")
			}
		})
	}
}

// TestQPMismatch: a server and client with different -q refuse each other
// with messages that say how to fix it.
func TestQPMismatch(t *testing.T) {
	sock := startDaemon(t)
	port := freePort(t)
	var srvErr strings.Builder
	srv, _ := startServer(t, fmt.Sprintf("write_bw -q 2 -p %d --socket %s --timeout 60s", port, sock), &srvErr)
	cli := perf(fmt.Sprintf("write_bw -q 1 -p %d --socket %s --timeout 60s 127.0.0.1", port, sock))
	var cliErr strings.Builder
	cli.Stderr = &cliErr
	if err := cli.Run(); err == nil || !strings.Contains(cliErr.String(), "the server refused") {
		t.Fatalf("client: %v %q", err, cliErr.String())
	}
	if err := srv.Wait(); err == nil || !strings.Contains(srvErr.String(), "run the server with -q 1") {
		t.Fatalf("server: %v %q", err, srvErr.String())
	}
}

// TestPerftestMode runs --perftest's exchange (perftest -R's, as Debian's
// perftest speaks it) between two softrnic-perf processes; make interop
// runs it against Linux siw's ib_write_bw and ib_read_bw.
func TestPerftestMode(t *testing.T) {
	sock := startDaemon(t)
	// send_bw also runs at 256 B, where 64 receive slots outgrow the data
	// area and must not spill onto the control area or credit word.
	for _, tc := range []struct {
		test string
		size int
	}{{"write_bw", 4096}, {"read_bw", 4096}, {"send_bw", 4096}, {"send_bw", 256}, {"read_lat", 4096}} {
		test := tc.test
		common := fmt.Sprintf("%s --perftest -s %d -n 1000 -p %d --socket %s --timeout 60s", test, tc.size, freePort(t), sock)
		srv, rest := startServer(t, common, os.Stderr)
		cl := perf(common + " --json 127.0.0.1")
		cl.Stderr = os.Stderr
		res, err := cl.Output()
		if err != nil {
			t.Fatalf("%s client: %v\n%s", test, err, res)
		}
		var results []Result
		if err := json.Unmarshal(res, &results); err != nil || len(results) != 1 || results[0].Iterations != 1000 ||
			results[0].BWAvgMBps <= 0 && results[0].TTypUs <= 0 {
			t.Fatalf("%s: %v %s", test, err, res)
		}
		if err := srv.Wait(); err != nil {
			t.Fatalf("%s server: %v", test, err)
		}
		// The server learnt a bandwidth client's figures in perftest's
		// report exchange (latency tests have none).
		if s := <-rest; (test == "write_bw" || test == "read_bw") && !strings.Contains(s, "peer reports") {
			t.Fatalf("%s server output: %q", test, s)
		}
	}
	// A test --perftest does not speak yet: the client leaves with an error.
	if out, err := perf(fmt.Sprintf("write_lat --perftest -p %d --socket %s", freePort(t), sock)).CombinedOutput(); err == nil {
		t.Fatalf("write_lat --perftest server started: %s", out)
	}
}

// The MPA options: two softrnic-perfs measure through each variant, plain
// and --perftest; a --perftest server answers a peer-to-peer Request
// offering a Read RTR with ORD 1 with an IRD that allows it (siw's ORD 1
// met IRD 0 before, which only siw's relaxed negotiation let pass); bad
// combinations are refused.
func TestMPAOptions(t *testing.T) {
	sock := startDaemon(t)
	for _, mpaArgs := range []string{"--mpa-rev 1", "--p2p", "--p2p --rtr read", "--p2p --rtr write"} {
		for _, test := range []string{"write_bw", "read_bw", "write_bw --perftest", "read_bw --perftest"} {
			t.Run(mpaArgs+"/"+test, func(t *testing.T) {
				common := fmt.Sprintf("%s -s 4096 -n 200 -p %d --socket %s --timeout 60s %s", test, freePort(t), sock, mpaArgs)
				srv, _ := startServer(t, common, os.Stderr)
				if out, err := perf(common + " 127.0.0.1").CombinedOutput(); err != nil {
					t.Fatalf("client: %v\n%s", err, out)
				}
				if err := srv.Wait(); err != nil {
					t.Fatalf("server: %v", err)
				}
			})
		}
	}
	t.Run("perftest server IRD for a Read RTR", func(t *testing.T) {
		port := freePort(t)
		startServer(t, fmt.Sprintf("write_bw --perftest -s 4096 -n 200 -p %d --socket %s --timeout 60s --p2p", port, sock), io.Discard)
		c, err := net.DialTimeout("tcp4", fmt.Sprintf("127.0.0.1:%d", port), 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(20 * time.Second))
		req := mpa.Frame{Revision: 2, Enhanced: true, CRC: true, IRD: 1, ORD: 1, PeerToPeer: true, RTR: mpa.RTRRead}
		b, err := req.Append(nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write(b); err != nil {
			t.Fatal(err)
		}
		var got []byte
		buf := make([]byte, 512)
		for {
			if n, err := mpa.FrameLen(got); err == nil && n > 0 && len(got) >= n {
				break
			}
			n, err := c.Read(buf)
			if err != nil {
				t.Fatalf("no MPA Reply (%d octets): %v", len(got), err)
			}
			got = append(got, buf[:n]...)
		}
		reply, _, err := mpa.ParseFrame(got, true)
		if err != nil {
			t.Fatal(err)
		}
		if reply.Reject || !reply.PeerToPeer || reply.RTR != mpa.RTRRead || reply.IRD < 1 {
			t.Fatalf("Reply to ORD 1 with a Read RTR: reject %v, p2p %v, RTR %v, IRD %d; want an accept picking read with IRD >= 1",
				reply.Reject, reply.PeerToPeer, reply.RTR, reply.IRD)
		}
	})
	for _, args := range []string{"--p2p --mpa-rev 1", "--rtr read", "--p2p --rtr sideways", "--mpa-rev 0"} {
		out, err := perf("write_bw --socket " + sock + " " + args).CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 {
			t.Errorf("%q: want exit 2, got %v: %s", args, err, out)
		}
	}
}
