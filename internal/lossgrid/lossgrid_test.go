package lossgrid

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/softrnic/softrnic/internal/testenv"
	"github.com/softrnic/softrnic/internal/topology"
)

// TestGridOverTheBridge runs two points of the grid for real, Linux →
// Linux and engine → Linux, and holds the machinery to what it claims:
// every stream verified, the link dropping what its configuration says
// (one application of 1% loss drops about 1% of the data packets), the
// wire tap seeing the retransmissions that loss makes and no RTO on a
// clean link, and each sender's own counters read. The figures are the
// benchmark's (softrnic-lossgrid in make bench), not this test's.
func TestGridOverTheBridge(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireTool(t, "ip")
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		testenv.Unmet(t, "needs /dev/net/tun: %v", err)
	}
	br, err := topology.OpenTunBridge("srnlg", 1500)
	if err != nil {
		t.Fatal(err)
	}
	defer br.Close()
	var pts []Point
	for _, p := range Grid() {
		if p.Name == "clean" || p.Name == "loss 1%" {
			pts = append(pts, p)
		}
	}
	var log strings.Builder
	rs, err := Run(br, Options{Duration: time.Second, Seed: 1, Points: pts, Pairs: Pairs[:2], Progress: &log})
	t.Log("\n" + log.String())
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 4 {
		t.Fatalf("%d results, want 4", len(rs))
	}
	for _, r := range rs {
		if !r.Verified || r.Octets == 0 {
			t.Errorf("%s %s: not verified (%d octets): %s", r.Point, r.Pair, r.Octets, r.Err)
		}
		if len(r.Sender) == 0 {
			t.Errorf("%s %s: no sender counters", r.Point, r.Pair)
		}
		if r.Wire.DataSegments == 0 || r.Link.Data.Pushed < r.Wire.DataSegments {
			t.Errorf("%s %s: the tap saw %d data segments, the link %d packets", r.Point, r.Pair, r.Wire.DataSegments, r.Link.Data.Pushed)
		}
		switch r.Point {
		case "clean":
			if r.Link.Data.Lost != 0 || r.Wire.RTOs != 0 {
				t.Errorf("%s %s: clean link lost %d, %d RTOs", r.Point, r.Pair, r.Link.Data.Lost, r.Wire.RTOs)
			}
		case "loss 1%":
			if r.Link.Data.Pushed < 2000 || r.Link.DataLoss < 0.005 || r.Link.DataLoss > 0.015 {
				t.Errorf("%s %s: the link dropped %.3f%% of %d packets, want about 1%%", r.Point, r.Pair,
					100*r.Link.DataLoss, r.Link.Data.Pushed)
			}
			if r.Wire.Retransmits == 0 {
				t.Errorf("%s %s: no retransmission seen on a lossy link", r.Point, r.Pair)
			}
		}
	}
}
