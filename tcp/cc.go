package tcp

import (
	"fmt"
	"math"
	"sort"
	"time"
)

// Window is the congestion state a CongestionControl works on, in octets.
type Window struct {
	Cwnd, Ssthresh int
	MSS            int
}

// CongestionControl is a congestion control algorithm (RFC 5681's
// framework). The connection runs loss recovery itself (RFC 6675) and calls
// the algorithm for window changes.
type CongestionControl interface {
	// OnAck: acked octets were newly acknowledged outside loss recovery.
	// limited says the window limited what was sent, so it may grow;
	// rtt is the connection's smoothed round-trip time.
	OnAck(now Time, acked int, limited bool, rtt time.Duration)
	// OnLoss: loss detected by SACK or duplicate ACKs; fast recovery
	// starts. flight is the octets outstanding.
	OnLoss(now Time, flight int)
	// OnRTO: the retransmission timer expired.
	OnRTO(now Time, flight int)
}

var ccRegistry = map[string]func(*Window) CongestionControl{
	"newreno": func(w *Window) CongestionControl { return &newReno{w: w} },
	"cubic":   func(w *Window) CongestionControl { return &cubic{w: w} },
}

// CongestionControls lists the algorithms by name.
func CongestionControls() []string {
	var names []string
	for n := range ccRegistry {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func newCC(name string, w *Window) (CongestionControl, error) {
	f, ok := ccRegistry[name]
	if !ok {
		return nil, fmt.Errorf("tcp: unknown congestion control %q (have %v)", name, CongestionControls())
	}
	return f(w), nil
}

// slowStart grows the window by the octets acknowledged, at most two
// segments per ACK (RFC 3465 §2.2, L = 2*SMSS), and returns what is left
// once cwnd reaches ssthresh.
func slowStart(w *Window, acked int) int {
	inc := min(acked, 2*w.MSS, w.Ssthresh-w.Cwnd)
	w.Cwnd += inc
	if w.Cwnd < w.Ssthresh {
		return 0
	}
	return acked - inc
}

// newReno is RFC 5681 congestion avoidance with byte counting; the fast
// recovery of RFC 6582 is the connection's (it keeps recovery until all
// data outstanding at loss is acknowledged).
type newReno struct {
	w     *Window
	acked int // octets acknowledged toward the next cwnd increase
}

func (r *newReno) OnAck(now Time, acked int, limited bool, rtt time.Duration) {
	if !limited {
		return
	}
	if r.w.Cwnd < r.w.Ssthresh {
		acked = slowStart(r.w, acked)
	}
	r.acked += acked
	if r.acked >= r.w.Cwnd {
		r.acked -= r.w.Cwnd
		r.w.Cwnd += r.w.MSS
	}
}

func (r *newReno) OnLoss(now Time, flight int) {
	r.w.Ssthresh = max(flight/2, 2*r.w.MSS) // RFC 5681 (4)
	r.w.Cwnd = r.w.Ssthresh
	r.acked = 0
}

func (r *newReno) OnRTO(now Time, flight int) {
	r.w.Ssthresh = max(flight/2, 2*r.w.MSS)
	r.w.Cwnd = r.w.MSS // the loss window
	r.acked = 0
}

// CUBIC constants (RFC 9438 §4.1, §5).
const (
	cubicC    = 0.4
	cubicBeta = 0.7
)

// cubic is RFC 9438 CUBIC with fast convergence and the Reno-friendly
// region, window in segments.
type cubic struct {
	w *Window
	// wMax is the window (segments) before the last reduction; k the time
	// (s) the cubic function takes to get back to it; epoch the start of
	// the current congestion avoidance stage (0: not started).
	wMax, k float64
	epoch   Time
	// wEst is the Reno-friendly estimate (segments); frac keeps the
	// fractional part of cwnd growth.
	wEst, frac float64
}

func (c *cubic) segs() float64 { return float64(c.w.Cwnd) / float64(c.w.MSS) }

func (c *cubic) OnAck(now Time, acked int, limited bool, rtt time.Duration) {
	if !limited {
		return
	}
	if c.w.Cwnd < c.w.Ssthresh {
		if acked = slowStart(c.w, acked); acked == 0 {
			return
		}
	}
	cwnd := c.segs()
	if c.epoch == 0 {
		c.epoch = now
		if cwnd < c.wMax {
			c.k = math.Cbrt((c.wMax - cwnd) / cubicC) // RFC 9438 (2)
		} else {
			c.k, c.wMax = 0, cwnd
		}
		c.wEst = cwnd
	}
	t := now.Sub(c.epoch).Seconds() + rtt.Seconds()
	target := cubicC*math.Pow(t-c.k, 3) + c.wMax // RFC 9438 (1)
	// §4.4: the target stays within [cwnd, 1.5*cwnd].
	target = math.Max(cwnd, math.Min(target, 1.5*cwnd))
	segsAcked := float64(acked) / float64(c.w.MSS)
	// §4.3: the Reno-friendly region, alpha = 3(1-beta)/(1+beta).
	alpha := 3 * (1 - cubicBeta) / (1 + cubicBeta)
	c.wEst += alpha * segsAcked / cwnd
	var inc float64
	if c.wEst > target {
		inc = (c.wEst - cwnd) / cwnd * segsAcked
	} else {
		inc = (target - cwnd) / cwnd * segsAcked // §4.5
	}
	c.frac += inc * float64(c.w.MSS)
	if c.frac >= 1 {
		c.w.Cwnd += int(c.frac)
		c.frac -= math.Floor(c.frac)
	}
}

func (c *cubic) reduce(flight int) {
	cwnd := c.segs()
	// §4.7 fast convergence.
	if cwnd < c.wMax {
		c.wMax = cwnd * (1 + cubicBeta) / 2
	} else {
		c.wMax = cwnd
	}
	c.w.Ssthresh = max(int(float64(c.w.Cwnd)*cubicBeta), 2*c.w.MSS) // §4.6
	c.epoch, c.frac = 0, 0
}

func (c *cubic) OnLoss(now Time, flight int) {
	c.reduce(flight)
	c.w.Cwnd = c.w.Ssthresh
}

func (c *cubic) OnRTO(now Time, flight int) {
	c.reduce(flight)
	c.w.Cwnd = c.w.MSS // §4.8
}
