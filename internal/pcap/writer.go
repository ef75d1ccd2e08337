package pcap

import (
	"encoding/binary"
	"io"
)

// Writer writes a classic pcap file of Ethernet frames. Tests use it to
// build captures with segmentation, loss and reordering chosen by hand.
type Writer struct {
	w    io.Writer
	buf  []byte
	nsec uint64
}

// NewWriter writes the file header.
func NewWriter(w io.Writer) (*Writer, error) {
	var h [24]byte
	binary.LittleEndian.PutUint32(h[0:], magicNano)
	binary.LittleEndian.PutUint16(h[4:], 2)
	binary.LittleEndian.PutUint16(h[6:], 4)
	binary.LittleEndian.PutUint32(h[16:], 262144)
	binary.LittleEndian.PutUint32(h[20:], LinkEthernet)
	_, err := w.Write(h[:])
	return &Writer{w: w}, err
}

// WriteTCP writes seg as an Ethernet frame carrying IPv4 or IPv6 (after the
// addresses' family), with correct checksums. Each packet is stamped one
// microsecond after the previous. Truncated captures only half the payload.
func (w *Writer) WriteTCP(seg *Segment) error {
	v4 := seg.Src.Addr().Is4()
	ipLen := 40
	ethertype := uint16(0x86dd)
	if v4 {
		ipLen, ethertype = 20, 0x0800
	}
	tcpLen := 20 + len(seg.Payload)
	b := w.buf[:0]
	b = append(b, make([]byte, 12)...) // MACs do not matter here
	b = binary.BigEndian.AppendUint16(b, ethertype)
	ip := len(b)
	b = append(b, make([]byte, ipLen)...)
	if v4 {
		h := b[ip:]
		h[0] = 0x45
		binary.BigEndian.PutUint16(h[2:], uint16(ipLen+tcpLen))
		h[6] = 0x40 // DF
		h[8] = 64
		h[9] = 6
		s, d := seg.Src.Addr().As4(), seg.Dst.Addr().As4()
		copy(h[12:], s[:])
		copy(h[16:], d[:])
		binary.BigEndian.PutUint16(h[10:], ^fold(sum(0, h[:20])))
	} else {
		h := b[ip:]
		h[0] = 0x60
		binary.BigEndian.PutUint16(h[4:], uint16(tcpLen))
		h[6] = 6
		h[7] = 64
		s, d := seg.Src.Addr().As16(), seg.Dst.Addr().As16()
		copy(h[8:], s[:])
		copy(h[24:], d[:])
	}
	t := len(b)
	b = binary.BigEndian.AppendUint16(b, seg.Src.Port())
	b = binary.BigEndian.AppendUint16(b, seg.Dst.Port())
	b = binary.BigEndian.AppendUint32(b, seg.Seq)
	b = binary.BigEndian.AppendUint32(b, seg.Ack)
	b = append(b, 5<<4, seg.Flags)
	b = binary.BigEndian.AppendUint16(b, seg.Window)
	b = append(b, 0, 0, 0, 0) // checksum, urgent pointer
	b = append(b, seg.Payload...)
	// Pseudo-header: addresses, protocol, TCP length.
	var ps uint32
	if v4 {
		ps = sum(0, b[ip+12:ip+20])
	} else {
		ps = sum(0, b[ip+8:ip+40])
	}
	ps += 6 + uint32(tcpLen)
	binary.BigEndian.PutUint16(b[t+16:], ^fold(sum(ps, b[t:])))
	w.buf = b
	orig := len(b)
	if seg.Truncated {
		b = b[:len(b)-len(seg.Payload)/2-1]
	}
	w.nsec += 1000
	var rec [16]byte
	binary.LittleEndian.PutUint32(rec[0:], uint32(w.nsec/1e9))
	binary.LittleEndian.PutUint32(rec[4:], uint32(w.nsec%1e9))
	binary.LittleEndian.PutUint32(rec[8:], uint32(len(b)))
	binary.LittleEndian.PutUint32(rec[12:], uint32(orig))
	if _, err := w.w.Write(rec[:]); err != nil {
		return err
	}
	_, err := w.w.Write(b)
	return err
}

// sum adds b to the one's-complement accumulator s as 16-bit words.
func sum(s uint32, b []byte) uint32 {
	for len(b) >= 2 {
		s += uint32(binary.BigEndian.Uint16(b))
		b = b[2:]
	}
	if len(b) == 1 {
		s += uint32(b[0]) << 8
	}
	return s
}

func fold(s uint32) uint16 {
	for s > 0xffff {
		s = s>>16 + s&0xffff
	}
	return uint16(s)
}
