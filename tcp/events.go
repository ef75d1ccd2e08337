package tcp

// Handler calls.
//
// The rule: the engine calls a connection's Handler (Receive, Event, and
// Fill of a Filler) only from inside Stack.Input, Stack.InputSegment,
// Stack.Advance and Stack.Output — the calls the poller that owns the
// Stack makes with no lock held — and never from inside another Handler
// call. A Conn or Listener method (Abort, Close, Listener.Close, …) never
// calls a Handler itself:
//
//   - an event raised while a Handler call runs (a Receive that aborts its
//     connection) is queued and delivered as soon as that call returns;
//   - an event raised outside Input, Advance and Output (an application
//     that aborts a connection from a Poller.Do function, perhaps holding
//     its own locks) is queued and delivered at the start of the next of
//     them, which the poller makes in the same turn.
//
// So a Handler may take any lock that is never held across a call to
// Input, Advance or Output, and may call any Conn method from inside its
// callbacks, without ever being re-entered. Events reach each connection
// in the order they were raised; a connection's queued events travel with
// it when it moves to another Stack (Detach, Adopt).

// event raises ev for c's Handler: at once when the Stack is driving and
// no Handler call runs, otherwise queued (see the rule above).
func (c *Conn) event(ev Event) {
	if len(c.events) == 0 && c.stack != nil {
		c.stack.evConns = append(c.stack.evConns, c)
	}
	c.events = append(c.events, ev)
	if s := c.stack; s != nil && s.driving && !s.calling {
		s.deliver()
	}
}

// deliver gives queued events to their Handlers; never inside a Handler
// call, whose events wait until it returns.
func (s *Stack) deliver() {
	if s.calling {
		return
	}
	// By index, as Handlers may queue more meanwhile, and reusing both
	// slices: an event per received segment allocates nothing.
	for i := 0; i < len(s.evConns); i++ {
		c := s.evConns[i]
		s.evConns[i] = nil
		if c == nil {
			continue // dropped (Detach)
		}
		for j := 0; j < len(c.events); j++ {
			if c.h != nil {
				s.calling = true
				c.h.Event(c, c.events[j])
				s.calling = false
			}
		}
		c.events = c.events[:0]
	}
	s.evConns = s.evConns[:0]
}

// enter starts a driving call (Input, Advance, Output), delivering what
// Conn methods queued since the last; outer says it is the outermost.
func (s *Stack) enter() (outer bool) {
	if s.driving {
		return false
	}
	s.driving = true
	s.deliver()
	return true
}

// leave ends the driving call enter started.
func (s *Stack) leave(outer bool) {
	if outer {
		s.deliver()
		s.driving = false
	}
}

// handlerReceive gives in-order payload to the Handler and returns how
// much it took. A connection its Handler closed takes nothing more.
func (c *Conn) handlerReceive(b []byte) int {
	if c.state == StateClosed {
		return len(b)
	}
	s := c.stack
	s.calling = true
	k := c.h.Receive(c, b)
	s.calling = false
	s.deliver()
	return k
}

// handlerFill asks the Filler for data to send.
func (c *Conn) handlerFill(f Filler, dst []byte) int {
	if c.state == StateClosed {
		return 0
	}
	s := c.stack
	s.calling = true
	k := f.Fill(c, dst)
	s.calling = false
	s.deliver()
	return k
}

// dropQueued takes c off the Stack's list of connections with queued
// events (Detach); its events stay with it.
func (s *Stack) dropQueued(c *Conn) {
	if len(c.events) == 0 {
		return
	}
	for i, x := range s.evConns {
		if x == c {
			s.evConns[i] = nil // deliver skips it
			return
		}
	}
}
