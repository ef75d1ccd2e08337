package lossgrid

import (
	"encoding/binary"
	"fmt"
)

// The streams carry a pattern cheap enough to write and check at link
// speed in the pump's own goroutine (an engine receiver checks there):
// the 8-octet word at offset 8i is word(seed, i), so data misplaced,
// duplicated or corrupted shows at the word it lands on.

func word(seed, i uint64) uint64 { return (i ^ seed) * 0x9e3779b97f4a7c15 }

// fill writes the pattern for [off, off+len(b)) into b.
func fill(seed, off uint64, b []byte) {
	for len(b) > 0 && off%8 != 0 {
		b[0] = byte(word(seed, off/8) >> (8 * (off % 8)))
		b, off = b[1:], off+1
	}
	for len(b) >= 8 {
		binary.LittleEndian.PutUint64(b, word(seed, off/8))
		b, off = b[8:], off+8
	}
	for i := range b {
		b[i] = byte(word(seed, (off+uint64(i))/8) >> (8 * ((off + uint64(i)) % 8)))
	}
}

// check reports the first octet of b that is not the pattern at off.
func check(seed, off uint64, b []byte) error {
	bad := func(k int) error {
		o := off + uint64(k)
		return fmt.Errorf("octet %d of the stream: got %#x, want %#x", o, b[k], byte(word(seed, o/8)>>(8*(o%8))))
	}
	k := 0
	for ; k < len(b) && (off+uint64(k))%8 != 0; k++ {
		o := off + uint64(k)
		if b[k] != byte(word(seed, o/8)>>(8*(o%8))) {
			return bad(k)
		}
	}
	for ; k+8 <= len(b); k += 8 {
		if binary.LittleEndian.Uint64(b[k:]) != word(seed, (off+uint64(k))/8) {
			for j := k; ; j++ {
				o := off + uint64(j)
				if b[j] != byte(word(seed, o/8)>>(8*(o%8))) {
					return bad(j)
				}
			}
		}
	}
	for ; k < len(b); k++ {
		o := off + uint64(k)
		if b[k] != byte(word(seed, o/8)>>(8*(o%8))) {
			return bad(k)
		}
	}
	return nil
}
