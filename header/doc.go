// Package header holds the wire formats below TCP's payload for the
// userspace TCP engine: Ethernet II, IPv4 (RFC 791), the fixed IPv6 header
// (RFC 8200), TCP (RFC 9293) and its options (RFC 7323, RFC 2018), and the
// Internet checksum (RFC 1071).
//
// Each header is a typed view over a byte slice, as in package ddp: offset
// constants, accessors, an Encode(*Fields) that writes the header into the
// slice, and an IsValid to call before anything else is trusted. Views copy
// nothing and allocate nothing; neither does ParseTCPOptions, which fills a
// caller's TCPOptions. The package keeps no state and knows no sequence
// arithmetic: sequence numbers are plain uint32 here, compared by package
// tcp.
//
// A received frame is taken apart outside in:
//
//	e := header.Ethernet(frame)
//	if !e.IsValid() || e.Type() != header.EtherTypeIPv4 { drop }
//	ip := header.IPv4(e.Payload())
//	if !ip.IsValid(len(ip)) || !ip.IsChecksumValid() || ip.IsFragment() { drop }
//	seg := header.TCP(ip.Payload()) // Ethernet padding already cut off
//	if !seg.IsValid(len(seg)) || !seg.IsChecksumValid(ip.Src(), ip.Dst()) { drop }
//	var opts header.TCPOptions
//	if !header.ParseTCPOptions(seg.Options(), &opts) { drop }
//
// and a segment is built inside out: TCPOptionsLen sizes the options,
// TCP.Encode and EncodeTCPOptions write the header, the payload follows,
// TCP.SetChecksum covers all three, and IPv4.Encode writes its own checksum.
package header
