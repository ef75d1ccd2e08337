package lossgrid

import (
	"slices"
	"strings"
	"testing"
)

func result(point string, round int, p Pair, mbps, rtoSeconds float64, verified bool) Result {
	return Result{Point: point, Round: round, Pair: p.String(), Mbps: mbps, Verified: verified,
		Wire: WireStats{RTOSeconds: rtoSeconds}}
}

// TestVerdictsReadTheMedianOfRounds: each round's engine stream is read
// against Linux's of the same round, the target against the median, so
// one round that lands badly does not decide a point; but a stream that
// was not verified fails its point whatever the median.
func TestVerdictsReadTheMedianOfRounds(t *testing.T) {
	ll, el, le := Pairs[0], Pairs[1], Pairs[2]
	rs := []Result{
		// loss 1%: rounds 1.2, 0.5 (a bad one), 1.1 → median 1.1, met.
		result("loss 1%", 0, ll, 100, 0, true), result("loss 1%", 0, el, 120, 0, true), result("loss 1%", 0, le, 1, 0, true),
		result("loss 1%", 1, ll, 200, 0, true), result("loss 1%", 1, el, 100, 0, true),
		result("loss 1%", 2, ll, 100, 0, true), result("loss 1%", 2, el, 110, 0, true),
		// clean: median 0.9 met, but round 1 was not verified.
		result("clean", 0, ll, 100, 0, true), result("clean", 0, el, 90, 0, true),
		result("clean", 1, ll, 100, 0, true), result("clean", 1, el, 95, 0, false),
		// loss 5%: goodput met, but the engine spent 2 s in RTO to
		// Linux's 0.1 s over two rounds.
		result("loss 5%", 0, ll, 10, 0.1, true), result("loss 5%", 0, el, 10, 1, true),
		result("loss 5%", 1, ll, 10, 0, true), result("loss 5%", 1, el, 10, 1, true),
	}
	vs := Verdicts(rs)
	byPoint := map[string]Verdict{}
	for _, v := range vs {
		byPoint[v.Point] = v
	}
	if len(vs) != 3 {
		t.Fatalf("%d verdicts, want 3: %+v", len(vs), vs)
	}
	l1 := byPoint["loss 1%"]
	if !slices.Equal(l1.Ratios, []float64{1.2, 0.5, 1.1}) || l1.GoodputRatio != 1.1 || l1.Want != 1 || !l1.GoodputMet || !l1.RTOMet {
		t.Errorf("loss 1%%: %+v, want ratios 1.2 0.5 1.1, median 1.1 against 1.0, met", l1)
	}
	if c := byPoint["clean"]; c.GoodputRatio < 0.92 || c.GoodputRatio > 0.93 || c.GoodputMet || c.RTOMet {
		t.Errorf("clean: %+v, want median 0.925, not met (a round not verified)", c)
	}
	l5 := byPoint["loss 5%"]
	if !l5.GoodputMet || l5.RTOMet || l5.EngineRTOSeconds != 2 || l5.LinuxRTOSeconds != 0.1 {
		t.Errorf("loss 5%%: %+v, want goodput met, RTO 2 s vs 0.1 s not met", l5)
	}
	var out strings.Builder
	Print(&out, rs)
	if !strings.Contains(out.String(), "rounds 1.20 0.50 1.10") || !strings.Contains(out.String(), "NOT met") {
		t.Errorf("the printed targets do not give the rounds and the failures:\n%s", out.String())
	}
}
