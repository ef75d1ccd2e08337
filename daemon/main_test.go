package daemon

import (
	"os"
	"testing"

	"github.com/softrnic/softrnic/internal/leakcheck"
)

// TestMain fails the run if a goroutine the tests started (the Server's
// accept loop, a session's loops, a device's) is still running after the
// tests closed their servers and devices.
func TestMain(m *testing.M) { os.Exit(leakcheck.Main(m)) }
