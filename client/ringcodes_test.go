package client

import (
	"fmt"
	"testing"

	"github.com/softrnic/softrnic/completion"
	"github.com/softrnic/softrnic/internal/shm"
)

// Every DTO opcode of the event ring becomes the completion opcode of the
// same name (the daemon's side is daemon.TestDTOOpcodesMatchCompletion).
func TestRingCodes(t *testing.T) {
	seen := map[completion.Opcode]bool{}
	for d := shm.DTOOpcode(0); d < shm.NumDTOOpcodes; d++ {
		o := toOpcode(d)
		if o.String() != d.String() || seen[o] {
			t.Errorf("ring %v becomes completion %v", d, o)
		}
		seen[o] = true
	}
	if s := completion.Opcode(shm.NumDTOOpcodes).String(); s != fmt.Sprintf("opcode(%d)", shm.NumDTOOpcodes) {
		t.Errorf("completion opcode %q has no DTO opcode", s)
	}
	if toOpcode(200) != 200 {
		t.Errorf("an unknown opcode became %v", toOpcode(200))
	}
}
