package mpa

import (
	"fmt"
	"testing"
)

var benchSizes = []int{64, 1448, 3400}

// BenchmarkCRC32c is the yardstick: the standard library's CRC32c alone.
func BenchmarkCRC32c(b *testing.B) {
	for _, n := range benchSizes {
		buf := make([]byte, FPDULen(n))
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			b.SetBytes(int64(n))
			for b.Loop() {
				CRC32c(buf)
			}
		})
	}
}

// BenchmarkEncode frames one ULPDU (a DDP header and payload) into a reused
// buffer, CRC included.
func BenchmarkEncode(b *testing.B) {
	for _, markers := range []bool{false, true} {
		for _, n := range benchSizes {
			hdr := make([]byte, 18)
			payload := make([]byte, n-len(hdr))
			b.Run(fmt.Sprintf("markers=%v/%d", markers, n), func(b *testing.B) {
				f := NewFramer(true, markers)
				buf := make([]byte, 0, 2*FPDULen(n))
				b.SetBytes(int64(n))
				b.ReportAllocs()
				for b.Loop() {
					buf = f.Append(buf[:0], hdr, payload)
				}
			})
		}
	}
}

// BenchmarkParse parses a stream of FPDUs, CRC checked, delivered in
// 64 KiB chunks as a receive path would see them.
func BenchmarkParse(b *testing.B) {
	for _, markers := range []bool{false, true} {
		for _, n := range benchSizes {
			f := NewFramer(true, markers)
			var stream []byte
			count := 0
			for len(stream) < 1<<20 {
				stream = f.Append(stream, make([]byte, n), nil)
				count++
			}
			b.Run(fmt.Sprintf("markers=%v/%d", markers, n), func(b *testing.B) {
				b.SetBytes(int64(count * n))
				b.ReportAllocs()
				for b.Loop() {
					p := NewParser(true, markers)
					for s := stream; len(s) > 0; {
						chunk := s[:min(len(s), 64<<10)]
						s = s[len(chunk):]
						for len(chunk) > 0 {
							used, _, err := p.Next(chunk)
							if err != nil {
								b.Fatal(err)
							}
							chunk = chunk[used:]
						}
					}
				}
			})
		}
	}
}
