package mpadump

import (
	"errors"
	"io"
	"net/netip"
	"sort"

	"github.com/softrnic/softrnic/internal/pcap"
)

// maxPayload keeps a rewritten segment inside one IPv4 packet.
const maxPayload = 65000

// WriteNormalized writes the capture's TCP connections again, each startup
// frame and each FPDU in a TCP segment of its own, in the order the original
// capture completed them. The octets are the ones captured, unchanged; only
// the cuts between segments move. A dissector that cannot reassemble an FPDU
// spread over segments (Wireshark's MPA dissector, when a middlebox such as
// QEMU's user-mode network re-chunks the stream) then sees every FPDU
// whole. Octets after the last complete FPDU go out as one more segment.
// The report must come from AnalyzeWith with Options.Keep.
func (r *Report) WriteNormalized(w io.Writer) error {
	if !r.keep {
		return errors.New("mpadump: WriteNormalized needs a report analyzed with Options.Keep")
	}
	type event struct {
		packet int
		// rank orders events completed by the same packet: the
		// handshake, then startup frames, then FPDUs, then FINs. The
		// initiator's FPDUs held back for the Reply complete with it.
		rank int
		seg  pcap.Segment
	}
	var evs []event
	for _, c := range r.Conns {
		const cisn, sisn = 1000, 5000
		cl, sv := c.tcp.Client, c.tcp.Server
		evs = append(evs,
			event{c.first, 0, pcap.Segment{Src: cl, Dst: sv, Seq: cisn, Flags: pcap.FlagSYN, Window: 65535}},
			event{c.first, 0, pcap.Segment{Src: sv, Dst: cl, Seq: sisn, Ack: cisn + 1, Flags: pcap.FlagSYN | pcap.FlagACK, Window: 65535}},
			event{c.first, 0, pcap.Segment{Src: cl, Dst: sv, Seq: cisn + 1, Ack: sisn + 1, Flags: pcap.FlagACK, Window: 65535}})
		for _, d := range []struct {
			dir      *Dir
			src, dst netip.AddrPort
			isn, ack uint32
		}{{c.ToServer, cl, sv, cisn, sisn}, {c.ToClient, sv, cl, sisn, cisn}} {
			var start uint64
			emit := func(end uint64, packet, rank int) {
				for start < end {
					n := min(end-start, maxPayload)
					evs = append(evs, event{packet, rank, pcap.Segment{
						Src: d.src, Dst: d.dst, Seq: d.isn + 1 + uint32(start), Ack: d.ack + 1,
						Flags: pcap.FlagACK | pcap.FlagPSH, Window: 65535, Payload: d.dir.kept[start : start+n],
					}})
					start += n
				}
			}
			last := c.first
			for i, u := range d.dir.units {
				emit(u.end, u.packet, min(i+1, 2))
				last = u.packet
			}
			emit(uint64(len(d.dir.kept)), r.Packets, 2)
			if d.dir.tcp.Closed() {
				evs = append(evs, event{max(last, r.Packets), 3, pcap.Segment{
					Src: d.src, Dst: d.dst, Seq: d.isn + 1 + uint32(len(d.dir.kept)), Ack: d.ack + 1,
					Flags: pcap.FlagACK | pcap.FlagFIN, Window: 65535,
				}})
			}
		}
	}
	sort.SliceStable(evs, func(i, j int) bool {
		if evs[i].packet != evs[j].packet {
			return evs[i].packet < evs[j].packet
		}
		return evs[i].rank < evs[j].rank
	})
	pw, err := pcap.NewWriter(w)
	if err != nil {
		return err
	}
	for i := range evs {
		if err := pw.WriteTCP(&evs[i].seg); err != nil {
			return err
		}
	}
	return nil
}
