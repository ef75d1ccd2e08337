package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"

	"github.com/softrnic/softrnic/internal/results"
	"github.com/softrnic/softrnic/sdp"
)

// SDP is issue 20's column: the sdp package's net.Conn on one datapath,
// beside kernel TCP's net.Conn on the same pair and the datapath's own
// Send bandwidth at the same size, measured in sdpRounds rounds, each
// taking them in turn; the figures are the rounds' medians.
type SDP struct {
	Rounds []SDPRound `json:"rounds"`
	// The medians: the 64 KiB stream and send_bw, the 1-byte
	// ping-pongs, and the rounds' stream over send_bw (target ≥ 0.8:
	// SDP's overhead) and round trip over kernel TCP's (target ≤ 1 on
	// the xdp datapath).
	StreamGbps float64 `json:"stream_64KiB_gbps"`
	SendGbps   float64 `json:"send_bw_64KiB_gbps"`
	PingUs     float64 `json:"pingpong_1B_median_us"`
	TCPPingUs  float64 `json:"kernel_tcp_pingpong_1B_median_us"`
	SendRatio  float64 `json:"stream_over_send_bw"`
	TCPRatio   float64 `json:"pingpong_over_kernel_tcp"`
}

// SDPRound is one round of the sdp column.
type SDPRound struct {
	Stream64K   Point   `json:"stream_64KiB"`
	SendBW64K   Point   `json:"send_bw_64KiB"`
	PingPong    Latency `json:"pingpong_1B"`
	TCPPingPong Latency `json:"kernel_tcp_pingpong_1B"`
}

// sdpRounds: one round of a stream beside a send_bw moves by a third
// between runs on this host; the median of five does not move so.
const sdpRounds = 5

// sdpColumn measures sdp's 64 KiB stream and 1-byte ping-pong through the
// rig's daemons (the same helpers as the kernel TCP baseline's, with sdp's
// Dial and Listen, the control sockets by SOFTRNIC_SOCKET), each round
// beside the datapath's send_bw at 64 KiB and kernel TCP's ping-pong.
func (r *rig) sdpColumn() (SDP, error) {
	var s SDP
	b := r.b
	h := helpers{proto: "sdp", envA: append(os.Environ(), sdp.EnvSocket+"="+r.sock["a"]),
		envB: append(os.Environ(), sdp.EnvSocket+"="+r.sock["b"])}
	addr := func() string { b.port++; return net.JoinHostPort(b.net.B.Addr.Addr().String(), strconv.Itoa(b.port)) }
	var stream, send, ping, tcp, sendRatio, tcpRatio []float64
	for i := range sdpRounds {
		var rd SDPRound
		var err error
		if rd.Stream64K, err = b.stream(h, addr(), 65536); err != nil {
			return s, err
		}
		if rd.SendBW64K, err = r.bw("send_bw", 65536); err != nil {
			return s, err
		}
		if rd.PingPong, err = b.pingPong(h, addr()); err != nil {
			return s, err
		}
		if rd.TCPPingPong, err = b.pingPong(kernelTCP, addr()); err != nil {
			return s, err
		}
		s.Rounds = append(s.Rounds, rd)
		stream, send = append(stream, rd.Stream64K.Gbps), append(send, rd.SendBW64K.Gbps)
		ping, tcp = append(ping, rd.PingPong.Median), append(tcp, rd.TCPPingPong.Median)
		sendRatio, tcpRatio = append(sendRatio, stream[i]/send[i]), append(tcpRatio, ping[i]/tcp[i])
		fmt.Printf("   sdp round %d: stream 64 KiB %.2f Gbit/s, send_bw %.2f (%.2fx); 1-byte ping-pong %.1f µs, kernel TCP %.1f (%.2fx)\n",
			i+1, stream[i], send[i], sendRatio[i], ping[i], tcp[i], tcpRatio[i])
	}
	s.StreamGbps, s.SendGbps = results.Median(stream), results.Median(send)
	s.PingUs, s.TCPPingUs = results.Median(ping), results.Median(tcp)
	s.SendRatio, s.TCPRatio = results.Median(sendRatio), results.Median(tcpRatio)
	fmt.Printf("   sdp medians of %d: stream 64 KiB %.2f Gbit/s (%.2fx send_bw); 1-byte ping-pong %.1f µs (%.2fx kernel TCP)\n",
		sdpRounds, s.StreamGbps, s.SendRatio, s.PingUs, s.TCPRatio)
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
		fmt.Printf("%-6s sdp stream 64 KiB %.2f Gbit/s = %.2fx the datapath's send_bw of %.2f (median of %d paired rounds; target ≥ 0.8: %s); kernel TCP %.2f Gbit/s\n",
			dp, s.StreamGbps, s.SendRatio, s.SendGbps, len(s.Rounds), verdict(s.SendRatio >= 0.8), r.KernelTCP[i64k].Gbps)
		line := fmt.Sprintf("%-6s sdp 1-byte round trip %.1f µs = %.2fx kernel TCP's %.1f µs (median of %d paired rounds)", dp, s.PingUs, s.TCPRatio, s.TCPPingUs, len(s.Rounds))
		if dp == "xdp" {
			line += fmt.Sprintf(" (target ≤ 1: %s)", verdict(s.TCPRatio <= 1))
		}
		fmt.Println(line)
	}
}
