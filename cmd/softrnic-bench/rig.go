package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/softrnic/softrnic/internal/scale"
	"github.com/softrnic/softrnic/internal/topology"
)

// rig is a softrnicd in each namespace, of one build and one datapath,
// with softrnic-perf of the same build run between them: a build's
// daemon and client speak that build's control protocol, so an old
// softrnic-perf is only ever run against old daemons.
type rig struct {
	b       *bench
	bin     string            // directory of the build's softrnicd and softrnic-perf
	dir     string            // holds the control sockets; removed by Close
	sock    map[string]string // control socket by host, "a" and "b"
	daemons []*exec.Cmd       // A's and B's, in that order
}

// startRig starts the daemons of the build in bin on datapath and waits
// for their control sockets. The caller closes the rig.
func (b *bench) startRig(bin, datapath string) (*rig, error) {
	dir, err := os.MkdirTemp("", "softrnic-bench")
	if err != nil {
		return nil, err
	}
	r := &rig{b: b, bin: bin, dir: dir,
		sock: map[string]string{"a": filepath.Join(dir, "a.sock"), "b": filepath.Join(dir, "b.sock")}}
	for _, h := range []struct {
		host topology.Host
		key  string
		cpu  string
	}{{b.net.A, "a", "0"}, {b.net.B, "b", strconv.Itoa(min(1, runtime.NumCPU()-1))}} {
		// One poller per host, each on its own CPU (the xdp datapath;
		// the kernel datapath has no pollers), as the design asks: on
		// two cores it gives more bandwidth than both hosts' pollers
		// sharing CPU 0, for a few microseconds more small-message
		// round trip (figures in the commit that chose it).
		d := h.host.Command(filepath.Join(bin, "softrnicd"), "--iface", h.host.Link, "--socket", r.sock[h.key], "--log-level", "warn",
			"--datapath", datapath, "--cpus", h.cpu)
		d.Stderr = os.Stderr
		if err := d.Start(); err != nil {
			r.Close()
			return nil, err
		}
		r.daemons = append(r.daemons, d)
		if err := waitSocket(r.sock[h.key], 2*time.Second); err != nil {
			r.Close()
			return nil, err
		}
	}
	return r, nil
}

// Close kills the daemons, waits for them, and removes the sockets.
func (r *rig) Close() {
	for _, d := range r.daemons {
		_ = d.Process.Kill()
		_ = d.Wait()
	}
	os.RemoveAll(r.dir)
}

// daemonCPU is A's and B's daemon CPU seconds so far.
func (r *rig) daemonCPU() (float64, float64) {
	a, _ := scale.CPUSeconds(r.daemons[0].Process.Pid)
	b, _ := scale.CPUSeconds(r.daemons[1].Process.Pid)
	return a, b
}

// perf runs one softrnic-perf test, server on B and client on A, and
// returns the client's JSON result and the CPU seconds each host spent
// on it, daemon included.
func (r *rig) perf(test string, size int, extra ...string) (map[string]any, float64, float64, error) {
	// Every test of the run has a port of its own, so that no listener
	// meets a connection of an earlier test, of this rig or another.
	r.b.port++
	args := []string{test, "-s", strconv.Itoa(size), "-p", strconv.Itoa(r.b.port), "--timeout", "60s"}
	if !r.b.crc {
		args = append(args, "--no-crc")
	}
	perfBin := filepath.Join(r.bin, "softrnic-perf")
	a0, b0 := r.daemonCPU()
	lat := strings.HasSuffix(test, "_lat")
	name, sargs := pinApp(lat, perfBin, slices.Concat(args, []string{"--socket", r.sock["b"]})...)
	srv, out, err := r.b.start(r.b.net.B, name, sargs...)
	if err != nil {
		return nil, 0, 0, err
	}
	defer srv.Process.Kill()
	br, err := waitLine(out, "Waiting for client")
	if err != nil {
		return nil, 0, 0, err
	}
	go io.Copy(io.Discard, br)
	cargs := slices.Concat(args, []string{"--socket", r.sock["a"], "--json"}, extra, []string{r.b.net.B.Addr.Addr().String()})
	name, cargs = pinApp(lat, perfBin, cargs...)
	cli := r.b.net.A.Command(name, cargs...)
	cli.Stderr = os.Stderr
	res, err := cli.Output()
	if err != nil {
		return nil, 0, 0, fmt.Errorf("softrnic-perf %s -s %d: %v", test, size, err)
	}
	_ = srv.Wait()
	a1, b1 := r.daemonCPU()
	var rs []map[string]any
	if err := json.Unmarshal(res, &rs); err != nil || len(rs) != 1 {
		return nil, 0, 0, fmt.Errorf("softrnic-perf output: %v", err)
	}
	return rs[0], cpu(cli) + a1 - a0, cpu(srv) + b1 - b0, nil
}

// bw is one bandwidth point of test (write_bw, read_bw, send_bw) at size,
// run for the bench's seconds per point.
func (r *rig) bw(test string, size int) (Point, error) {
	res, ca, cb, err := r.perf(test, size, "-D", fmt.Sprintf("%gs", r.b.seconds))
	if err != nil {
		return Point{}, err
	}
	avg := num(res["bw_avg_MBps"])
	n := int(num(res["iterations"]))
	if n == 0 {
		// No rate, and a CPU per GB that JSON cannot hold.
		return Point{}, fmt.Errorf("softrnic-perf %s -s %d: no messages moved", test, size)
	}
	gb := float64(n) * float64(size) / 1e9
	return Point{Size: size, Gbps: avg * 8 / 1e3, Mpps: num(res["msg_rate_Mpps"]), Samples: n, CPUA: ca / gb, CPUB: cb / gb}, nil
}

// lat is test's (write_lat, read_lat) 8-octet round trip over 3000
// iterations.
func (r *rig) lat(test string) (Latency, error) {
	res, _, _, err := r.perf(test, 8, "-n", "3000")
	if err != nil {
		return Latency{}, err
	}
	return Latency{Median: num(res["t_typical_us"]), P99: num(res["p99_us"]), P999: num(res["p99_9_us"])}, nil
}

// pinApp runs the two ends of a latency test (softrnic-perf's, and kernel
// TCP's ping-pong) on one CPU, the last, when pin. Both ends of softrnic's
// latency tests poll (memory, an event ring); on two cores, two pollers
// on different cores leave the RNIC's threads no free core when a message
// arrives, and each of its round trips waits for a scheduler switch:
// measured unpinned, 8 B Write round trips are bimodal on both datapaths
// and both builds (xdp 14 or 72 us, kernel 21 or 26-90), and which mode
// a run gets decides any target. With both applications on one core they
// yield to each other and the other core is the RNIC's and the kernel's,
// as each host's would be on two machines. The last CPU rather than the
// first: the xdp datapath's initiating poller, whose spinning delays the
// test's own application, is pinned to CPU 0 (on CPU 0, xdp's 8 B Read
// round trip was 11 or 65 us; on CPU 1, 10-12.5). Kernel TCP's ping-pong
// runs the same way, for like with like (10-11 us so, 9-9.5 unpinned).
func pinApp(pin bool, name string, args ...string) (string, []string) {
	n := runtime.NumCPU()
	if !pin || n < 2 {
		return name, args
	}
	return "taskset", slices.Concat([]string{"-c", strconv.Itoa(n - 1), name}, args)
}
