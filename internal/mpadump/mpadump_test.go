package mpadump

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"

	"github.com/softrnic/softrnic/ddp"
	"github.com/softrnic/softrnic/internal/pcap"
	"github.com/softrnic/softrnic/mpa"
)

var (
	cli = netip.MustParseAddrPort("192.0.2.1:40000")
	srv = netip.MustParseAddrPort("192.0.2.2:7174")
)

func send(msn ddp.MSN, n int) []byte {
	b := make([]byte, ddp.UntaggedHeaderLen+n)
	ddp.Untagged(b).Encode(&ddp.UntaggedFields{Last: true, Opcode: ddp.OpSend, QN: ddp.QNSend, MSN: msn})
	for i := range b[ddp.UntaggedHeaderLen:] {
		b[ddp.UntaggedHeaderLen+i] = byte(i)
	}
	return b
}

func write(n int) []byte {
	b := make([]byte, ddp.TaggedHeaderLen+n)
	ddp.Tagged(b).Encode(&ddp.TaggedFields{Last: true, Opcode: ddp.OpWrite, STag: 0x100, TO: 0})
	return b
}

func term() []byte {
	f := ddp.TerminateFields{Error: ddp.RDMAPAccessRights}
	body := make([]byte, f.Len())
	ddp.Terminate(body).Encode(&f)
	b := make([]byte, ddp.UntaggedHeaderLen)
	ddp.Untagged(b).Encode(&ddp.UntaggedFields{Last: true, Opcode: ddp.OpTerminate, QN: ddp.QNTerminate, MSN: 1})
	return append(b, body...)
}

// conn is a scripted connection: startup frames, then FPDUs each way.
type conn struct {
	ini, resp mpa.Config
	up, down  [][]byte // ULPDUs client->server, server->client
	// mutate changes the encoded streams before they are cut.
	mutate func(up, down []byte) ([]byte, []byte)
	// dropAt removes the segment covering this client->server offset.
	dropAt int
	// dup counts the octets capture sent twice, client->server
	// ([false]) and server->client ([true]).
	dup map[bool]int
}

// streams encodes both directions as their senders would.
func (c *conn) streams(t *testing.T) ([]byte, []byte) {
	req, err := c.ini.Request()
	if err != nil {
		t.Fatal(err)
	}
	rep, params, err := c.resp.Accept(&req)
	if err != nil && !errors.Is(err, mpa.ErrRejected) {
		t.Fatal(err)
	}
	up, _ := req.Append(nil)
	down, _ := rep.Append(nil)
	fu := mpa.NewFramer(params.CRC, params.MarkersRx)
	fd := mpa.NewFramer(params.CRC, params.MarkersTx)
	for _, u := range c.up {
		up = append(up, fu.Append(nil, u, nil)...)
	}
	for _, u := range c.down {
		down = append(down, fd.Append(nil, u, nil)...)
	}
	if c.mutate != nil {
		up, down = c.mutate(up, down)
	}
	return up, down
}

// capture writes the connection as a pcap of randomly sized, locally
// reordered segments with retransmissions.
func capture(t *testing.T, seed uint64, cs ...conn) []byte {
	var buf bytes.Buffer
	w, err := pcap.NewWriter(&buf)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(seed, 3))
	for i := range cs {
		c := &cs[i]
		c.dup = map[bool]int{}
		up, down := c.streams(t)
		src := netip.AddrPortFrom(cli.Addr(), cli.Port()+uint16(i))
		ci, si := rng.Uint32(), rng.Uint32()
		segs := []pcap.Segment{
			{Src: src, Dst: srv, Seq: ci, Flags: pcap.FlagSYN},
			{Src: srv, Dst: src, Seq: si, Flags: pcap.FlagSYN | pcap.FlagACK},
		}
		var rest []pcap.Segment
		cut := func(from, to netip.AddrPort, isn uint32, b []byte, drop int) {
			for off := 0; off < len(b); {
				n := min(1+rng.IntN(1400), len(b)-off)
				if drop > 0 && off <= drop && drop < off+n {
					off += n
					continue
				}
				rest = append(rest, pcap.Segment{Src: from, Dst: to, Seq: isn + 1 + uint32(off), Flags: pcap.FlagACK, Payload: b[off : off+n]})
				if rng.IntN(6) == 0 {
					rest = append(rest, pcap.Segment{Src: from, Dst: to, Seq: isn + 1 + uint32(off), Flags: pcap.FlagACK, Payload: b[off : off+n]})
					c.dup[from == srv] += n
				}
				off += n
			}
		}
		cut(src, srv, ci, up, c.dropAt)
		cut(srv, src, si, down, 0)
		for j := 1; j < len(rest); j++ {
			if rng.IntN(4) == 0 {
				rest[j-1], rest[j] = rest[j], rest[j-1]
			}
		}
		segs = append(segs, rest...)
		segs = append(segs,
			pcap.Segment{Src: src, Dst: srv, Seq: ci + 1 + uint32(len(up)), Flags: pcap.FlagFIN | pcap.FlagACK},
			pcap.Segment{Src: srv, Dst: src, Seq: si + 1 + uint32(len(down)), Flags: pcap.FlagFIN | pcap.FlagACK})
		for j := range segs {
			if err := w.WriteTCP(&segs[j]); err != nil {
				t.Fatal(err)
			}
		}
	}
	return buf.Bytes()
}

