package sdp_test

import (
	"os"
	"testing"

	"github.com/softrnic/softrnic/internal/leakcheck"
)

// TestMain fails the run if a goroutine the tests started (a connection's
// background loop or finishing Close, a listener's accept loop or
// classification, a session's open, the daemon's loops) is still running
// after the tests closed what they opened; startServer checks each test
// that starts a daemon on its own, naming it.
func TestMain(m *testing.M) { os.Exit(leakcheck.Main(m)) }
