package main

import (
	"fmt"
	"path/filepath"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// plots draws bandwidth against message size and the latency percentiles.
func plots(r *Results, dir string) error {
	k := r.Datapaths["kernel"]
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Bandwidth, veth MTU %d, CRC %v", r.MTU, r.CRC)
	p.X.Label.Text = "message size (octets, log scale)"
	p.Y.Label.Text = "Gbit/s"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	line := func(pts []Point) plotter.XYs {
		xy := make(plotter.XYs, len(pts))
		for i, pt := range pts {
			xy[i].X, xy[i].Y = float64(pt.Size), pt.Gbps
		}
		return xy
	}
	if err := plotutil.AddLinePoints(p,
		"kernel TCP stream", line(r.KernelTCP),
		"softrnic RDMA Write", line(k.Write),
		"softrnic RDMA Read", line(k.Read),
		"softrnic Send", line(k.Send)); err != nil {
		return err
	}
	p.Legend.Top = true
	p.Legend.Left = true
	if err := p.Save(8*vg.Inch, 5*vg.Inch, filepath.Join(dir, "bandwidth.png")); err != nil {
		return err
	}

	l := plot.New()
	l.Title.Text = "Round-trip latency (µs): median, p99, p99.9"
	l.Y.Label.Text = "µs"
	groups := []Latency{r.KernelTCPLat, k.WriteLat, k.ReadLat}
	w := vg.Points(18)
	for i, name := range []string{"median", "p99", "p99.9"} {
		vals := make(plotter.Values, len(groups))
		for j, g := range groups {
			vals[j] = []float64{g.Median, g.P99, g.P999}[i]
		}
		bars, err := plotter.NewBarChart(vals, w)
		if err != nil {
			return err
		}
		bars.Color = plotutil.Color(i)
		bars.Offset = vg.Length(i-1) * w
		l.Add(bars)
		l.Legend.Add(name, bars)
	}
	l.NominalX("kernel TCP 1 B ping-pong", "softrnic 8 B Write", "softrnic 8 B Read")
	l.Legend.Top = true
	return l.Save(8*vg.Inch, 5*vg.Inch, filepath.Join(dir, "latency.png"))
}
