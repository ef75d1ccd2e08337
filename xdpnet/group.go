package xdpnet

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/softrnic/softrnic/internal/shrink"
	"github.com/softrnic/softrnic/tcp"
)

// Group joins the pollers of one interface, one per receive queue. Every
// flow is owned by one poller, the one its connection lives on; the NIC
// (or veth) picks the queue a segment arrives on without asking us, so a
// poller that receives a segment of a flow it does not own copies the
// frame into a single-producer ring towards the owner and wakes it. SYNs to
// a port another poller listens on go the same way. The pollers of a Group
// share one clock, so that Move can carry a connection, timers and all,
// from one poller's Stack to another's.
//
// All pollers join (NewPoller with Config.Group) before any of them runs.
type Group struct {
	start time.Time

	mu     sync.RWMutex
	owners map[tcp.FourTuple]*Poller
	// ownersMost is owners' high-water mark (shrink).
	ownersMost int
	listens    map[uint16]*Poller
	// moving: flows between two pollers (Move); their segments are
	// dropped meanwhile, and TCP retransmits them.
	moving  map[tcp.FourTuple]bool
	pollers []*Poller
	// ports are the local ports of the pollers' active connections
	// (they serve one address), shared as their flows may move.
	ports *portTable
}

// NewGroup returns an empty group.
func NewGroup() *Group {
	return &Group{start: time.Now(), owners: map[tcp.FourTuple]*Poller{}, listens: map[uint16]*Poller{},
		moving: map[tcp.FourTuple]bool{}}
}

// handoffSlots is the capacity of the ring from one poller to another.
const handoffSlots = 512

// cacheLine is the size the ring's indices are padded to, so that the
// consumer's and the producer's stores do not contend for one line.
const cacheLine = 64

// handoff is a single-producer single-consumer ring of frames from one
// poller's loop to another's.
type handoff struct {
	frames [handoffSlots][]byte
	_      [cacheLine]byte
	head   atomic.Uint32 // next to take; the consumer's
	_      [cacheLine - 4]byte
	tail   atomic.Uint32 // next to fill; the producer's
	_      [cacheLine - 4]byte
}

func newHandoff() *handoff {
	h := &handoff{}
	for i := range h.frames {
		h.frames[i] = make([]byte, 0, frameSize)
	}
	return h
}

// push copies frame in; false when the ring is full.
func (h *handoff) push(frame []byte) bool {
	t := h.tail.Load()
	if t-h.head.Load() == handoffSlots {
		return false
	}
	s := &h.frames[t%handoffSlots]
	*s = append((*s)[:0], frame...)
	h.tail.Store(t + 1)
	return true
}

// drain gives each waiting frame to fn, at most max of them, and then
// gives their slots back to the producer; it returns how many.
func (h *handoff) drain(max int, fn func([]byte)) int {
	head, tail := h.head.Load(), h.tail.Load()
	n := 0
	for head != tail && n < max {
		fn(h.frames[head%handoffSlots])
		head++
		n++
	}
	if n > 0 {
		h.head.Store(head)
	}
	return n
}

// join adds p to the group with a ring to and from every earlier member.
func (g *Group) join(p *Poller) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ports == nil {
		g.ports = newPortTable(p.cfg.Addr)
	}
	p.ports = g.ports
	p.out = make(map[*Poller]*handoff)
	for _, q := range g.pollers {
		pq, qp := newHandoff(), newHandoff()
		p.out[q], q.in = pq, append(q.in, pq)
		q.out[p], p.in = qp, append(p.in, qp)
	}
	g.pollers = append(g.pollers, p)
}

// route says where a segment p has no connection for belongs: its flow's
// owner, or for a SYN the poller listening on its port; drop for a flow
// being moved; nil when nobody claims it (p's Stack answers it).
func (g *Group) route(id tcp.FourTuple, syn bool) (owner *Poller, drop bool) {
	g.mu.RLock()
	defer g.mu.RUnlock()
	if g.moving[id] {
		return nil, true
	}
	if o := g.owners[id]; o != nil {
		return o, false
	}
	if syn {
		return g.listens[id.LocalPort], false
	}
	return nil, false
}

// setOwner, clearOwner and setListen do nothing on a nil Group: a poller
// alone owns everything it has.
func (g *Group) setOwner(id tcp.FourTuple, p *Poller) {
	if g == nil {
		return
	}
	g.mu.Lock()
	g.owners[id] = p
	g.mu.Unlock()
}

func (g *Group) clearOwner(id tcp.FourTuple, p *Poller) {
	if g == nil {
		return
	}
	g.mu.Lock()
	if g.owners[id] == p {
		delete(g.owners, id)
		g.owners = shrink.Map(g.owners, &g.ownersMost)
	}
	g.mu.Unlock()
}

func (g *Group) setListen(port uint16, p *Poller) {
	if g == nil {
		return
	}
	g.mu.Lock()
	if p == nil {
		delete(g.listens, port)
	} else {
		g.listens[port] = p
	}
	g.mu.Unlock()
}

func (g *Group) setMoving(id tcp.FourTuple, moving bool) {
	g.mu.Lock()
	if moving {
		g.moving[id] = true
	} else {
		delete(g.moving, id)
	}
	g.mu.Unlock()
}

// handTo queues a frame for the poller that owns its flow, and wakes it
// if it sleeps (once per sleep, however many frames follow).
func (p *Poller) handTo(to *Poller, frame []byte) {
	h := p.out[to]
	if h == nil || !h.push(frame) {
		p.stats.HandoffDrops++
		return
	}
	p.stats.HandedOff++
	to.Wake()
}

// handedWaiting reports whether another poller has handed this one frames
// it has not taken yet.
func (p *Poller) handedWaiting() bool {
	for _, h := range p.in {
		if h.tail.Load() != h.head.Load() {
			return true
		}
	}
	return false
}

// receiveHandoffs takes the frames other pollers handed to this one.
func (p *Poller) receiveHandoffs(now tcp.Time) bool {
	work := false
	for _, h := range p.in {
		if h.drain(rxBatch, func(frame []byte) { p.inputFrame(now, frame, true) }) > 0 {
			work = true
		}
	}
	return work
}
