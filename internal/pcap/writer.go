package pcap

import (
	"encoding/binary"
	"io"

	"github.com/softrnic/softrnic/header"
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
	ipLen := header.IPv6Len
	ethertype := uint16(header.EtherTypeIPv6)
	if v4 {
		ipLen, ethertype = header.IPv4MinLen, header.EtherTypeIPv4
	}
	tcpLen := header.TCPMinLen + len(seg.Payload)
	n := header.EthernetLen + ipLen + tcpLen
	if cap(w.buf) < n {
		w.buf = make([]byte, n)
	}
	b := w.buf[:n]
	header.Ethernet(b).Encode(&header.EthernetFields{Type: ethertype}) // MACs do not matter here
	ip := b[header.EthernetLen:]
	if v4 {
		header.IPv4(ip).Encode(&header.IPv4Fields{TotalLen: uint16(ipLen + tcpLen), DontFragment: true, TTL: 64,
			Protocol: header.IPProtocolTCP, Src: seg.Src.Addr(), Dst: seg.Dst.Addr()})
	} else {
		header.IPv6(ip).Encode(&header.IPv6Fields{PayloadLen: uint16(tcpLen), NextHeader: header.IPProtocolTCP, HopLimit: 64,
			Src: seg.Src.Addr(), Dst: seg.Dst.Addr()})
	}
	t := header.TCP(ip[ipLen:])
	t.Encode(&header.TCPFields{SrcPort: seg.Src.Port(), DstPort: seg.Dst.Port(), Seq: seg.Seq, Ack: seg.Ack,
		Flags: seg.Flags, Window: seg.Window})
	copy(t[header.TCPMinLen:], seg.Payload)
	t.SetChecksum(seg.Src.Addr(), seg.Dst.Addr())
	if seg.Truncated {
		b = b[:len(b)-len(seg.Payload)/2-1]
	}
	w.nsec += 1000
	var rec [16]byte
	binary.LittleEndian.PutUint32(rec[0:], uint32(w.nsec/1e9))
	binary.LittleEndian.PutUint32(rec[4:], uint32(w.nsec%1e9))
	binary.LittleEndian.PutUint32(rec[8:], uint32(len(b)))
	binary.LittleEndian.PutUint32(rec[12:], uint32(n))
	if _, err := w.w.Write(rec[:]); err != nil {
		return err
	}
	_, err := w.w.Write(b)
	return err
}
