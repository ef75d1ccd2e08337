package daemon

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"github.com/softrnic/softrnic/ctl"
)

// Every control operation has a handler, and each refuses a body that does
// not decode as a protocol error before it touches the session.
func TestHandlersCoverEveryOp(t *testing.T) {
	bad := bytes.Repeat([]byte{0xff}, ctl.MaxMessage) // no request decodes from it
	last := ctl.Op(0)
	for op := ctl.Op(1); op.Valid(); op++ {
		last = op
		if int(op) >= len(handlers) || handlers[op] == nil {
			t.Errorf("no handler for %v", op)
			continue
		}
		var ce *ctl.Error
		if _, _, err := handlers[op](nil, op, bad, nil); !errors.As(err, &ce) || ce.Status != ctl.ProtocolError {
			t.Errorf("%v with a bad body: %v", op, err)
		}
	}
	if len(handlers) != int(last)+1 {
		t.Errorf("%d handlers for ops up to %v", len(handlers), last)
	}
}

// An op the daemon does not know, zero or past the table, is answered
// NotImplemented, naming it.
func TestUnknownOpReply(t *testing.T) {
	s := &session{}
	for _, op := range []ctl.Op{0, ctl.Op(len(handlers)), 0xffff} {
		msg, err := ctl.Marshal(ctl.Header{Op: op, ID: 5}, &struct{}{})
		if err != nil {
			t.Fatal(err)
		}
		reply, out, err := s.dispatch(msg, nil)
		want, _ := ctl.Marshal(ctl.Header{Op: op, ID: 5, Status: ctl.NotImplemented}, &ctl.ErrorBody{Message: fmt.Sprintf("operation %v", op)})
		if err != nil || out != nil || !bytes.Equal(reply, want) {
			t.Errorf("%v: reply %x files %v err %v; want %x", op, reply, out, err, want)
		}
	}
}
