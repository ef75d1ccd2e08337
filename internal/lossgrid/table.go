package lossgrid

import (
	"fmt"
	"io"
	"strings"

	"github.com/softrnic/softrnic/internal/results"
)

// Targets of issue 18, read against Linux → Linux at the same point.
const (
	// TargetGoodput: engine → Linux at least this share of Linux's
	// goodput at every point, and TargetGoodputLowLoss at 0.1% and 1%.
	TargetGoodput        = 0.8
	TargetGoodputLowLoss = 1.0
)

// Verdict is one point's targets.
type Verdict struct {
	Point string
	// GoodputRatio is engine→linux over linux→linux, the median of
	// Ratios (one per round that has both); Want the bound.
	GoodputRatio, Want float64
	Ratios             []float64
	GoodputMet         bool
	// RTOSeconds of each, summed over the rounds; RTOMet: the engine
	// spent no longer in RTO.
	EngineRTOSeconds, LinuxRTOSeconds float64
	RTOMet                            bool
}

// Verdicts reads the targets off results holding linux→linux and
// engine→linux at each point, in one or more rounds.
func Verdicts(rs []Result) []Verdict {
	var out []Verdict
	at := map[string]int{} // point → index in out
	for _, ref := range rs {
		if ref.Pair != (Pair{Linux, Linux}).String() {
			continue
		}
		for _, r := range rs {
			if r.Point != ref.Point || r.Round != ref.Round || r.Pair != (Pair{Engine, Linux}).String() {
				continue
			}
			i, ok := at[r.Point]
			if !ok {
				i = len(out)
				at[r.Point] = i
				v := Verdict{Point: r.Point, Want: TargetGoodput, GoodputMet: true, RTOMet: true}
				if r.Point == "loss 0.1%" || r.Point == "loss 1%" {
					v.Want = TargetGoodputLowLoss
				}
				out = append(out, v)
			}
			v := &out[i]
			ratio := 0.0
			if ref.Mbps > 0 {
				ratio = r.Mbps / ref.Mbps
			}
			v.Ratios = append(v.Ratios, ratio)
			v.EngineRTOSeconds += r.Wire.RTOSeconds
			v.LinuxRTOSeconds += ref.Wire.RTOSeconds
			// A stream that failed or was not verified fails the point
			// whatever the median.
			v.GoodputMet = v.GoodputMet && r.Verified && ref.Verified
			v.RTOMet = v.RTOMet && r.Verified
		}
	}
	for i := range out {
		v := &out[i]
		v.GoodputRatio = results.Median(v.Ratios)
		v.GoodputMet = v.GoodputMet && v.GoodputRatio >= v.Want
		// Within one RTO gap a round of Linux's: one stall either way
		// is the link's luck, not the engine's.
		v.RTOMet = v.RTOMet && v.EngineRTOSeconds <= v.LinuxRTOSeconds+float64(len(v.Ratios))*RTOGap.Seconds()
	}
	return out
}

// Print writes the grid: each point's streams with their ratios to
// Linux → Linux, then the targets.
func Print(w io.Writer, rs []Result) {
	fmt.Fprintf(w, "%-16s %5s %-14s %9s %6s %8s %7s %9s %5s %7s %8s %6s %6s  %s\n",
		"point", "round", "pair", "Mbit/s", "×linux", "data seg", "rtx", "spurious", "RTOs", "RTO s", "rtx×lnx", "loss%", "qdrop", "")
	type key struct {
		point string
		round int
	}
	ref := map[key]Result{}
	for _, r := range rs {
		if r.Pair == (Pair{Linux, Linux}).String() {
			ref[key{r.Point, r.Round}] = r
		}
	}
	last := ""
	for _, r := range rs {
		if r.Point != last && last != "" {
			fmt.Fprintln(w)
		}
		last = r.Point
		l, ok := ref[key{r.Point, r.Round}]
		ratio := func(a, b float64) string {
			if !ok || b == 0 {
				return "-"
			}
			return fmt.Sprintf("%.2f", a/b)
		}
		rtxShare := func(x Result) float64 {
			if x.Wire.DataSegments == 0 {
				return 0
			}
			return float64(x.Wire.Retransmits) / float64(x.Wire.DataSegments)
		}
		fmt.Fprintf(w, "%-16s %5d %-14s %9.1f %6s %8d %7d %9d %5d %7.2f %8s %6.2f %6d  %s\n",
			r.Point, r.Round, r.Pair, r.Mbps, ratio(r.Mbps, l.Mbps), r.Wire.DataSegments, r.Wire.Retransmits, r.Wire.Spurious,
			r.Wire.RTOs, r.Wire.RTOSeconds, ratio(rtxShare(r), rtxShare(l)), 100*r.Link.DataLoss, r.Link.QueueDrops, verdict(r))
	}
	vs := Verdicts(rs)
	if len(vs) == 0 {
		return
	}
	fmt.Fprintf(w, "\n== issue 18 targets: engine → Linux against Linux → Linux at each point (the median of its rounds)\n")
	met := func(b bool) string {
		if b {
			return "met"
		}
		return "NOT met"
	}
	for _, v := range vs {
		rounds := make([]string, len(v.Ratios))
		for i, x := range v.Ratios {
			rounds[i] = fmt.Sprintf("%.2f", x)
		}
		fmt.Fprintf(w, "%-16s goodput %.2f× (want ≥ %.1f×) %-8s  time in RTO %.2f s vs %.2f s %-8s  rounds %s\n",
			v.Point, v.GoodputRatio, v.Want, met(v.GoodputMet), v.EngineRTOSeconds, v.LinuxRTOSeconds, met(v.RTOMet),
			strings.Join(rounds, " "))
	}
	fmt.Fprintf(w, "%s\n", strings.Repeat("-", 20))
	fmt.Fprintf(w, "(rtx×lnx: the share of data segments retransmitted, over Linux's; loss%%: A→B packets the link dropped;\n qdrop: packets a kernel's TUN queue dropped before the pump read them, losses the link did not make)\n")
}
