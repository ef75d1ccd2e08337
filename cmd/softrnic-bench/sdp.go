package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"

	"github.com/softrnic/softrnic/sdp"
)

// SDP is issue 20's column: the sdp package's net.Conn on one datapath,
// beside kernel TCP's net.Conn on the same pair and the datapath's own
// Send bandwidth at the same size.
type SDP struct {
	Stream64K Point   `json:"stream_64KiB"`
	PingPong  Latency `json:"pingpong_1B"`
	// SendRatio is the stream over the datapath's send_bw at 64 KiB
	// (target ≥ 0.8: SDP's overhead); TCPRatio the round trip over
	// kernel TCP's (target ≤ 1 on the xdp datapath).
	SendRatio float64 `json:"stream_over_send_bw"`
	TCPRatio  float64 `json:"pingpong_over_kernel_tcp"`
}

// sdpColumn measures sdp's 64 KiB stream and 1-byte ping-pong through the
// rig's daemons: the same helpers as the kernel TCP baseline's, with sdp's
// Dial and Listen (the control sockets by SOFTRNIC_SOCKET).
func (r *rig) sdpColumn() (SDP, error) {
	var s SDP
	b := r.b
	h := helpers{proto: "sdp", envA: append(os.Environ(), sdp.EnvSocket+"="+r.sock["a"]),
		envB: append(os.Environ(), sdp.EnvSocket+"="+r.sock["b"])}
	addr := func() string { b.port++; return net.JoinHostPort(b.net.B.Addr.Addr().String(), strconv.Itoa(b.port)) }
	var err error
	if s.Stream64K, err = b.stream(h, addr(), 65536); err != nil {
		return s, err
	}
	fmt.Printf("   sdp stream   65536 B: %6.2f Gbit/s\n", s.Stream64K.Gbps)
	if s.PingPong, err = b.pingPong(h, addr()); err != nil {
		return s, err
	}
	fmt.Printf("   sdp 1-byte ping-pong: median %.1f µs, p99 %.1f µs\n", s.PingPong.Median, s.PingPong.P99)
	return s, nil
}

// The sdp ends of the baseline helpers: listen and dial through sdp, with
// no fallback, so that a figure is never kernel TCP's by mistake.
func sdpListen(addr string) (net.Listener, error) { return sdp.Listen("tcp4", addr) }

func sdpDial(addr string) (net.Conn, error) {
	d := &sdp.Dialer{NoFallback: true}
	return d.DialContext(context.Background(), "tcp4", addr)
}

// sdpTargets prints issue 20's targets, met or NOT met.
func sdpTargets(r *Results) {
	fmt.Println("\n== issue 20 targets (sdp)")
	i64k := slices.Index(sizes, 65536)
	for _, dp := range []string{"kernel", "xdp"} {
		s, ok := r.SDP[dp]
		if !ok {
			continue
		}
		fmt.Printf("%-6s sdp stream 64 KiB %.2f Gbit/s = %.2fx the datapath's send_bw (target ≥ 0.8: %s); kernel TCP %.2f Gbit/s\n",
			dp, s.Stream64K.Gbps, s.SendRatio, verdict(s.SendRatio >= 0.8), r.KernelTCP[i64k].Gbps)
		line := fmt.Sprintf("%-6s sdp 1-byte round trip %.1f µs = %.2fx kernel TCP's %.1f µs", dp, s.PingPong.Median, s.TCPRatio, r.KernelTCPLat.Median)
		if dp == "xdp" {
			line += fmt.Sprintf(" (target ≤ 1: %s)", verdict(s.TCPRatio <= 1))
		}
		fmt.Println(line)
	}
}
