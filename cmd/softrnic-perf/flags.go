package main

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"strconv"
	"time"
)

// newFlagSet defines softrnic-perf's flags into o; o.test and o.isLatency
// must be set (the default size depends on them). Flags perftest also has
// take perftest's values: -D takes whole seconds as perftest's does.
func newFlagSet(o *opts, h flag.ErrorHandling) *flag.FlagSet {
	fs := flag.NewFlagSet(o.test, h)
	defSize := 65536
	if o.isLatency {
		defSize = 2
	}
	fs.IntVar(&o.size, "s", defSize, "message size")
	fs.BoolVar(&o.all, "a", false, "all sizes 2 B .. 8 MiB")
	fs.IntVar(&o.iters, "n", 0, "iterations (default 5000 for bandwidth, 1000 for latency)")
	fs.Var((*seconds)(&o.duration), "D", "run for this many `seconds` (or this long: 1500ms, 2m) instead of -n")
	fs.IntVar(&o.qps, "q", 1, "queue pairs, each with -n iterations (bandwidth tests)")
	fs.IntVar(&o.port, "p", 18515, "port")
	fs.IntVar(&o.depth, "t", 128, "queue depth (outstanding requests)")
	fs.BoolVar(&o.gbits, "report_gbits", false, "report bandwidth in Gb/s")
	fs.StringVar(&o.socket, "socket", "", "softrnicd control socket")
	fs.BoolVar(&o.verify, "verify", false, "check the data moved")
	fs.BoolVar(&o.jsonOut, "json", false, "print results as JSON")
	fs.BoolVar(&o.noCRC, "no-crc", false, "do not ask for MPA CRC")
	fs.IntVar(&o.mpaRev, "mpa-rev", 2, "MPA revision: 2 (RFC 6581) or 1 (RFC 5044)")
	fs.BoolVar(&o.p2p, "p2p", false, "peer-to-peer model: the client sends an RTR message first (MPA revision 2)")
	fs.StringVar(&o.rtrArg, "rtr", "", "with --p2p, the RTR messages the client offers or the server accepts: write, read, send, joined by commas (default write,read)")
	fs.BoolVar(&o.perftest, "perftest", false, "speak perftest's -R exchange (write_bw, read_bw), to test against ib_*_bw -R")
	fs.DurationVar(&o.timeout, "timeout", 10*time.Minute, "give up after this long")
	fs.BoolVar(&o.polled, "poll", false, "bandwidth tests: take completions by polling (yielding between looks unless --busy) instead of sleeping; with -t 1 each operation's time is its post-to-completion latency, as dapltest -T P measures it")
	fs.BoolVar(&o.busy, "busy", false, "latency tests: spin on memory or completions without yielding the processor between looks, as perftest does")
	return fs
}

// seconds is a duration flag that also takes a bare count of whole
// seconds, as perftest's -D does ("-D 5"); a Go duration ("5s", "1500ms")
// is taken as well.
type seconds time.Duration

func (s *seconds) String() string { return time.Duration(*s).String() }

func (s *seconds) Set(v string) error {
	d, err := parseSeconds(v)
	if err != nil {
		return err
	}
	*s = seconds(d)
	return nil
}

var errSeconds = errors.New("want whole seconds (5) or a duration (5s, 1500ms)")

// parseSeconds parses whole seconds or a Go duration, neither negative.
func parseSeconds(v string) (time.Duration, error) {
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n < 0 {
			return 0, fmt.Errorf("%s is negative: %w", v, errSeconds)
		}
		if n > math.MaxInt64/int64(time.Second) {
			return 0, fmt.Errorf("%s seconds is too long", v)
		}
		return time.Duration(n) * time.Second, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, errSeconds
	}
	if d < 0 {
		return 0, fmt.Errorf("%s is negative: %w", v, errSeconds)
	}
	return d, nil
}
