package rnic

import (
	"os"
	"testing"

	"github.com/softrnic/softrnic/internal/leakcheck"
)

// TestMain fails the run if a goroutine the tests started (a QP's receive or
// transmit loop, a Listener's accept loop or handshake, a poller of the xdp
// datapath) is still running after the tests closed their devices.
func TestMain(m *testing.M) { os.Exit(leakcheck.Main(m)) }
