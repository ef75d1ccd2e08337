// Command softrnicd is the softrnic daemon: it owns the software RNIC of one
// network interface and serves applications on a Unix socket.
//
//	softrnicd --iface IFACE [--datapath kernel|xdp] [--xdp-mode auto|native|generic] [--napi MODE] [--cpus LIST] [--socket PATH] [--pollers N] [--log-level L]
//	softrnicd --stats (--iface IFACE | --socket PATH)
//
// --stats prints the statistics of the daemon running on that socket (its
// sessions, this one included, its objects, and the stalls its watchdog
// logged) and exits.
package main

import (
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"github.com/softrnic/softrnic/daemon"
)

func main() {
	iface := flag.String("iface", "", "network interface to serve (required)")
	datapath := flag.String("datapath", "kernel", "datapath: kernel (MPA over kernel TCP) or xdp")
	socket := flag.String("socket", "", "control socket path (default /run/softrnic/IFACE.sock)")
	pollers := flag.Int("pollers", 0, "completion vectors: on the xdp datapath the pinned pollers, one per receive queue (default: the queues, at most the CPUs); on the kernel datapath default the CPUs")
	cpus := flag.String("cpus", "", "CPUs the xdp pollers are pinned to, in turn, as a comma-separated list (default: poller i on CPU i)")
	imp := flag.String("impair", "", "test facility: degrade the xdp datapath's link both ways in process, e.g. loss=0.5%,reorder=0.5%,seed=1 (keys: loss duplicate reorder delay jitter seed)")
	xdpMode := flag.String("xdp-mode", "auto", "XDP attach mode on the xdp datapath: auto, native or generic")
	napi := flag.String("napi", "auto", "where the kernel runs the interface's receive work on the xdp datapath: auto (adaptive on veth, keep elsewhere), adaptive (threaded NAPI while a stream arrives), threaded, softirq or keep")
	ibPort := flag.Int("ib-port", daemon.DefaultIBConnPort, "TCP port on which the daemon takes, and to which it makes, the connections of QPs that verbs programs connect the InfiniBand way (ibv_modify_qp to RTR with the peer's QP number, as perftest without -R does); the same for every daemon of a network; -1: none")
	level := flag.String("log-level", "info", "log level: debug, info, warn, error")
	stats := flag.Bool("stats", false, "print the statistics of the daemon running on --socket (or --iface's socket) and exit")
	flag.Parse()
	if *stats && flag.NArg() == 0 && (*iface != "" || *socket != "") {
		if err := printStats(os.Stdout, *socket, *iface); err != nil {
			fmt.Fprintf(os.Stderr, "softrnicd --stats: %v\n", err)
			os.Exit(1)
		}
		return
	}
	if *iface == "" || flag.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "usage: softrnicd --iface IFACE [--datapath kernel|xdp] [--xdp-mode auto|native|generic] [--napi MODE] [--cpus LIST] [--socket PATH] [--pollers N] [--log-level L]\n       softrnicd --stats (--iface IFACE | --socket PATH)")
		os.Exit(2)
	}
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(*level)); err != nil {
		fmt.Fprintf(os.Stderr, "softrnicd: --log-level %q: %v\n", *level, err)
		os.Exit(2)
	}
	var cpuList []int
	if *cpus != "" {
		for _, f := range strings.Split(*cpus, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 0 || n >= runtime.NumCPU() {
				fmt.Fprintf(os.Stderr, "softrnicd: --cpus %q: %q is not a CPU of this machine (0..%d)\n", *cpus, f, runtime.NumCPU()-1)
				os.Exit(2)
			}
			cpuList = append(cpuList, n)
		}
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lv}))
	srv, err := daemon.New(daemon.Options{Iface: *iface, Datapath: *datapath, Socket: *socket, Pollers: *pollers, XDPMode: *xdpMode, NAPI: *napi, CPUs: cpuList, Impair: *imp, IBConnPort: *ibPort, Logger: log})
	if err != nil {
		fmt.Fprintf(os.Stderr, "softrnicd: %v\n", err)
		os.Exit(1)
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		s := <-sigs
		log.Info("stopping", "signal", s.String())
		srv.Close()
	}()
	// SIGUSR1: the state of every QP and poller in the log, for a
	// connection that stopped.
	dump := make(chan os.Signal, 1)
	signal.Notify(dump, syscall.SIGUSR1)
	go func() {
		for range dump {
			srv.Dump()
		}
	}()
	if err := srv.Serve(); err != nil {
		fmt.Fprintf(os.Stderr, "softrnicd: %v\n", err)
		os.Exit(1)
	}
}