func analyze(t *testing.T, b []byte) *Report {
	t.Helper()
	rep, err := Analyze(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

func many(n int, f func(i int) []byte) [][]byte {
	var out [][]byte
	for i := range n {
		out = append(out, f(i))
	}
	return out
}

func TestEveryFPDUDecoded(t *testing.T) {
	cs := []conn{{
		ini:  mpa.Config{CRC: true, IRD: 4, ORD: 4, PrivateData: []byte("hi")},
		resp: mpa.Config{IRD: 4, ORD: 4},
		up:   many(40, func(i int) []byte { return send(ddp.MSN(i+1), i*97) }),
		down: many(10, func(i int) []byte { return write(3000 + i) }),
	}, {
		// Markers in one direction only, CRC off, revision 1.
		ini:  mpa.Config{Revision: 1, Markers: true},
		resp: mpa.Config{},
		up:   many(30, func(i int) []byte { return send(ddp.MSN(i+1), 500+i*31) }),
		down: append(many(20, func(i int) []byte { return send(ddp.MSN(i+1), 700) }), term()),
	}, {
		// Markers both ways, CRC on, peer-to-peer with a zero-length
		// Write as the ready-to-receive indication.
		ini:  mpa.Config{CRC: true, Markers: true, PeerToPeer: true, RTR: mpa.RTRWrite, IRD: 1, ORD: 1},
		resp: mpa.Config{Markers: true, PeerToPeer: true, IRD: 1, ORD: 1},
		up:   append([][]byte{write(0)}, many(25, func(i int) []byte { return write(i * 211) })...),
		down: many(25, func(i int) []byte { return send(ddp.MSN(i+1), 1024) }),
	}}
	for seed := uint64(1); seed <= 20; seed++ {
		rep := analyze(t, capture(t, seed, cs...))
		if len(rep.Conns) != len(cs) {
			t.Fatalf("seed %d: %d connections, want %d", seed, len(rep.Conns), len(cs))
		}
		for i, c := range rep.Conns {
			if p := c.Problem(); p != "" {
				t.Fatalf("seed %d conn %d: %s", seed, i, p)
			}
			want := cs[i]
			if c.ToServer.FPDUs != len(want.up) || c.ToClient.FPDUs != len(want.down) {
				t.Fatalf("seed %d conn %d: %d/%d FPDUs, sent %d/%d", seed, i, c.ToServer.FPDUs, c.ToClient.FPDUs, len(want.up), len(want.down))
			}
			if c.CRC != (want.ini.CRC || want.resp.CRC) || c.ToServer.Markers != want.resp.Markers || c.ToClient.Markers != want.ini.Markers {
				t.Fatalf("seed %d conn %d: CRC %v markers %v/%v", seed, i, c.CRC, c.ToServer.Markers, c.ToClient.Markers)
			}
			if c.ToServer.Partial || c.ToClient.Partial {
				t.Fatalf("seed %d conn %d: partial FPDU reported", seed, i)
			}
			// Both copies of a segment that arrive ahead of a hole
			// are held once and not counted: at most what was
			// repeated, and something when anything was.
			for _, d := range []struct {
				got      uint64
				repeated int
			}{{c.ToServer.Retransmitted(), cs[i].dup[false]}, {c.ToClient.Retransmitted(), cs[i].dup[true]}} {
				if d.got > uint64(d.repeated) || (d.got == 0) != (d.repeated == 0) {
					t.Fatalf("seed %d conn %d: %d octets reported retransmitted, the capture repeated %d", seed, i, d.got, d.repeated)
				}
			}
		}
		if got := rep.Conns[1].ToClient.Terminates; len(got) != 1 || got[0] != ddp.RDMAPAccessRights {
			t.Fatalf("seed %d: Terminates %v", seed, got)
		}
		if string(rep.Conns[0].Request.PrivateData) != "hi" {
			t.Fatalf("Request private data %q", rep.Conns[0].Request.PrivateData)
		}
	}
}

func TestProblemsFound(t *testing.T) {
	base := conn{
		ini:  mpa.Config{CRC: true},
		resp: mpa.Config{},
		up:   many(20, func(i int) []byte { return send(ddp.MSN(i+1), 300) }),
		down: many(5, func(i int) []byte { return write(100) }),
	}
	fpdu := mpa.FPDULen(ddp.UntaggedHeaderLen + 300)
	reqLen := mpa.FrameHeaderLen + mpa.EnhancedLen
	for _, tc := range []struct {
		name  string
		c     conn
		want  string
		cause error
	}{{
		name: "a flipped payload bit",
		c: func() conn {
			c := base
			c.mutate = func(up, down []byte) ([]byte, []byte) { up[reqLen+7*fpdu+40] ^= 1; return up, down }
			return c
		}(),
		want: "FPDU 8", cause: ddp.LLPCRC,
	}, {
		name: "an invalid DDP version with a good CRC",
		c: func() conn {
			c := base
			c.up = append([][]byte{}, base.up...)
			bad := send(3, 300)
			bad[0] = bad[0]&^3 | 2
			c.up[2] = bad
			return c
		}(),
		want: "FPDU 3", cause: ddp.DDPUntaggedBadVersion,
	}, {
		name: "the stream closed inside an FPDU",
		c: func() conn {
			c := base
			c.mutate = func(up, down []byte) ([]byte, []byte) { return up[:len(up)-10], down }
			return c
		}(),
		want: "FIN inside an FPDU",
	}, {
		name: "a segment the capture lost",
		c:    func() conn { c := base; c.dropAt = reqLen + 5*fpdu; return c }(),
		want: "missing from the capture",
	}, {
		name: "not MPA",
		c: func() conn {
			c := base
			c.mutate = func(up, down []byte) ([]byte, []byte) { return []byte("GET / HTTP/1.1\r\nHost: example\r\n\r\n"), down }
			return c
		}(),
		want: "bad key",
	}} {
		for seed := uint64(1); seed <= 5; seed++ {
			rep := analyze(t, capture(t, seed, tc.c))
			p := rep.Conns[0].Problem()
			if !strings.Contains(p, tc.want) {
				t.Errorf("%s (seed %d): problem %q, want it to mention %q", tc.name, seed, p, tc.want)
			}
			if tc.cause != nil && !errors.Is(rep.Conns[0].ToServer.Err, tc.cause) {
				t.Errorf("%s (seed %d): error %v, want %v", tc.name, seed, rep.Conns[0].ToServer.Err, tc.cause)
			}
			if rep.Problems() != 1 {
				t.Errorf("%s: %d connections with problems", tc.name, rep.Problems())
			}
		}
	}
}

func TestRejectedConnection(t *testing.T) {
	c := conn{ini: mpa.Config{CRC: true, PrivateData: []byte("please")}, resp: mpa.Config{}}
	req, _ := c.ini.Request()
	rej, err := c.resp.Reject(&req)
	if err != nil {
		t.Fatal(err)
	}
	c.mutate = func(up, _ []byte) ([]byte, []byte) { b, _ := rej.Append(nil); return up, b }
	rep := analyze(t, capture(t, 1, c))
	if p := rep.Conns[0].Problem(); p != "" || rep.Conns[0].Reply == nil || !rep.Conns[0].Reply.Reject {
		t.Errorf("rejected connection: problem %q, reply %+v", p, rep.Conns[0].Reply)
	}
}

func readReq(size uint32) []byte {
	b := make([]byte, ddp.UntaggedHeaderLen+ddp.ReadRequestLen)
	ddp.Untagged(b).Encode(&ddp.UntaggedFields{Last: true, Opcode: ddp.OpReadRequest, QN: ddp.QNReadRequest, MSN: 1})
	ddp.ReadRequest(b[ddp.UntaggedHeaderLen:]).Encode(&ddp.ReadRequestFields{SinkSTag: 1, Size: size, SrcSTag: 1})
	return b
}

// Leading names the zero-length message a direction began with, which a
// peer-to-peer initiator sends as its RTR; anything else is 0.
func TestLeadingRTR(t *testing.T) {
	p2p := func(r mpa.RTR) (mpa.Config, mpa.Config) {
		return mpa.Config{PeerToPeer: true, RTR: r, IRD: 1, ORD: 1}, mpa.Config{IRD: 1, ORD: 1}
	}
	cases := []struct {
		rtr   mpa.RTR
		first []byte
		want  mpa.RTR
	}{
		{mpa.RTRWrite, write(0), mpa.RTRWrite},
		{mpa.RTRRead, readReq(0), mpa.RTRRead},
		{mpa.RTRSend, send(1, 0), mpa.RTRSend},
		{0, send(1, 16), 0},
		{0, write(8), 0},
		{0, readReq(64), 0},
	}
	var cs []conn
	for _, c := range cases {
		ini, resp := mpa.Config{IRD: 1, ORD: 1}, mpa.Config{IRD: 1, ORD: 1}
		if c.rtr != 0 {
			ini, resp = p2p(c.rtr)
		}
		cs = append(cs, conn{ini: ini, resp: resp, up: [][]byte{c.first, send(2, 32)}, down: [][]byte{send(1, 8)}})
	}
	rep := analyze(t, capture(t, 7, cs...))
	if len(rep.Conns) != len(cases) {
		t.Fatalf("%d connections, want %d", len(rep.Conns), len(cases))
	}
	for i, c := range cases {
		got := rep.Conns[i]
		if got.ToServer.Leading != c.want || got.ToClient.Leading != 0 {
			t.Errorf("case %d: leading %v / %v, want %v / none", i, got.ToServer.Leading, got.ToClient.Leading, c.want)
		}
		if c.rtr != 0 && (!got.Reply.PeerToPeer || got.Reply.RTR != c.rtr) {
			t.Errorf("case %d: Reply p2p %v RTR %v", i, got.Reply.PeerToPeer, got.Reply.RTR)
		}
	}
}
