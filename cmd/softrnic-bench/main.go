// Command softrnic-bench is `make bench`: one run on the two-namespace veth
// topology that measures the kernel-TCP baseline (our own stream and
// ping-pong, and iperf3 beside them) and softrnic on every datapath that
// exists, and reports each softrnic figure as a ratio to the baseline of the
// same run: a table, bench/results.json and PNG plots. With --baseline it
// also measures an old build against this one, alternating them (see
// alternate.go), for issue 15's targets.
//
//	softrnic-bench --bin DIR [--out bench] [--mtu 1500] [--crc=true] [--seconds 1]
//	               [--baseline OLDDIR --baseline-ref REF] [--rounds 3]
//
// DIR holds softrnicd and softrnic-perf, and OLDDIR the old build's. Run
// as root. The helper modes tcp-server, tcp-stream and tcp-ping are the
// baseline's two ends; the command runs itself in each namespace for them.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/softrnic/softrnic/internal/topology"
)

func main() {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "tcp-server":
			exit(tcpServer(os.Args[2]))
		case "tcp-stream":
			exit(tcpStream(os.Args[2:]))
		case "tcp-ping":
			exit(tcpPing(os.Args[2:]))
		case "sdp-server":
			useSDP = true
			exit(tcpServer(os.Args[2]))
		case "sdp-stream":
			useSDP = true
			exit(tcpStream(os.Args[2:]))
		case "sdp-ping":
			useSDP = true
			exit(tcpPing(os.Args[2:]))
		}
	}
	bin := flag.String("bin", "", "directory with softrnicd and softrnic-perf")
	out := flag.String("out", "bench", "directory for results.json and the plots")
	mtu := flag.Int("mtu", 1500, "MTU of the veth pair (native XDP on veth accepts at most 3506)")
	crc := flag.Bool("crc", true, "MPA CRC on")
	seconds := flag.Float64("seconds", 1, "seconds per bandwidth point")
	baseline := flag.String("baseline", "", "directory with the old build's softrnicd and softrnic-perf, alternated with --bin's")
	ref := flag.String("baseline-ref", "", "the git ref the old build is of, for the output; with no --baseline, that it could not be built")
	// Three rounds, not two: the median of three is a round's figure
	// and ignores one outlying round, where that of two is their mean.
	rounds := flag.Int("rounds", 3, "rounds of the alternation: each build is measured once a round")
	flag.Parse()
	if *bin == "" {
		fmt.Fprintln(os.Stderr, "usage: softrnic-bench --bin DIR [--out DIR] [--mtu N] [--crc=BOOL] [--seconds S] [--baseline DIR --baseline-ref REF] [--rounds N]")
		os.Exit(2)
	}
	b := &bench{bin: *bin, crc: *crc, seconds: *seconds, port: 18600}
	exit(b.run(*out, *mtu, baselineOpts{dir: *baseline, ref: *ref, rounds: *rounds}))
}

