package mpa

import (
	"bytes"
	"errors"
	"testing"

	"github.com/softrnic/softrnic/ddp"
)

// FuzzParser feeds arbitrary peer bytes, in arbitrary chunks, to the stream
// parser: it never panics, every Data event is a view inside the chunk it
// was given with consistent offsets, and errors are StreamErrors carrying an
// LLP Terminate cause.
func FuzzParser(f *testing.F) {
	for _, crc := range []bool{false, true} {
		for _, markers := range []bool{false, true} {
			fr := NewFramer(crc, markers)
			s := fr.Append(nil, sendULPDU(1, 600), nil)
			s = fr.Append(s, nil, nil)
			f.Add(s, crc, markers, uint8(7))
		}
	}
	f.Add([]byte{0xff, 0xff, 1, 2, 3}, true, false, uint8(0))
	f.Fuzz(func(t *testing.T, data []byte, crc, markers bool, chunk uint8) {
		p := NewParser(crc, markers)
		size := int(chunk) + 1
		var want, off int
		for len(data) > 0 {
			in := data[:min(size, len(data))]
			for len(in) > 0 {
				n, ev, err := p.Next(in)
				if err != nil {
					var se *StreamError
					if !errors.As(err, &se) || se.Err.Layer != ddp.LayerLLP {
						t.Fatalf("error %v is not an LLP StreamError", err)
					}
					return
				}
				if n <= 0 || n > len(in) {
					t.Fatalf("used %d of %d", n, len(in))
				}
				if ev.Kind == Data {
					if ev.Offset != off || ev.Offset+len(ev.Data) > ev.ULPDULen {
						t.Fatalf("data event %d+%d of %d, expected offset %d", ev.Offset, len(ev.Data), ev.ULPDULen, off)
					}
					if len(ev.Data) > 0 && !bytes.Contains(in[:n], ev.Data) {
						t.Fatal("data not from the input")
					}
					off += len(ev.Data)
					want = ev.ULPDULen
					if ev.End {
						if off != want {
							t.Fatalf("FPDU ended after %d of %d octets", off, want)
						}
						off, want = 0, 0
					}
				}
				in = in[n:]
			}
			data = data[min(size, len(data)):]
		}
	})
}

// FuzzRoundTrip: whatever ULPDUs are framed, with any settings, come back
// identical through any chunking.
func FuzzRoundTrip(f *testing.F) {
	f.Add([]byte("hello"), uint16(3), true, true, uint8(1))
	f.Add(make([]byte, 1500), uint16(510), false, true, uint8(200))
	f.Fuzz(func(t *testing.T, data []byte, cut uint16, crc, markers bool, chunk uint8) {
		// Cut the input into ULPDUs of at most cut+1 octets.
		var ulpdus [][]byte
		for n := int(cut) + 1; len(data) > 0; data = data[min(n, len(data)):] {
			ulpdus = append(ulpdus, data[:min(n, len(data))])
		}
		fr := NewFramer(crc, markers)
		var s []byte
		for _, u := range ulpdus {
			before := fr.Pos()
			wl := fr.WireLen(len(u))
			s = fr.Append(s, u[:len(u)/2], u[len(u)/2:])
			if int(fr.Pos()-before) != wl {
				t.Fatalf("WireLen %d, framed %d", wl, fr.Pos()-before)
			}
		}
		a := NewAssembler(crc, markers)
		var got [][]byte
		var err error
		for size := int(chunk) + 1; len(s) > 0; s = s[min(size, len(s)):] {
			if got, err = a.Feed(s[:min(size, len(s))], got); err != nil {
				t.Fatal(err)
			}
		}
		if len(got) != len(ulpdus) {
			t.Fatalf("%d ULPDUs back, %d framed", len(got), len(ulpdus))
		}
		for i := range got {
			if !bytes.Equal(got[i], ulpdus[i]) {
				t.Fatalf("ULPDU %d differs", i)
			}
		}
	})
}

// FuzzParseFrame: a startup frame from a peer is decoded without panics or
// reads past its length; a frame that decodes re-encodes to the same octets
// but for the bits receivers ignore.
func FuzzParseFrame(f *testing.F) {
	for _, fr := range []Frame{
		{CRC: true, Revision: 1, PrivateData: []byte("abc")},
		{Reply: true, Revision: 2, Enhanced: true, IRD: 1, ORD: 1, PeerToPeer: true, RTR: RTRWrite},
		{Revision: 2, Enhanced: true, IRD: 0x3fff, ORD: 0x3fff, PeerToPeer: true, RTR: RTRSend | RTRRead | RTRWrite},
	} {
		b, _ := fr.Append(nil)
		f.Add(b, fr.Reply)
	}
	f.Fuzz(func(t *testing.T, b []byte, reply bool) {
		fr, n, err := ParseFrame(b, reply)
		if err != nil {
			if err != ErrShortFrame && !errors.Is(err, ddp.LLPInvalidFrame) {
				t.Fatalf("error %v neither short nor an invalid frame", err)
			}
			return
		}
		if n > len(b) || n < FrameHeaderLen {
			t.Fatalf("length %d of %d", n, len(b))
		}
		out, err := fr.Append(nil)
		if err != nil {
			t.Fatalf("decoded frame does not encode: %v (%+v)", err, fr)
		}
		want := bytes.Clone(b[:n])
		// Res bits, R in a Request, S in revision 1, and the RTR bits
		// without A are not carried.
		want[offFlags] &^= 0x0f
		if !reply {
			want[offFlags] &^= flagReject
		}
		if want[offRev] < 2 {
			want[offFlags] &^= flagEnhanced
		} else if fr.Enhanced && !fr.PeerToPeer {
			want[FrameHeaderLen] &^= 0x40
			want[FrameHeaderLen+2] &^= 0xc0
		}
		if !bytes.Equal(out, want) {
			t.Fatalf("re-encode:\n got %x\nwant %x", out, want)
		}
	})
}
