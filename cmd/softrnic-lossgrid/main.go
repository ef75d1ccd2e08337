// Command softrnic-lossgrid is the TCP loss benchmark (issue 18): a bulk
// stream over one impaired link, Linux ↔ Linux beside the engine ↔ Linux,
// Linux ↔ engine and engine ↔ engine, at each point of a grid of loss,
// reordering, duplication and delay (internal/lossgrid).
//
//	softrnic-lossgrid [--seconds 3] [--seed 1] [--rounds 1] [--points 'loss 1%,clean'] [--pairs linux→linux,engine→linux]
//	                  [--linux-cc cubic] [--json FILE] [--results FILE]
//
// --rounds runs the grid that many times, round r with seed + r, and reads
// the targets from each point's median. --results adds the run under "lossgrid" to an existing results.json
// (make bench's). Run as root: it makes two network namespaces.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/softrnic/softrnic/internal/lossgrid"
	"github.com/softrnic/softrnic/internal/results"
	"github.com/softrnic/softrnic/internal/topology"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "softrnic-lossgrid:", err)
		os.Exit(1)
	}
}

func run() error {
	seconds := flag.Float64("seconds", 3, "length of each stream")
	seed := flag.Uint64("seed", 1, "seed of the impairments (round r: seed + r)")
	rounds := flag.Int("rounds", 1, "times to run the grid; the targets are read from each point's median")
	points := flag.String("points", "", "comma-separated point names to run (default: the whole grid)")
	pairs := flag.String("pairs", "", "comma-separated pairs (linux→linux, engine→linux, linux→engine, engine→engine; -> works for →)")
	jsonOut := flag.String("json", "", "write the results to this file")
	resultsOut := flag.String("results", "", "add the results under \"lossgrid\" to this results.json")
	linuxCC := flag.String("linux-cc", "cubic", "congestion control of the Linux sides (cubic is the engine's)")
	flag.Parse()
	o := lossgrid.Options{Duration: time.Duration(*seconds * float64(time.Second)), Seed: *seed, Rounds: *rounds, Progress: os.Stdout, LinuxCC: *linuxCC}
	if *points != "" {
		byName := map[string]lossgrid.Point{}
		for _, p := range lossgrid.Grid() {
			byName[p.Name] = p
		}
		for _, n := range strings.Split(*points, ",") {
			p, ok := byName[strings.TrimSpace(n)]
			if !ok {
				return fmt.Errorf("--points: no point %q in the grid", n)
			}
			o.Points = append(o.Points, p)
		}
	}
	if *pairs != "" {
		for _, n := range strings.Split(strings.ReplaceAll(*pairs, "->", "→"), ",") {
			found := false
			for _, p := range lossgrid.Pairs {
				if p.String() == strings.TrimSpace(n) {
					o.Pairs, found = append(o.Pairs, p), true
				}
			}
			if !found {
				return fmt.Errorf("--pairs: no pair %q", n)
			}
		}
	}
	if os.Geteuid() != 0 {
		return errors.New("needs root (network namespaces, TUN devices)")
	}
	br, err := topology.OpenTunBridge("srnlg", 1500)
	if err != nil {
		return err
	}
	defer br.Close()
	rs, err := lossgrid.Run(br, o)
	if err != nil {
		return err
	}
	fmt.Printf("\n== TCP loss grid: %v streams, one impairment on both directions, %d round(s) from seed %d, Linux %s, engine %s\n",
		o.Duration, max(*rounds, 1), *seed, *linuxCC, "cubic")
	lossgrid.Print(os.Stdout, rs)
	doc := map[string]any{"seconds": *seconds, "seed": *seed, "rounds": max(*rounds, 1), "linux_cc": *linuxCC, "results": rs, "targets": lossgrid.Verdicts(rs)}
	if *jsonOut != "" {
		if err := results.Write(*jsonOut, doc); err != nil {
			return err
		}
	}
	if *resultsOut != "" {
		return results.Merge(*resultsOut, "lossgrid", doc)
	}
	return nil
}
