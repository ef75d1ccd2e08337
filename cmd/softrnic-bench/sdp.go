package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
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
// rig's daemons: the same programs as the kernel TCP baseline's, with
// sdp's Dial and Listen (the control sockets by SOFTRNIC_SOCKET).
func (r *rig) sdpColumn() (SDP, error) {
	var s SDP
	b := r.b
	addr := func() string { b.port++; return net.JoinHostPort(b.net.B.Addr.Addr().String(), strconv.Itoa(b.port)) }
	env := func(host string) []string { return append(os.Environ(), sdp.EnvSocket+"="+r.sock[host]) }

	a := addr()
	srv := b.net.B.Command(b.self, "sdp-server", a)
	srv.Env = env("b")
	out, err := srv.StdoutPipe()
	if err != nil {
		return s, err
	}
	srv.Stderr = os.Stderr
	if err := srv.Start(); err != nil {
		return s, err
	}
	defer srv.Process.Kill()
	br, err := waitLine(out, "listening")
	if err != nil {
		return s, err
	}
	go io.Copy(io.Discard, br)
	cli := b.net.A.Command(b.self, "sdp-stream", a, "65536", fmt.Sprint(b.seconds))
	cli.Env = env("a")
	cli.Stderr = os.Stderr
	res, err := cli.Output()
	if err != nil {
		return s, fmt.Errorf("sdp-stream: %v", err)
	}
	_ = srv.Wait()
	var st struct {
		Bytes, Messages int64
		Seconds         float64
	}
	if err := json.Unmarshal(res, &st); err != nil {
		return s, err
	}
	gb := float64(st.Bytes) / 1e9
	s.Stream64K = Point{Size: 65536, Gbps: gb * 8 / st.Seconds, Mpps: float64(st.Messages) / st.Seconds / 1e6,
		Samples: int(st.Messages), CPUA: cpu(cli) / gb, CPUB: cpu(srv) / gb}
	fmt.Printf("   sdp stream   65536 B: %6.2f Gbit/s\n", s.Stream64K.Gbps)

	a = addr()
	name, args := pinApp(true, b.self, "sdp-server", a)
	srv = b.net.B.Command(name, args...)
	srv.Env = env("b")
	if out, err = srv.StdoutPipe(); err != nil {
		return s, err
	}
	srv.Stderr = os.Stderr
	if err := srv.Start(); err != nil {
		return s, err
	}
	defer srv.Process.Kill()
	if br, err = waitLine(out, "listening"); err != nil {
		return s, err
	}
	go io.Copy(io.Discard, br)
	name, args = pinApp(true, b.self, "sdp-ping", a, "5000")
	cli = b.net.A.Command(name, args...)
	cli.Env = env("a")
	cli.Stderr = os.Stderr
	if res, err = cli.Output(); err != nil {
		return s, fmt.Errorf("sdp-ping: %v", err)
	}
	if err := json.Unmarshal(res, &s.PingPong); err != nil {
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
	mark := func(ok bool) string {
		if ok {
			return "met"
		}
		return "NOT met"
	}
	for _, dp := range []string{"kernel", "xdp"} {
		s, ok := r.SDP[dp]
		if !ok {
			continue
		}
		fmt.Printf("%-6s sdp stream 64 KiB %.2f Gbit/s = %.2fx the datapath's send_bw (target ≥ 0.8: %s); kernel TCP %.2f Gbit/s\n",
			dp, s.Stream64K.Gbps, s.SendRatio, mark(s.SendRatio >= 0.8), r.KernelTCP[5].Gbps)
		line := fmt.Sprintf("%-6s sdp 1-byte round trip %.1f µs = %.2fx kernel TCP's %.1f µs", dp, s.PingPong.Median, s.TCPRatio, r.KernelTCPLat.Median)
		if dp == "xdp" {
			line += fmt.Sprintf(" (target ≤ 1: %s)", mark(s.TCPRatio <= 1))
		}
		fmt.Println(line)
	}
}
