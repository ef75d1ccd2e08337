package pcap

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/softrnic/softrnic/internal/testenv"
)

var (
	cli4 = netip.MustParseAddrPort("192.0.2.1:40000")
	srv4 = netip.MustParseAddrPort("192.0.2.2:7174")
	cli6 = netip.MustParseAddrPort("[2001:db8::1]:40000")
	srv6 = netip.MustParseAddrPort("[2001:db8::2]:7174")
)

// flow builds the segments of one direction of a connection.
type flow struct {
	src, dst netip.AddrPort
	isn      uint32
}

func (f flow) syn(ack bool) Segment {
	s := Segment{Src: f.src, Dst: f.dst, Seq: f.isn, Flags: FlagSYN}
	if ack {
		s.Flags |= FlagACK
	}
	return s
}

// data is the segment carrying stream octets [off, off+len(p)).
func (f flow) data(off int, p []byte) Segment {
	return Segment{Src: f.src, Dst: f.dst, Seq: f.isn + 1 + uint32(off), Flags: FlagACK | FlagPSH, Payload: p}
}

func (f flow) fin(off int) Segment {
	return Segment{Src: f.src, Dst: f.dst, Seq: f.isn + 1 + uint32(off), Flags: FlagACK | FlagFIN}
}

func roundTrip(t *testing.T, segs []Segment) *Reader {
	t.Helper()
	var buf bytes.Buffer
	w, err := NewWriter(&buf)
	if err != nil {
		t.Fatal(err)
	}
	for i := range segs {
		if err := w.WriteTCP(&segs[i]); err != nil {
			t.Fatal(err)
		}
	}
	r, err := NewReader(&buf)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// assemble runs segments through a file and the Assembler and returns the
// connections with what each direction delivered.
func assemble(t *testing.T, segs []Segment) ([]*Conn, map[*Stream]*bytes.Buffer) {
	t.Helper()
	r := roundTrip(t, segs)
	got := map[*Stream]*bytes.Buffer{}
	a := &Assembler{NewConn: func(c *Conn) {
		for _, s := range []*Stream{c.ToServer, c.ToClient} {
			b := &bytes.Buffer{}
			got[s] = b
			s.Deliver = func(p []byte) { b.Write(p) }
		}
	}}
	for {
		p, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		seg, err := DecodeTCP(r.LinkType, p)
		if err != nil {
			t.Fatal(err)
		}
		a.Add(&seg)
	}
	return a.Conns(), got
}

func stream(n int, seed uint64) []byte {
	b := make([]byte, n)
	rng := rand.New(rand.NewPCG(seed, 1))
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

func TestDecodeFields(t *testing.T) {
	for _, tc := range []struct{ src, dst netip.AddrPort }{{cli4, srv4}, {cli6, srv6}} {
		in := Segment{Src: tc.src, Dst: tc.dst, Seq: 0xfffffff0, Ack: 77, Flags: FlagACK | FlagPSH, Window: 512, Payload: []byte("hello")}
		r := roundTrip(t, []Segment{in})
		p, err := r.Next()
		if err != nil {
			t.Fatal(err)
		}
		got, err := DecodeTCP(r.LinkType, p)
		if err != nil {
			t.Fatal(err)
		}
		if got.Src != in.Src || got.Dst != in.Dst || got.Seq != in.Seq || got.Ack != in.Ack ||
			got.Flags != in.Flags || got.Window != in.Window || string(got.Payload) != "hello" || got.Truncated {
			t.Errorf("decoded %+v, wrote %+v", got, in)
		}
		if _, err := r.Next(); err != io.EOF {
			t.Errorf("after the last packet: %v, want io.EOF", err)
		}
	}
}

// The checksums the Writer computes are the ones the kernel's tools accept.
func TestWriterChecksumsValidByTshark(t *testing.T) {
	tshark := testenv.RequireTool(t, "tshark")
	var buf bytes.Buffer
	w, _ := NewWriter(&buf)
	f := flow{cli4, srv4, 1000}
	g := flow{cli6, srv6, 2000}
	for _, s := range []Segment{f.syn(false), f.data(0, []byte("odd")), g.syn(false), g.data(0, []byte("even"))} {
		if err := w.WriteTCP(&s); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(t.TempDir(), "w.pcap")
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(tshark, "-r", path, "-o", "tcp.check_checksum:TRUE", "-o", "ip.check_checksum:TRUE",
		"-T", "fields", "-e", "tcp.checksum.status", "-e", "ip.checksum.status").Output()
	if err != nil {
		t.Fatalf("tshark: %v\n%s", err, out)
	}
	lines := strings.Fields(string(out))
	if len(lines) != 6 { // 4 TCP + 2 IPv4 header statuses
		t.Fatalf("tshark printed %q", out)
	}
	for _, l := range lines {
		if l != "1" { // Wireshark's PROTO_CHECKSUM_E_GOOD
			t.Fatalf("tshark checksum status %q, want all good (1):\n%s", l, out)
		}
	}
}

func TestNotTCPAndBadFiles(t *testing.T) {
	if _, err := NewReader(strings.NewReader("\x0a\x0d\x0d\x0a" + strings.Repeat("x", 20))); !errors.Is(err, ErrPcapNG) {
		t.Errorf("pcapng: %v", err)
	}
	if _, err := NewReader(strings.NewReader(strings.Repeat("x", 24))); err == nil {
		t.Error("garbage accepted as pcap")
	}
	p := Packet{Data: append(make([]byte, 12), 0x08, 0x06, 1, 2, 3), OrigLen: 17} // ARP
	if _, err := DecodeTCP(LinkEthernet, p); !errors.Is(err, ErrNotTCP) {
		t.Errorf("ARP: %v, want ErrNotTCP", err)
	}
	if _, err := DecodeTCP(LinkEthernet, Packet{Data: make([]byte, 20), OrigLen: 20}); err == nil {
		t.Error("a frame of zeros decoded")
	}
}

// In-order, reordered, duplicated and overlapping segments all give the
// exact stream, across a sequence number wrap, in both directions.
func TestReassembly(t *testing.T) {
	for seed := uint64(1); seed <= 50; seed++ {
		rng := rand.New(rand.NewPCG(seed, 2))
		up, down := stream(20000, seed), stream(7000, seed+100)
		cf := flow{cli4, srv4, 0xffffffff - uint32(rng.IntN(10000))} // wraps inside the stream
		sf := flow{srv4, cli4, rng.Uint32()}
		if seed%2 == 0 {
			cf.src, cf.dst, sf.src, sf.dst = cli6, srv6, srv6, cli6
		}
		segs := []Segment{cf.syn(false), sf.syn(true)}
		var rest []Segment
		cut := func(f flow, b []byte) {
			for off := 0; off < len(b); {
				n := 1 + rng.IntN(1500)
				n = min(n, len(b)-off)
				rest = append(rest, f.data(off, b[off:off+n]))
				if rng.IntN(5) == 0 { // a retransmission overlapping its neighbours
					lo := max(0, off-rng.IntN(300))
					hi := min(len(b), off+n+rng.IntN(300))
					rest = append(rest, f.data(lo, b[lo:hi]))
				}
				off += n
			}
		}
		cut(cf, up)
		cut(sf, down)
		// Local reordering: swap neighbours now and then.
		for i := 1; i < len(rest); i++ {
			if rng.IntN(3) == 0 {
				rest[i-1], rest[i] = rest[i], rest[i-1]
			}
		}
		segs = append(segs, rest...)
		segs = append(segs, cf.fin(len(up)), sf.fin(len(down)))
		// A pure ACK after the FIN: no data, not a gap.
		segs = append(segs, Segment{Src: cf.src, Dst: cf.dst, Seq: cf.isn + 2 + uint32(len(up)), Flags: FlagACK})
		conns, got := assemble(t, segs)
		if len(conns) != 1 {
			t.Fatalf("seed %d: %d connections", seed, len(conns))
		}
		c := conns[0]
		if c.Client != cf.src || c.Server != cf.dst || !c.Handshake {
			t.Fatalf("seed %d: client %v server %v handshake %v", seed, c.Client, c.Server, c.Handshake)
		}
		for _, d := range []struct {
			s    *Stream
			want []byte
		}{{c.ToServer, up}, {c.ToClient, down}} {
			if !bytes.Equal(got[d.s].Bytes(), d.want) {
				t.Fatalf("seed %d: delivered %d octets differing from the %d sent", seed, got[d.s].Len(), len(d.want))
			}
			if p := d.s.Problem(); p != "" || !d.s.Closed() {
				t.Fatalf("seed %d: problem %q, closed %v", seed, p, d.s.Closed())
			}
		}
	}
}

func TestReassemblyProblems(t *testing.T) {
	cf := flow{cli4, srv4, 100}
	sf := flow{srv4, cli4, 900}
	data := stream(3000, 7)
	base := []Segment{cf.syn(false), sf.syn(true)}
	for _, tc := range []struct {
		name string
		segs []Segment
		want string
	}{{
		name: "a segment missing",
		segs: append(append([]Segment{}, base...), cf.data(0, data[:1000]), cf.data(2000, data[2000:]), cf.fin(3000)),
		want: "octets 1000..2000 missing",
	}, {
		name: "the end missing before the FIN",
		segs: append(append([]Segment{}, base...), cf.data(0, data[:1000]), cf.fin(3000)),
		want: "octets 1000..3000 before the FIN missing",
	}, {
		name: "a truncated segment",
		segs: append(append([]Segment{}, base...), func() Segment { s := cf.data(0, data); s.Truncated = true; return s }()),
		want: "truncated",
	}, {
		name: "capture started mid-connection",
		segs: []Segment{cf.data(500, data[:10])},
		want: "mid-connection",
	}} {
		conns, _ := assemble(t, tc.segs)
		if p := conns[0].ToServer.Problem(); !strings.Contains(p, tc.want) {
			t.Errorf("%s: problem %q, want it to mention %q", tc.name, p, tc.want)
		}
	}
	// A refused connection (SYN, RST) and a new connection on the same
	// 4-tuple are two clean connections.
	rst := Segment{Src: srv4, Dst: cli4, Seq: 0, Ack: 101, Flags: FlagRST | FlagACK}
	again := flow{cli4, srv4, 5000}
	conns, got := assemble(t, []Segment{cf.syn(false), rst, again.syn(false), sf.syn(true), again.data(0, data[:10])})
	if len(conns) != 2 || !conns[0].Reset || conns[0].ToClient.Problem() != "" || got[conns[1].ToServer].Len() != 10 {
		t.Errorf("refused then reconnected: %d connections, first reset %v, problem %q", len(conns), conns[0].Reset, conns[0].ToClient.Problem())
	}
}
