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
	k, x := r.Datapaths["kernel"], r.Datapaths["xdp"]
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
		"kernel datapath: RDMA Write", line(k.Write),
		"kernel datapath: RDMA Read", line(k.Read),
		"kernel datapath: Send", line(k.Send),
		"xdp datapath: RDMA Write", line(x.Write),
		"xdp datapath: RDMA Read", line(x.Read),
		"xdp datapath: Send", line(x.Send)); err != nil {
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
	groups := []Latency{r.KernelTCPLat, k.WriteLat, k.ReadLat, x.WriteLat, x.ReadLat}
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
	l.NominalX("kernel TCP 1 B ping-pong", "kernel dp 8 B Write", "kernel dp 8 B Read", "xdp 8 B Write", "xdp 8 B Read")
	l.Legend.Top = true
	return l.Save(10*vg.Inch, 5*vg.Inch, filepath.Join(dir, "latency.png"))
}
