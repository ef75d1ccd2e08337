package mpadump

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/softrnic/softrnic/ddp"
	"github.com/softrnic/softrnic/internal/testenv"
	"github.com/softrnic/softrnic/internal/tshark"
	"github.com/softrnic/softrnic/mpa"
)

// A capture whose streams were re-chunked at random (what QEMU's user-mode
// network does to siw's traffic) comes out of WriteNormalized with every
// FPDU whole in a segment: Wireshark dissects all of them, with good CRCs,
// and our own decoder finds the same FPDUs in the rewritten file.
func TestNormalizedCaptureDissectedByWireshark(t *testing.T) {
	testenv.RequireTool(t, "tshark")
	cs := []conn{{
		ini:  mpa.Config{CRC: true, IRD: 4, ORD: 4},
		resp: mpa.Config{IRD: 4, ORD: 4},
		up:   many(30, func(i int) []byte { return send(ddp.MSN(i+1), 100+i*113) }),
		down: append(many(12, func(i int) []byte { return write(2000 + i*7) }), term()),
	}, {
		ini:  mpa.Config{Revision: 1},
		resp: mpa.Config{},
		up:   many(20, func(i int) []byte { return write(i * 50) }),
		down: many(20, func(i int) []byte { return send(ddp.MSN(i+1), 999) }),
	}}
	dir := t.TempDir()
	orig := filepath.Join(dir, "rechunked.pcap")
	if err := os.WriteFile(orig, capture(t, 7, cs...), 0o644); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(orig)
	rep, err := AnalyzeWith(bytes.NewReader(data), Options{Keep: true})
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := rep.WriteNormalized(&buf); err != nil {
		t.Fatal(err)
	}
	norm := filepath.Join(dir, "normalized.pcap")
	if err := os.WriteFile(norm, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}

	// The octets did not change: our decoder finds the same thing.
	again := analyze(t, buf.Bytes())
	for i, c := range again.Conns {
		if c.Problem() != "" || c.ToServer.FPDUs != len(cs[i].up) || c.ToClient.FPDUs != len(cs[i].down) {
			t.Fatalf("normalized conn %d: %d/%d FPDUs, problem %q", i, c.ToServer.FPDUs, c.ToClient.FPDUs, c.Problem())
		}
	}

	count := func(path string) (fpdus, undissected, good, bad int) {
		pkts, err := tshark.Dissect(path, tshark.IWARPArgs...)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range pkts {
			l, _ := p.Field("tcp.len")
			if n, _ := l.Uint(); n == 0 {
				continue
			}
			found := false
			for i := range p.Protos {
				pr := &p.Protos[i]
				if pr.Name != "iwarp_mpa" {
					continue
				}
				found = true
				if _, ok := pr.Get("iwarp_mpa.fpdu"); !ok {
					continue
				}
				fpdus++
				if f, ok := pr.Get("iwarp_mpa.crc_check"); ok {
					switch {
					case strings.Contains(f.ShowName, "Good CRC32"):
						good++
					case strings.Contains(f.ShowName, "Bad CRC32"):
						bad++
					}
				}
			}
			if _, ok := p.Field("tcp.reassembled_in"); !found && !ok {
				undissected++
			}
		}
		return
	}
	fpdus, undissected, good, bad := count(norm)
	want := 0
	for _, c := range cs {
		want += len(c.up) + len(c.down)
	}
	wantGood := len(cs[0].up) + len(cs[0].down)
	if fpdus != want || undissected != 0 || good != wantGood || bad != 0 {
		t.Errorf("Wireshark on the normalized capture: %d FPDUs (want %d), %d undissected, CRC good %d (want %d) bad %d",
			fpdus, want, undissected, good, wantGood, bad)
	}
	// The test means something only if the original defeats Wireshark.
	if f, u, _, _ := count(orig); f == want && u == 0 {
		t.Errorf("Wireshark dissected the re-chunked original completely (%d FPDUs); the test no longer shows the problem", f)
	} else {
		t.Logf("re-chunked original: Wireshark found %d of %d FPDUs, %d segments undissected", f, want, u)
	}
}