func exit(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "softrnic-bench:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// Sizes measured for bandwidth.
var sizes = []int{64, 256, 1024, 4096, 16384, 65536, 262144, 1 << 20}

// Point is one bandwidth measurement.
type Point struct {
	Size    int     `json:"size"`
	Gbps    float64 `json:"gbps"`
	Mpps    float64 `json:"mpps"`
	Ratio   float64 `json:"ratio_to_kernel_tcp,omitempty"`
	CPUA    float64 `json:"cpu_s_per_gb_host_a"`
	CPUB    float64 `json:"cpu_s_per_gb_host_b"`
	Samples int     `json:"messages"`
}

// Latency is one latency measurement, in microseconds.
type Latency struct {
	Median float64 `json:"median_us"`
	P99    float64 `json:"p99_us"`
	P999   float64 `json:"p99_9_us"`
	Ratio  float64 `json:"ratio_to_kernel_tcp,omitempty"`
}

// Results is bench/results.json.
type Results struct {
	When         time.Time `json:"when"`
	MTU          int       `json:"mtu"`
	CRC          bool      `json:"crc"`
	IperfGbps    float64   `json:"iperf3_gbps"`
	KernelTCP    []Point   `json:"kernel_tcp_stream"`
	KernelTCPLat Latency   `json:"kernel_tcp_pingpong_1B"`
	// KernelTCPOffloads64K is the kernel TCP stream at 64 KiB writes
	// on a second veth pair with TX checksum offload, TSO and GSO on.
	KernelTCPOffloads64K float64            `json:"kernel_tcp_offloads_on_64KiB_gbps"`
	Datapaths            map[string]Softrnc `json:"softrnic"`
	// Bare is what copy-mode AF_XDP alone does on a veth pair like
	// this one, with no protocol: the ceiling the xdp datapath's
	// figures are read against. Nil when it could not be measured.
	Bare *Bare `json:"bare_af_xdp,omitempty"`
	// Alternation is the old build against this one, for issue 15's
	// targets 3 and 4.
	Alternation *Alternation `json:"alternation"`
	// SDP is issue 20's column, by datapath.
	SDP map[string]SDP `json:"sdp"`
}

// Bare holds the xsk package's benchmarks of bare AF_XDP (MTU 1500):
// BenchmarkXSKRx's payload rate of 1472-octet datagrams between two
// copy-mode sockets, with softirq and with threaded NAPI, and
// BenchmarkXSKPingPong's median round trip of 64 octets.
type Bare struct {
	Gbps         float64 `json:"gbps_1472B"`
	GbpsThreaded float64 `json:"gbps_1472B_threaded_napi"`
	PingPong     float64 `json:"pingpong_64B_median_us"`
}

// Softrnc holds one datapath's figures.
type Softrnc struct {
	Write    []Point `json:"write_bw"`
	Read     []Point `json:"read_bw"`
	Send     []Point `json:"send_bw"`
	WriteLat Latency `json:"write_lat_8B"`
	ReadLat  Latency `json:"read_lat_8B"`
	Rate64   float64 `json:"msg_rate_64B_mpps"`
}

type bench struct {
	net     *topology.Pair
	bin     string // this tree's build
	self    string
	crc     bool
	seconds float64
	port    int // the last softrnic-perf port taken
}

// baselineOpts is the old build the alternation measures this one
// against: its directory (empty if none was given or it could not be
// built), its git ref, and the rounds.
type baselineOpts struct {
	dir, ref string
	rounds   int
}

func (b *bench) run(outDir string, mtu int, base baselineOpts) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	pair, err := topology.New(topology.Options{Prefix: "srnbench", MTU: mtu})
	if err != nil {
		return err
	}
	defer pair.Close()
	b.net, b.self = pair, self
	res := Results{When: time.Now().UTC(), MTU: mtu, CRC: b.crc, Datapaths: map[string]Softrnc{}, SDP: map[string]SDP{}}
	fmt.Printf("== two hosts over veth, MTU %d, offloads off, CRC %v\n", mtu, b.crc)

	fmt.Println("== kernel TCP baseline")
	if res.IperfGbps, err = b.iperf(); err != nil {
		fmt.Println("   iperf3:", err)
	}
	for _, s := range sizes {
		p, err := b.tcpStream(s)
		if err != nil {
			return err
		}
		res.KernelTCP = append(res.KernelTCP, p)
	}
	if res.KernelTCPLat, err = b.tcpPingPong(); err != nil {
		return err
	}

	if res.KernelTCPOffloads64K, err = b.offloadsOn(mtu); err != nil {
		return err
	}

	for _, dp := range []string{"kernel", "xdp"} {
		fmt.Printf("== softrnic, %s datapath\n", dp)
		k, sd, err := b.softrnic(dp)
		if err != nil {
			return err
		}
		res.SDP[dp] = sd
		for _, pts := range [][]Point{k.Write, k.Read, k.Send} {
			for i := range pts {
				pts[i].Ratio = pts[i].Gbps / res.KernelTCP[i].Gbps
			}
		}
		k.WriteLat.Ratio = k.WriteLat.Median / res.KernelTCPLat.Median
		k.ReadLat.Ratio = k.ReadLat.Median / res.KernelTCPLat.Median
		res.Datapaths[dp] = k
	}

	res.Alternation = b.alternate(base.dir, base.ref, base.rounds)

	if res.Bare, err = bare(b.bin); err != nil {
		fmt.Println("   bare AF_XDP:", err)
	}

	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return err
	}
	j, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(outDir, "results.json"), j, 0o644); err != nil {
		return err
	}
	if err := plots(&res, outDir); err != nil {
		return err
	}
	table(&res)
	issue15(&res)
	sdpTargets(&res)
	fmt.Printf("\nresults: %s, plots: %s\n", filepath.Join(outDir, "results.json"), filepath.Join(outDir, "*.png"))
	return nil
}

