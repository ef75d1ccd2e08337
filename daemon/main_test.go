package daemon

import (
	"os"
	"testing"

	"github.com/softrnic/softrnic/internal/leakcheck"
)

// TestMain fails the run if a goroutine the tests started (the Server's
// accept loop, a session's loops, a device's) is still running after the
// tests closed their servers and devices. Run as a helper process of a
// test (privHelper), the binary is that helper instead.
func TestMain(m *testing.M) {
	if mode := os.Getenv(privHelper); mode != "" {
		privHelperMain(mode)
	}
	os.Exit(leakcheck.Main(m))
}
