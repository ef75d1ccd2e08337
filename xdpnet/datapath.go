package xdpnet

import (
	"time"

	"github.com/softrnic/softrnic/header"
	"github.com/softrnic/softrnic/tcp"
	"github.com/softrnic/softrnic/xsk"
)

const (
	// rxBatch is the most RX descriptors taken per turn of the loop,
	// txBatch the most segments produced per TX ring reservation.
	rxBatch = 64
	txBatch = 64
	// frameHeaders are the Ethernet and IPv4 (no options) headers in
	// front of each TCP segment sent.
	frameHeaders = header.EthernetLen + header.IPv4MinLen
)

// receive drains up to rxBatch frames from the RX ring into the Stack and
// gives their frames back to the fill ring. It reports whether it took any.
// A frame belongs to the loop from Peek until it is back on the RX free
// list, after Input: Handlers see payload only during Input.
func (p *Poller) receive() bool {
	rx := p.sock.RX()
	idx, n := rx.Peek(rxBatch)
	if n == 0 {
		p.refill()
		return false
	}
	now := p.now()
	u := p.umem
	for i := uint32(0); i < n; i++ {
		d := rx.Get(idx + i)
		if p.rxStage != nil {
			p.rxStage.Push(time.Duration(now), u.Packet(d))
		} else {
			p.inputFrame(now, u.Packet(d), false)
		}
		p.rxFree.Free(d.Addr)
	}
	rx.Release(n)
	p.received.Add(uint64(n))
	p.refill()
	return true
}

// refill hands free RX frames to the kernel.
func (p *Poller) refill() {
	if p.rxFree.Len() == 0 {
		return
	}
	fill := p.sock.Fill()
	if fill.Refill(p.rxFree, uint32(p.rxFree.Len())) > 0 && fill.NeedWakeup() {
		_ = p.sock.KickFill()
	}
}

// inputFrame checks one frame's Ethernet and IPv4 headers and gives its
// TCP segment to the Stack, registering the flow of a SYN to a listened
// port first so that the rest of the handshake is steered too. In a Group,
// a segment of a flow another poller owns is handed to it instead (handed:
// the frame came that way, and is not passed on again).
func (p *Poller) inputFrame(now tcp.Time, pkt []byte, handed bool) {
	eth := header.Ethernet(pkt)
	if !eth.IsValid() || eth.Type() != header.EtherTypeIPv4 {
		p.stats.RXNotIPv4++
		return
	}
	ip := header.IPv4(eth.Payload())
	if !ip.IsValid(len(ip)) {
		p.stats.RXMalformed++
		return
	}
	if !ip.IsChecksumValid() {
		p.stats.BadIPChecksum++
		return
	}
	if ip.IsFragment() || ip.Protocol() != header.IPProtocolTCP || ip.Dst() != p.cfg.Addr {
		p.stats.RXNotForUs++
		return
	}
	seg := ip.Payload()
	t := header.TCP(seg)
	if !t.IsValid(len(seg)) {
		p.stack.Input(now, ip.Src(), ip.Dst(), seg) // counted there
		return
	}
	syn := t.Flags()&(header.TCPFlagSYN|header.TCPFlagACK) == header.TCPFlagSYN
	id := tcp.FourTuple{LocalAddr: ip.Dst(), RemoteAddr: ip.Src(), LocalPort: t.DstPort(), RemotePort: t.SrcPort()}
	if len(p.held) > 0 {
		if h := p.held[id]; h != nil {
			h.keep(pkt) // a connection being taken over: for Import (or given back: dropped)
			return
		}
	}
	listened := syn && len(p.listens) > 0 && p.listens[id.LocalPort] != nil
	// Alone in its Group a poller owns every flow: no lookup, no lock.
	if g := p.cfg.Group; g != nil && len(p.in) > 0 && !listened && p.stack.Lookup(id) == nil {
		owner, drop := g.route(id, syn)
		switch {
		case drop:
			p.stats.MovingDrops++
			return
		case owner != nil && owner != p:
			if handed {
				// Handed here, but Move gave the flow to a third
				// poller meanwhile: this Stack would reset it.
				// Drop it; TCP retransmits to the new owner.
				p.stats.MovingDrops++
				return
			}
			p.handTo(owner, pkt)
			return
		}
	}
	if listened {
		p.addPassiveFlow(now, id)
	}
	p.stack.Input(now, ip.Src(), ip.Dst(), seg)
}

