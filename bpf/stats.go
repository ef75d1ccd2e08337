package bpf

import (
	"fmt"
)

// Stats are the program's counters, summed over CPUs since Attach. Every
// frame the program sees is counted once in exactly one of the Steered… or
// Passed… fields; RedirectFailed counts again those steered frames that found
// no AF_XDP socket on their queue and passed to the kernel instead.
type Stats struct {
	// SteeredFlow: TCP segments of a flow added with AddFlow.
	SteeredFlow uint64
	// SteeredListen: SYNs without ACK to a port added with AddListen.
	SteeredListen uint64
	// PassedNotIP: frames whose EtherType (after up to two VLAN tags) is
	// not IPv4: ARP, IPv6 for now, and the rest.
	PassedNotIP uint64
	// PassedNotTCP: IPv4 packets of another protocol (ICMP, UDP, …).
	PassedNotTCP uint64
	// PassedNoMatch: TCP segments of neither a flow nor a listened-to SYN:
	// the host's own TCP.
	PassedNoMatch uint64
	// PassedFragment: IPv4 fragments, which the kernel reassembles.
	PassedFragment uint64
	// PassedMalformed: frames with truncated or invalid Ethernet, VLAN,
	// IPv4 or TCP headers, left for the kernel to judge.
	PassedMalformed uint64
	// RedirectFailed: steered frames whose receive queue had no socket in
	// the map, passed to the kernel (which answers an unowned SYN with
	// RST). Frames the kernel fails to deliver to a socket after the
	// redirect (its ring full) are counted by the socket, not here.
	RedirectFailed uint64
}

// statOrder lists the fields of Stats in the order of enum steer_stat in
// steer.c, which is the index of each counter in the stats map.
func (st *Stats) statOrder() []*uint64 {
	return []*uint64{
		&st.SteeredFlow,     // STAT_STEERED_FLOW
		&st.SteeredListen,   // STAT_STEERED_LISTEN
		&st.PassedNotIP,     // STAT_PASSED_NOT_IP
		&st.PassedNotTCP,    // STAT_PASSED_NOT_TCP
		&st.PassedNoMatch,   // STAT_PASSED_NO_MATCH
		&st.PassedFragment,  // STAT_PASSED_FRAGMENT
		&st.PassedMalformed, // STAT_PASSED_MALFORMED
		&st.RedirectFailed,  // STAT_REDIRECT_FAILED
	}
}

// Stats reads the counters. Each counter is read once over all CPUs; the
// set is not one atomic snapshot.
func (s *Steering) Stats() (Stats, error) {
	var st Stats
	err := s.update(func() string { return "read stats" }, func() error {
		fields := st.statOrder()
		if n := int(s.objs.Stats.MaxEntries()); n != len(fields) {
			return fmt.Errorf("stats map has %d counters, Stats knows %d: steer.c and stats.go disagree", n, len(fields))
		}
		var perCPU []uint64
		for i, f := range fields {
			if err := s.objs.Stats.Lookup(uint32(i), &perCPU); err != nil {
				return fmt.Errorf("counter %d: %w", i, err)
			}
			for _, v := range perCPU {
				*f += v
			}
		}
		return nil
	})
	return st, err
}
