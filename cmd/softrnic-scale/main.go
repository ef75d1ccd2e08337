// Command softrnic-scale is issue 16's scale benchmark: per datapath, two
// namespaces, a softrnicd in each, and one client process per side; the
// active one connects N QPs to the passive one, and the command reports
// daemon memory and descriptors per idle QP, idle CPU, setup rate per
// batch, memory after closing all and after churn, the time the passive
// daemon takes to stop on SIGTERM with every QP live (and whether every
// peer is told), and that data still moves verified afterwards, with the
// issue's targets marked met or NOT met. `make bench` runs it at N=10,000.
//
//	softrnic-scale [--bin DIR] [--datapath kernel,xdp] [-n 10000] [--batch 1000]
//	               [--churn-rounds 3] [--churn-size N/5] [--settle 3s] [--idle 5s] [--late-reading D]
//	               [--teardown-limit 2m] [--data-size 4194304] [--nofile 1024:524288]
//	               [--mem-guard MiB] [--logs DIR] [--json FILE] [--results FILE]
//
// DIR holds softrnicd and softrnic-scale (default: this command's
// directory). --results adds the run under "scale" to an existing
// results.json (make bench's). Run as root. `softrnic-scale client ...` is
// the client process the command runs in each namespace.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/softrnic/softrnic/internal/results"
	"github.com/softrnic/softrnic/internal/scale"
	"github.com/softrnic/softrnic/internal/topology"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "client" {
		exit(clientMain(os.Args[2:]))
	}
	var f flags
	flag.StringVar(&f.bin, "bin", "", "directory with softrnicd and softrnic-scale (default: this command's)")
	flag.StringVar(&f.datapaths, "datapath", "kernel,xdp", "datapaths to measure, comma-separated")
	flag.IntVar(&f.n, "n", 10000, "QPs to connect")
	flag.IntVar(&f.batch, "batch", 1000, "QPs connected at a time")
	flag.IntVar(&f.rounds, "churn-rounds", 3, "rounds of opening and closing --churn-size QPs, after the first close")
	flag.IntVar(&f.churn, "churn-size", 0, "QPs per churn round (default N/5)")
	flag.DurationVar(&f.settle, "settle", 3*time.Second, "idle time before each memory reading")
	flag.DurationVar(&f.idle, "idle", 5*time.Second, "window of the idle CPU measurement")
	flag.DurationVar(&f.late, "late-reading", 0, "read the daemons' memory again this long after the churn (e.g. 150s: past the Go runtime's periodic GC)")
	flag.DurationVar(&f.teardown, "teardown-limit", 2*time.Minute, "how long the passive daemon may take to exit on SIGTERM before it is killed")
	flag.IntVar(&f.dataSize, "data-size", 4<<20, "octets of the data checks' RDMA Write")
	flag.StringVar(&f.nofile, "nofile", scale.SystemdNoFile, "RLIMIT_NOFILE soft:hard of the daemons and clients at start (default: a systemd service's)")
	flag.Int64Var(&f.guardMiB, "mem-guard", 0, "MiB of RSS, both daemons together, past which they are killed and the run stops (default: 40% of the machine's memory)")
	flag.StringVar(&f.json, "json", "", "write the results to this file")
	flag.StringVar(&f.results, "results", "", "add the results under \"scale\" to this results.json")
	flag.StringVar(&f.logs, "logs", "", "keep the daemons' and clients' logs in this directory (default: removed)")
	flag.Parse()
	if flag.NArg() != 0 || f.n <= 0 {
		flag.Usage()
		os.Exit(2)
	}
	exit(run(f))
}

type flags struct {
	bin, datapaths, nofile, json, results, logs string
	n, batch, rounds, churn, dataSize           int
	guardMiB                                    int64
	settle, idle, late, teardown                time.Duration
}

func run(f flags) error {
	if os.Geteuid() != 0 {
		return errors.New("needs root (network namespaces)")
	}
	if f.bin == "" {
		self, err := os.Executable()
		if err != nil {
			return err
		}
		f.bin = filepath.Dir(self)
	}
	dir := f.logs
	if dir == "" {
		d, err := os.MkdirTemp("", "softrnic-scale")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		dir = d
	}
	var current atomic.Pointer[topology.Pair]
	// A run takes minutes: an interrupted one still removes what it
	// made. Every process in the pair's namespaces is one this command
	// started, and Close kills those.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	go func() {
		s, ok := <-sigs
		if !ok {
			return
		}
		fmt.Fprintf(os.Stderr, "softrnic-scale: %v: cleaning up\n", s)
		if p := current.Load(); p != nil {
			_ = p.Close()
		}
		if f.logs == "" {
			os.RemoveAll(dir)
		}
		os.Exit(1)
	}()
	var rs []*scale.Result
	for _, dp := range strings.Split(f.datapaths, ",") {
		fmt.Printf("== scale: %s datapath, %d QPs\n", dp, f.n)
		pair, err := topology.New(topology.Options{Prefix: "srnscale"})
		if err != nil {
			return err
		}
		current.Store(pair)
		r, err := scale.Run(scale.Options{Pair: pair, Bin: f.bin, Datapath: dp, N: f.n, Batch: f.batch, ChurnRounds: f.rounds,
			ChurnSize: f.churn, Settle: f.settle, Idle: f.idle, LateReading: f.late, TeardownLimit: f.teardown, DataSize: f.dataSize, NoFile: f.nofile,
			MemGuard: f.guardMiB << 20, Dir: filepath.Join(dir, dp), Progress: os.Stdout})
		current.Store(nil)
		if cerr := pair.Close(); cerr != nil {
			fmt.Fprintln(os.Stderr, "softrnic-scale:", cerr)
		}
		if err != nil {
			fmt.Printf("   %s: could not run: %v\n", dp, err)
			r = &scale.Result{Datapath: dp, N: f.n, Errors: []string{err.Error()}}
		}
		rs = append(rs, r)
	}
	scale.Print(os.Stdout, rs)
	out := map[string]any{"targets": scale.Targets(rs)}
	for _, r := range rs {
		out[r.Datapath] = r
	}
	if f.json != "" {
		if err := results.Write(f.json, out); err != nil {
			return err
		}
	}
	if f.results != "" {
		return results.Merge(f.results, "scale", out)
	}
	return nil
}

// clientMain is a client process (internal/scale's client side).
func clientMain(args []string) error {
	fl := flag.NewFlagSet("client", flag.ContinueOnError)
	var o scale.ClientOptions
	var port uint
	fl.StringVar(&o.Role, "role", "", "active or passive")
	fl.StringVar(&o.Socket, "socket", "", "the daemon's control socket")
	fl.StringVar(&o.Peer, "peer", "", "active: the passive side's host:port")
	fl.UintVar(&port, "port", 0, "passive: port to listen on")
	fl.IntVar(&o.DataSize, "data-size", 4<<20, "passive: octets of the RDMA Write target")
	fl.DurationVar(&o.ConnectTimeout, "connect-timeout", 30*time.Second, "active: each Connect's timeout")
	if err := fl.Parse(args); err != nil {
		return err
	}
	if port > 1<<16-1 {
		return fmt.Errorf("--port %d", port)
	}
	o.Port = uint16(port)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return scale.RunClient(ctx, o, os.Stdin, os.Stdout)
}

func exit(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "softrnic-scale:", err)
		os.Exit(1)
	}
	os.Exit(0)
}