// transmit recycles completed TX frames, drains Stack.Output into free TX
// frames and kicks the kernel when the ring asks for it. It reports
// whether anything moved.
func (p *Poller) transmit(now tcp.Time) (bool, error) {
	work := false
	if n := p.sock.Completion().Drain(p.txFree, p.sock.Completion().Size()); n > 0 {
		p.inFlight -= n
		work = true
	}
	tx := p.sock.TX()
	u := p.umem
	p.more = false
	if p.txStage != nil && p.sendImpaired(now) {
		work = true
	}
	for {
		want := min(uint32(p.txFree.Len()), txBatch)
		if want == 0 {
			p.more = true
			break
		}
		idx, k := tx.Reserve(want)
		if k == 0 {
			p.more = true
			break
		}
		var i uint32
		empty := false
		for i < k {
			addr, _ := p.txFree.Alloc()
			frame := u.Frame(addr)
			n, src, dst := p.stack.Output(now, frame[frameHeaders:])
			if n == 0 {
				p.txFree.Free(addr)
				empty = true
				break
			}
			mac, ok := p.neigh.lookup(now, dst)
			if !ok {
				p.txFree.Free(addr)
				p.stats.TXNoNeighbour++
				continue
			}
			header.Ethernet(frame).Encode(&header.EthernetFields{Dst: mac, Src: p.mac, Type: header.EtherTypeIPv4})
			total := header.IPv4MinLen + n
			header.IPv4(frame[header.EthernetLen:]).Encode(&header.IPv4Fields{
				TotalLen: uint16(total), ID: p.ipID, DontFragment: true,
				TTL: 64, Protocol: header.IPProtocolTCP, Src: src, Dst: dst,
			})
			p.ipID++
			if p.txStage != nil {
				// The impaired link takes a copy; the frame is free again.
				p.txStage.Push(time.Duration(now), frame[:header.EthernetLen+total])
				p.txFree.Free(addr)
				continue
			}
			tx.Set(idx+i, xsk.Desc{Addr: addr, Len: uint32(header.EthernetLen + total)})
			i++
		}
		tx.Submit(i)
		tx.Cancel(k - i)
		if i > 0 {
			work = true
			p.inFlight += i
			p.stats.TXFrames += uint64(i)
		}
		if empty {
			break
		}
	}
	// In copy mode a kick sends a bounded batch: kick while the kernel
	// has not taken everything submitted.
	if tx.Size()-tx.Free() > 0 && tx.NeedWakeup() {
		p.stats.Kicks++
		if err := p.sock.Kick(); err != nil {
			return work, err
		}
	}
	return work, nil
}

// receiveImpaired gives the Stack the received frames the impaired link
// lets through by now; it reports whether there were any.
func (p *Poller) receiveImpaired(now tcp.Time) bool {
	work := false
	for {
		n, ok := p.rxStage.Pop(time.Duration(now), p.scratch)
		if !ok {
			return work
		}
		work = true
		p.inputFrame(now, p.scratch[:n], false)
	}
}

// sendImpaired submits the frames the impaired link lets out by now.
func (p *Poller) sendImpaired(now tcp.Time) bool {
	tx := p.sock.TX()
	sent := false
	for p.txFree.Len() > 0 {
		next, ok := p.txStage.Next()
		if !ok || next > time.Duration(now) {
			break
		}
		idx, k := tx.Reserve(1)
		if k == 0 {
			break
		}
		addr, _ := p.txFree.Alloc()
		n, _ := p.txStage.Pop(time.Duration(now), p.umem.Frame(addr))
		tx.Set(idx, xsk.Desc{Addr: addr, Len: uint32(n)})
		tx.Submit(1)
		p.inFlight++
		p.stats.TXFrames++
		sent = true
	}
	return sent
}