// proc is a process in a namespace whose CPU time we account.
func (b *bench) start(h topology.Host, name string, args ...string) (*exec.Cmd, io.Reader, error) {
	cmd := h.Command(name, args...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, err
	}
	cmd.Stderr = os.Stderr
	return cmd, out, cmd.Start()
}

func cpu(cmd *exec.Cmd) float64 {
	if cmd.ProcessState == nil {
		return 0
	}
	return (cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()).Seconds()
}

// waitLine reads lines until one contains s.
func waitLine(r io.Reader, s string) (*bufio.Reader, error) {
	br := bufio.NewReader(r)
	for {
		line, err := br.ReadString('\n')
		if strings.Contains(line, s) {
			return br, nil
		}
		if err != nil {
			return nil, fmt.Errorf("waiting for %q: %v", s, err)
		}
	}
}

func (b *bench) iperf() (float64, error) {
	if _, err := exec.LookPath("iperf3"); err != nil {
		return 0, err
	}
	srv, out, err := b.start(b.net.B, "iperf3", "-s", "-1", "-p", "5299")
	if err != nil {
		return 0, err
	}
	defer srv.Process.Kill()
	go io.Copy(io.Discard, out)
	time.Sleep(300 * time.Millisecond)
	res, err := b.net.A.Command("iperf3", "-c", b.net.B.Addr.Addr().String(), "-p", "5299", "-t", "3", "-J").Output()
	if err != nil {
		return 0, fmt.Errorf("iperf3: %v", err)
	}
	var r struct {
		End struct {
			SumReceived struct {
				Bps float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
	}
	if err := json.Unmarshal(res, &r); err != nil {
		return 0, err
	}
	g := r.End.SumReceived.Bps / 1e9
	fmt.Printf("   iperf3 single stream: %.2f Gbit/s\n", g)
	_ = srv.Wait()
	return g, nil
}

// helpers names the protocol of the baseline helpers run between the
// namespaces ("tcp", or "sdp" through the daemons whose control sockets
// envA and envB give) and each end's environment (nil: this process's).
type helpers struct {
	proto      string
	envA, envB []string
}

var kernelTCP = helpers{proto: "tcp"}

// serve starts h's helper server on B at addr (on the last CPU if pin) and
// waits until it listens.
func (b *bench) serve(h helpers, addr string, pin bool) (*exec.Cmd, error) {
	name, args := pinApp(pin, b.self, h.proto+"-server", addr)
	srv := b.net.B.Command(name, args...)
	srv.Env = h.envB
	srv.Stderr = os.Stderr
	out, err := srv.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := srv.Start(); err != nil {
		return nil, err
	}
	br, err := waitLine(out, "listening")
	if err != nil {
		srv.Process.Kill()
		return nil, err
	}
	go io.Copy(io.Discard, br)
	return srv, nil
}

// stream is h's stream of size-octet writes from A to B at addr, for the
// bench's seconds per point.
func (b *bench) stream(h helpers, addr string, size int) (Point, error) {
	srv, err := b.serve(h, addr, false)
	if err != nil {
		return Point{}, err
	}
	defer srv.Process.Kill()
	cli := b.net.A.Command(b.self, h.proto+"-stream", addr, strconv.Itoa(size), fmt.Sprint(b.seconds))
	cli.Env = h.envA
	cli.Stderr = os.Stderr
	res, err := cli.Output()
	if err != nil {
		return Point{}, fmt.Errorf("%s-stream: %v", h.proto, err)
	}
	_ = srv.Wait()
	var r struct {
		Bytes, Messages int64
		Seconds         float64
	}
	if err := json.Unmarshal(res, &r); err != nil {
		return Point{}, err
	}
	gb := float64(r.Bytes) / 1e9
	return Point{Size: size, Gbps: gb * 8 / r.Seconds, Mpps: float64(r.Messages) / r.Seconds / 1e6, Samples: int(r.Messages),
		CPUA: cpu(cli) / gb, CPUB: cpu(srv) / gb}, nil
}

// pingPong is h's 1-octet round trip between A and B at addr, both ends
// pinned to the last CPU.
func (b *bench) pingPong(h helpers, addr string) (Latency, error) {
	srv, err := b.serve(h, addr, true)
	if err != nil {
		return Latency{}, err
	}
	defer srv.Process.Kill()
	name, args := pinApp(true, b.self, h.proto+"-ping", addr, "5000")
	cli := b.net.A.Command(name, args...)
	cli.Env = h.envA
	cli.Stderr = os.Stderr
	res, err := cli.Output()
	if err != nil {
		return Latency{}, fmt.Errorf("%s-ping: %v", h.proto, err)
	}
	var l Latency
	err = json.Unmarshal(res, &l)
	return l, err
}

func (b *bench) tcpStream(size int) (Point, error) {
	p, err := b.stream(kernelTCP, net.JoinHostPort(b.net.B.Addr.Addr().String(), "5300"), size)
	if err == nil {
		fmt.Printf("   kernel TCP stream %7d B: %6.2f Gbit/s\n", size, p.Gbps)
	}
	return p, err
}

func (b *bench) tcpPingPong() (Latency, error) {
	l, err := b.pingPong(kernelTCP, net.JoinHostPort(b.net.B.Addr.Addr().String(), "5301"))
	if err == nil {
		fmt.Printf("   kernel TCP 1-byte ping-pong: median %.1f µs, p99 %.1f µs\n", l.Median, l.P99)
	}
	return l, err
}

// offloadsOn measures the kernel TCP stream at 64 KiB on a veth pair of
// its own with the offloads on: what the kernel gets from TSO and GSO.
func (b *bench) offloadsOn(mtu int) (float64, error) {
	pair, err := topology.New(topology.Options{Prefix: "srnbenchoff", MTU: mtu, Offloads: true})
	if err != nil {
		return 0, err
	}
	defer pair.Close()
	ob := *b
	ob.net = pair
	p, err := ob.tcpStream(65536)
	if err != nil {
		return 0, err
	}
	fmt.Printf("   (offloads on) kernel TCP stream 65536 B: %.2f Gbit/s\n", p.Gbps)
	return p.Gbps, nil
}

// softrnic measures the datapath with this tree's build: every bandwidth
// point of the three tests, then the two round trips.
// With the rig's daemons, the sdp column (issue 20) after them.
func (b *bench) softrnic(datapath string) (k Softrnc, s SDP, err error) {
	r, err := b.startRig(b.bin, datapath)
	if err != nil {
		return k, s, err
	}
	defer r.Close()
	defer func() {
		if err == nil {
			s, err = r.sdpColumn()
		}
	}()
	bw := func(test string) ([]Point, error) {
		var pts []Point
		for _, s := range sizes {
			p, err := r.bw(test, s)
			if err != nil {
				return nil, err
			}
			fmt.Printf("   %-8s %7d B: %6.2f Gbit/s\n", test, s, p.Gbps)
			pts = append(pts, p)
		}
		return pts, nil
	}
	if k.Write, err = bw("write_bw"); err != nil {
		return k, s, err
	}
	if k.Read, err = bw("read_bw"); err != nil {
		return k, s, err
	}
	if k.Send, err = bw("send_bw"); err != nil {
		return k, s, err
	}
	k.Rate64 = k.Write[0].Mpps
	lat := func(test string) (Latency, error) {
		l, err := r.lat(test)
		if err != nil {
			return l, err
		}
		fmt.Printf("   %-9s 8 B: median %.1f µs, p99 %.1f µs, p99.9 %.1f µs\n", test, l.Median, l.P99, l.P999)
		return l, nil
	}
	if k.WriteLat, err = lat("write_lat"); err != nil {
		return k, s, err
	}
	if k.ReadLat, err = lat("read_lat"); err != nil {
		return k, s, err
	}
	return k, s, nil
}

func num(v any) float64 {
	f, _ := v.(float64)
	return f
}

func table(r *Results) {
	for _, dp := range []string{"kernel", "xdp"} {
		tableOf(r, dp)
	}
	k, x := r.Datapaths["kernel"], r.Datapaths["xdp"]
	i64k := slices.Index(sizes, 65536)
	fmt.Printf("\n== issue 7 targets (one run, same veth pair)\n")
	w := x.Write[i64k].Gbps / r.KernelTCP[i64k].Gbps
	fmt.Printf("xdp Write 64 KiB / kernel TCP offloads off:  %.2fx (target >= 2x): %s\n", w, verdict(w >= 2))
	fmt.Printf("xdp Write 64 KiB / kernel TCP offloads on:   %.2fx (on the way to 1x)\n", x.Write[i64k].Gbps/r.KernelTCPOffloads64K)
	l := x.WriteLat.Median / r.KernelTCPLat.Median
	fmt.Printf("xdp 8 B Write RTT / TCP 1-byte ping-pong:    %.2fx (target <= 0.5x): %s\n", l, verdict(l <= 0.5))
	d := x.Write[i64k].Gbps / k.Write[i64k].Gbps
	fmt.Printf("xdp / kernel datapath, Write 64 KiB:         %.2fx (target >= 1.5x): %s\n", d, verdict(d >= 1.5))
	if b := r.Bare; b != nil {
		fmt.Printf("bare copy-mode AF_XDP on such a veth pair, no protocol, one busy-polling thread per end (MTU 1500):\n")
		fmt.Printf("   %.2f Gb/s of 1472-octet payload, %.2f with threaded NAPI; 64-octet ping-pong median %.1f µs\n",
			b.Gbps, b.GbpsThreaded, b.PingPong)
		fmt.Printf("   xdp Write 64 KiB / bare with threaded NAPI: %.2fx; 2x kernel TCP would be %.2fx of it\n",
			x.Write[i64k].Gbps/b.GbpsThreaded, 2*r.KernelTCP[i64k].Gbps/b.GbpsThreaded)
		fmt.Printf("   bare ping-pong / TCP ping-pong: %.2fx, with no application and no RNIC on either end\n",
			b.PingPong/r.KernelTCPLat.Median)
	}
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT met"
}

// bare runs the xsk package's bare AF_XDP benchmarks from the test binary
// bench.sh builds into bin (xsk.test) and reads their metrics.
func bare(bin string) (*Bare, error) {
	test := filepath.Join(bin, "xsk.test")
	if _, err := os.Stat(test); err != nil {
		return nil, err
	}
	fmt.Println("== bare copy-mode AF_XDP (the xsk package's benchmarks)")
	out, err := exec.Command(test, "-test.run", "^$", "-test.bench", "^BenchmarkXSKRx$/^native$/^xsk$/^1472$|^BenchmarkXSKPingPong$",
		"-test.benchtime", "1000000x").CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("%s: %v\n%s", test, err, out)
	}
	var b Bare
	metric := func(line, unit string) float64 {
		f := strings.Fields(line)
		for i := 1; i < len(f); i++ {
			if f[i] == unit {
				v, _ := strconv.ParseFloat(f[i-1], 64)
				return v
			}
		}
		return 0
	}
	for _, line := range strings.Split(string(out), "\n") {
		switch {
		case strings.HasPrefix(line, "BenchmarkXSKRx/native/xsk/1472/threaded"):
			b.GbpsThreaded = metric(line, "payload-Gb/s")
		case strings.HasPrefix(line, "BenchmarkXSKRx/native/xsk/1472"):
			b.Gbps = metric(line, "payload-Gb/s")
		case strings.HasPrefix(line, "BenchmarkXSKPingPong"):
			b.PingPong = metric(line, "median-µs")
		}
	}
	if b.Gbps == 0 || b.GbpsThreaded == 0 || b.PingPong == 0 {
		return nil, fmt.Errorf("metrics missing from:\n%s", out)
	}
	fmt.Printf("   %.2f Gb/s, %.2f Gb/s with threaded NAPI; ping-pong median %.1f µs\n", b.Gbps, b.GbpsThreaded, b.PingPong)
	return &b, nil
}

func tableOf(r *Results, dp string) {
	k := r.Datapaths[dp]
	fmt.Printf("\n== softrnic %s datapath (MTU %d, CRC %v; ratios to kernel TCP in the same run)\n", dp, r.MTU, r.CRC)
	fmt.Printf("%-8s | %-16s | %-22s | %-22s | %-22s | %-20s | %s\n", "size", "kernel TCP Gb/s", "Write Gb/s (ratio)", "Read Gb/s (ratio)",
		"Send Gb/s (ratio)", "CPU s/GB A/B (Write)", "kernel TCP CPU s/GB A/B")
	for i, s := range sizes {
		fmt.Printf("%-8d | %-16.2f | %6.2f (%5.2fx)        | %6.2f (%5.2fx)        | %6.2f (%5.2fx)        | %-20s | %.2f / %.2f\n", s,
			r.KernelTCP[i].Gbps, k.Write[i].Gbps, k.Write[i].Ratio, k.Read[i].Gbps, k.Read[i].Ratio, k.Send[i].Gbps, k.Send[i].Ratio,
			fmt.Sprintf("%.2f / %.2f", k.Write[i].CPUA, k.Write[i].CPUB), r.KernelTCP[i].CPUA, r.KernelTCP[i].CPUB)
	}
	fmt.Printf("iperf3 single stream: %.2f Gb/s; kernel TCP 64 KiB with offloads on: %.2f Gb/s\n", r.IperfGbps, r.KernelTCPOffloads64K)
	fmt.Printf("kernel TCP 1-byte ping-pong: median %.1f µs p99 %.1f µs p99.9 %.1f µs\n", r.KernelTCPLat.Median, r.KernelTCPLat.P99, r.KernelTCPLat.P999)
	fmt.Printf("softrnic 8 B Write latency: median %.1f µs (%.2fx) p99 %.1f µs p99.9 %.1f µs\n", k.WriteLat.Median, k.WriteLat.Ratio, k.WriteLat.P99, k.WriteLat.P999)
	fmt.Printf("softrnic 8 B Read  latency: median %.1f µs (%.2fx) p99 %.1f µs p99.9 %.1f µs\n", k.ReadLat.Median, k.ReadLat.Ratio, k.ReadLat.P99, k.ReadLat.P999)
	fmt.Printf("softrnic 64 B Write message rate: %.3f Mpps (kernel TCP 64 B writes: %.3f Mpps)\n", k.Rate64, r.KernelTCP[0].Mpps)
}

// Baseline helpers, run inside the namespaces: kernel TCP, or with useSDP
// the sdp package's net.Conn.

// useSDP: the helpers listen and dial with sdp (issue 20's column).
var useSDP bool

func listen(addr string) (net.Listener, error) {
	if useSDP {
		return sdpListen(addr)
	}
	return net.Listen("tcp4", addr)
}

func dial(addr string) (net.Conn, error) {
	if useSDP {
		return sdpDial(addr)
	}
	return net.Dial("tcp4", addr)
}

type noDelayer interface{ SetNoDelay(bool) error }

type writeCloser interface{ CloseWrite() error }

func tcpServer(addr string) error {
	ln, err := listen(addr)
	if err != nil {
		return err
	}
	fmt.Println("listening")
	c, err := ln.Accept()
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.(noDelayer).SetNoDelay(true)
	var mode [1]byte
	if _, err := io.ReadFull(c, mode[:]); err != nil {
		return err
	}
	if mode[0] == 'P' {
		var one [1]byte
		for {
			if _, err := io.ReadFull(c, one[:]); err != nil {
				return nil
			}
			if _, err := c.Write(one[:]); err != nil {
				return nil
			}
		}
	}
	_, err = io.Copy(io.Discard, c)
	return err
}

func tcpStream(args []string) error {
	size, _ := strconv.Atoi(args[1])
	secs, _ := strconv.ParseFloat(args[2], 64)
	c, err := dial(args[0])
	if err != nil {
		return err
	}
	_ = c.(noDelayer).SetNoDelay(true)
	if _, err := c.Write([]byte{'S'}); err != nil {
		return err
	}
	msg := make([]byte, size)
	start := time.Now()
	var n, msgs int64
	for time.Since(start).Seconds() < secs {
		k, err := c.Write(msg)
		if err != nil {
			return err
		}
		n += int64(k)
		msgs++
	}
	_ = c.(writeCloser).CloseWrite()
	// Wait for the peer to read everything: its close ends our read.
	_, _ = io.Copy(io.Discard, c)
	el := time.Since(start).Seconds()
	c.Close()
	return json.NewEncoder(os.Stdout).Encode(map[string]any{"Bytes": n, "Messages": msgs, "Seconds": el})
}

func tcpPing(args []string) error {
	n, _ := strconv.Atoi(args[1])
	c, err := dial(args[0])
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.(noDelayer).SetNoDelay(true)
	if _, err := c.Write([]byte{'P'}); err != nil {
		return err
	}
	var one [1]byte
	lat := make([]float64, 0, n)
	for i := 0; i < n; i++ {
		t0 := time.Now()
		if _, err := c.Write(one[:]); err != nil {
			return err
		}
		if _, err := io.ReadFull(c, one[:]); err != nil {
			return err
		}
		lat = append(lat, float64(time.Since(t0).Nanoseconds())/1e3)
	}
	slices.Sort(lat)
	return json.NewEncoder(os.Stdout).Encode(Latency{Median: lat[n/2], P99: lat[n*99/100], P999: lat[min(n-1, n*999/1000)]})
}

// waitSocket waits for a daemon's socket to appear, failing after limit.
func waitSocket(path string, limit time.Duration) error {
	for end := time.Now().Add(limit); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(path); err == nil {
			return nil
		}
	}
	return fmt.Errorf("softrnicd did not create %s within %v", path, limit)
}
