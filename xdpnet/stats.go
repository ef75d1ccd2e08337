package xdpnet

import (
	"fmt"
	"time"

	"github.com/softrnic/softrnic/internal/impair"
	"github.com/softrnic/softrnic/tcp"
	"github.com/softrnic/softrnic/xsk"
)

// Stats count what a Poller did. Read them with Poller.Stats.
type Stats struct {
	// RXFrames: frames taken from the RX ring; RXNotIPv4, RXMalformed,
	// BadIPChecksum, RXNotForUs (fragments, not TCP, another
	// destination): dropped before the Stack.
	RXFrames, RXNotIPv4, RXMalformed, BadIPChecksum, RXNotForUs uint64
	// BadTCPChecksum: segments the Stack dropped for their checksum;
	// rising, it means the peer sends partial checksums (offloads on).
	BadTCPChecksum uint64
	// TXFrames: frames submitted; TXNoNeighbour: segments dropped for
	// want of a destination MAC; Kicks: TX wakeups.
	TXFrames, TXNoNeighbour, Kicks uint64
	// FlowErrors: flow map updates that failed.
	FlowErrors uint64
	// NetlinkEvents: neighbour and route changes the kernel notified.
	NetlinkEvents uint64
	// HandedOff: frames passed to the poller that owns their flow;
	// HandoffDrops: dropped because its ring was full; MovingDrops:
	// dropped while their connection moved between pollers, or handed
	// to this poller after it had moved on to another.
	HandedOff, HandoffDrops, MovingDrops uint64
	// Sleeps: times the loop slept in ppoll, for Slept in all; Wakeups
	// by the loop's own eventfd (Do, Async, frames handed over);
	// Doorbells: wake-ups by the doorbell; Turns of the loop.
	Sleeps, Wakeups, Doorbells, Turns uint64
	Slept                             time.Duration
	// YieldBackoffs: spins that stopped yielding the CPU after a yield
	// that did not come back soon (see yield).
	YieldBackoffs uint64
	// Stalls: episodes in which the loop had work and made no progress
	// for a watchdog's threshold (CheckStall); read live, not published
	// by the loop, since a stalled loop publishes nothing.
	Stalls uint64
	// Flows and Listens currently registered with the steering program.
	Flows, Listens int
	// ConnStalls: episodes in which a connection waited on the wire
	// with nothing acknowledged or received for Config.ConnStallAfter, each
	// reported to Config.Warn.
	ConnStalls uint64
	// Ports: local ports held for active connections, each by one
	// kernel socket (shared by the pollers of a Group: see portTable).
	Ports int
	// ImpairRX and ImpairTX count what the impaired link did.
	ImpairRX, ImpairTX impair.Stats
	// Stack is the Stack's own counters.
	Stack tcp.StackStats
	// Socket is the kernel's counters of the AF_XDP socket.
	Socket xsk.Statistics
}

// Stats returns the counters as the loop last published them (every
// 100 ms, after each Do, and when Run ends), with the socket's kernel
// counters and Stalls read now.
func (p *Poller) Stats() Stats {
	var st Stats
	if s := p.statsShadow.Load(); s != nil {
		st = *s
	}
	if p.sock != nil && !p.closed.Load() {
		st.Socket, _ = p.sock.Statistics()
	}
	st.Stalls = p.stalls.Load()
	return st
}

// publishStats copies the loop's counters, and the Stack's, where Stats
// reads them: one allocation and one atomic store, so the loop calls it
// at every sweep, after each Do and as Run ends, never per frame.
func (p *Poller) publishStats() {
	st := p.stats
	st.RXFrames = p.received.Load()
	st.Stack = p.stack.Stats
	st.BadTCPChecksum = p.stack.Stats.BadChecksum
	st.Flows, st.Listens = len(p.flows), len(p.listens)
	if p.ports != nil {
		st.Ports = p.ports.held()
	}
	if p.rxStage != nil {
		st.ImpairRX = p.rxStage.Stats
	}
	if p.txStage != nil {
		st.ImpairTX = p.txStage.Stats
	}
	p.statsShadow.Store(&st)
}

// FramesReceived is the number of frames the loop has taken from its RX
// ring, read now (Stats publishes them every 100 ms).
func (p *Poller) FramesReceived() uint64 { return p.received.Load() }

// offloadWarnAfter is how many segments dropped for their TCP checksum
// make checkOffloads warn: one can be corruption on the wire, a run of
// them is the peer's offloads.
const offloadWarnAfter = 3

// checkOffloads warns, once, when the Stack starts dropping segments for
// their TCP checksum: a veth peer (or any sender) with TX checksum offload,
// TSO or GSO on hands over partial checksums and super-packets, which
// nothing on this path completes. Corruption on a real wire looks the
// same but is rare; a run of them is the offloads.
func (p *Poller) checkOffloads() {
	bad := p.stack.Stats.BadChecksum
	if p.warnedChecksum || bad < offloadWarnAfter || p.cfg.Warn == nil {
		return
	}
	p.warnedChecksum = true
	p.cfg.Warn(fmt.Sprintf("%s queue %d: %d TCP segments dropped for bad checksums: the peer probably sends with offloads on "+
		"(on a veth peer: ethtool -K PEER tx off tso off gso off)", p.cfg.Interface, p.cfg.Queue, bad))
}
