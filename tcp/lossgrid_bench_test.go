package tcp_test

import (
	"testing"
	"time"

	"github.com/softrnic/softrnic/internal/lossgrid"
	"github.com/softrnic/softrnic/tcp"
	"github.com/softrnic/softrnic/tcp/sim"
)

// BenchmarkSimLossGrid runs issue 18's grid (internal/lossgrid.Grid)
// engine → engine in the simulator, on a 1 Gbit/s link with a 1 MB queue
// and at least 100 µs each way: one simulated second of bulk transfer per
// op. Its figures are simulated time, so they do not depend on the
// machine: Mbit/s of goodput, the share of data segments retransmitted,
// RTOs and loss probes. (make bench runs the same grid for real against
// Linux: softrnic-lossgrid.)
func BenchmarkSimLossGrid(b *testing.B) {
	for _, pt := range lossgrid.Grid() {
		b.Run(pt.Name, func(b *testing.B) {
			var octets, segs, rtx, rtos, probes float64
			for i := range b.N {
				link := func() *sim.Link {
					c := pt.Impair
					return &sim.Link{Delay: max(c.Delay, 100*time.Microsecond), Jitter: c.Jitter, Rate: 1e9, Queue: 1 << 20,
						Loss: c.Loss, Duplicate: c.Duplicate, Reorder: c.Reorder, JitterKeepsOrder: true}
				}
				n, c, recv := bulkStream(b, uint64(i+1), tcp.Options{}, tcp.Options{}, link(), link())
				n.RunFor(time.Second)
				if recv.Corrupt != nil {
					b.Fatal(recv.Corrupt)
				}
				octets += float64(recv.Recvd)
				segs += float64(c.Stats.SegmentsOut)
				rtx += float64(c.Stats.Retransmits)
				rtos += float64(c.Stats.RTOs)
				probes += float64(c.Stats.LossProbes)
			}
			nf := float64(b.N)
			b.ReportMetric(octets*8/1e6/nf, "Mbit/s")
			b.ReportMetric(100*rtx/max(segs, 1), "rtx%")
			b.ReportMetric(rtos/nf, "RTOs/op")
			b.ReportMetric(probes/nf, "probes/op")
		})
	}
}
