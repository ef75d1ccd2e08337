package bpf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"
)

// Errors of the map methods, testable with errors.Is.
var (
	// ErrNotFound: RemoveListen or RemoveFlow of an entry that is not there.
	ErrNotFound = errors.New("not in the map")
	// ErrAddress: a Flow whose ends are not both valid IPv4 address/port
	// pairs (IPv4-mapped IPv6 is accepted). IPv6 steering is not built yet.
	ErrAddress = errors.New("flow needs IPv4 addresses")
)

// Flow is one TCP connection of the RNIC, named from this host's side.
type Flow struct {
	// Local is this host's address and port: the destination of the
	// segments the program steers.
	Local netip.AddrPort
	// Remote is the peer's address and port: their source.
	Remote netip.AddrPort
}

// String returns "local<-remote".
func (f Flow) String() string { return f.Local.String() + "<-" + f.Remote.String() }

// key is the flows map key as a received segment carries it: saddr/sport
// are the remote end. Fields hold network-order bytes, so they are read with
// the host's byte order (what the C side sees when it loads them raw).
func (f Flow) key() (steerFlowKey, error) {
	local, remote := f.Local.Addr().Unmap(), f.Remote.Addr().Unmap()
	if !f.Local.IsValid() || !f.Remote.IsValid() || !local.Is4() || !remote.Is4() {
		return steerFlowKey{}, fmt.Errorf("%w: %v", ErrAddress, f)
	}
	la, ra := local.As4(), remote.As4()
	return steerFlowKey{
		Saddr: binary.NativeEndian.Uint32(ra[:]),
		Daddr: binary.NativeEndian.Uint32(la[:]),
		Sport: netOrder(f.Remote.Port()),
		Dport: netOrder(f.Local.Port()),
	}, nil
}

// netOrder returns the uint16 whose in-memory bytes are port in network
// order.
func netOrder(port uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], port)
	return binary.NativeEndian.Uint16(b[:])
}

// flowValue is the value stored for every flow. The field is reserved for
// flags or a queue hint; the program tests presence only.
const flowValue uint32 = 0

// AddListen makes SYNs (without ACK) to the local TCP port go to the AF_XDP
// sockets. Adding a port twice is not an error.
func (s *Steering) AddListen(port uint16) error {
	return s.update(func() string { return "add listen port" }, func() error {
		return s.objs.ListenPorts.Put(netOrder(port), uint8(1))
	})
}

// RemoveListen stops steering SYNs to the port; connections already in
// flows are not affected. A port that was not added gives ErrNotFound.
func (s *Steering) RemoveListen(port uint16) error {
	return s.update(func() string { return "remove listen port" }, func() error {
		return notFound(s.objs.ListenPorts.Delete(netOrder(port)))
	})
}

// AddFlow makes every segment of the flow go to the AF_XDP sockets. Adding
// a flow twice is not an error.
func (s *Steering) AddFlow(f Flow) error {
	k, err := f.key()
	if err != nil {
		return fmt.Errorf("bpf: add flow: %w", err)
	}
	return s.update(func() string { return "add flow " + f.String() }, func() error {
		return s.objs.Flows.Put(&k, flowValue)
	})
}

// RemoveFlow returns the flow's segments to the kernel stack, which answers
// them with RST. A flow that was not added gives ErrNotFound.
func (s *Steering) RemoveFlow(f Flow) error {
	k, err := f.key()
	if err != nil {
		return fmt.Errorf("bpf: remove flow: %w", err)
	}
	return s.update(func() string { return "remove flow " + f.String() }, func() error {
		return notFound(s.objs.Flows.Delete(&k))
	})
}

// MaxQueues is the number of receive queues the socket map has room for.
const MaxQueues = 64

// SetSocket steers the frames of receive queue queue to the AF_XDP socket
// fd, which must be bound to that queue of the same interface (the kernel
// drops frames redirected to a socket bound elsewhere). The map holds its
// own reference: the caller may close fd after ClearSocket or Close.
func (s *Steering) SetSocket(queue int, fd int) error {
	if queue < 0 || queue >= MaxQueues {
		return fmt.Errorf("bpf: set socket: queue %d out of range 0..%d", queue, MaxQueues-1)
	}
	if fd < 0 {
		return fmt.Errorf("bpf: set socket: invalid fd %d", fd)
	}
	return s.update(func() string { return fmt.Sprintf("set socket of queue %d", queue) }, func() error {
		return s.objs.Xsks.Put(uint32(queue), uint32(fd))
	})
}

// ClearSocket removes the socket of the queue; steered frames of that queue
// then pass to the kernel (counted as RedirectFailed). Clearing an empty
// slot is not an error.
func (s *Steering) ClearSocket(queue int) error {
	if queue < 0 || queue >= MaxQueues {
		return fmt.Errorf("bpf: clear socket: queue %d out of range 0..%d", queue, MaxQueues-1)
	}
	return s.update(func() string { return fmt.Sprintf("clear socket of queue %d", queue) }, func() error {
		err := s.objs.Xsks.Delete(uint32(queue))
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil
		}
		return err
	})
}

// update runs one map operation unless the Steering is closed; what
// names it in an error, and is made only then (a flow's name is
// formatting and an allocation on every connection's way in and out).
func (s *Steering) update(what func() string, op func() error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("bpf: %s: %w", what(), ErrClosed)
	}
	if err := op(); err != nil {
		return fmt.Errorf("bpf: %s: %w", what(), err)
	}
	return nil
}

func notFound(err error) error {
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("%w: %w", ErrNotFound, err)
	}
	return err
}
