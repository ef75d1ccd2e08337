package sdp_test

import (
	"io"
	"testing"

	"github.com/softrnic/softrnic/sdp"
)

// BenchmarkPingPong is a 1-octet round trip between two sdp connections
// through an in-process daemon on loopback (kernel datapath).
func BenchmarkPingPong(b *testing.B) {
	sock := startDaemon(b)
	ln := listen(b, sock)
	c1, c2, err := pair(b, &sdp.Dialer{Socket: sock, NoFallback: true}, ln)
	if err != nil {
		b.Fatal(err)
	}
	defer c1.Close()
	defer c2.Close()
	go func() {
		var one [1]byte
		for {
			if _, err := io.ReadFull(c2, one[:]); err != nil {
				return
			}
			if _, err := c2.Write(one[:]); err != nil {
				return
			}
		}
	}()
	var one [1]byte
	b.ResetTimer()
	for range b.N {
		if _, err := c1.Write(one[:]); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c1, one[:]); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	st := c1.(*sdp.Conn).Stats()
	b.ReportMetric(float64(st.MessagesSent)/float64(b.N), "msgs/op")
}

// BenchmarkStream64K streams 64 KiB Writes one way.
func BenchmarkStream64K(b *testing.B) { benchStream(b, &sdp.Dialer{NoFallback: true}) }

// BenchmarkStream64KBcopy is BenchmarkStream64K with Read Zcopy off.
func BenchmarkStream64KBcopy(b *testing.B) {
	benchStream(b, &sdp.Dialer{NoFallback: true, ZcopyThreshold: -1})
}

func benchStream(b *testing.B, d *sdp.Dialer) {
	sock := startDaemon(b)
	ln := listen(b, sock)
	d.Socket = sock
	c1, c2, err := pair(b, d, ln)
	if err != nil {
		b.Fatal(err)
	}
	defer c1.Close()
	done := make(chan struct{})
	go func() {
		io.Copy(io.Discard, c2)
		close(done)
	}()
	buf := make([]byte, 64<<10)
	b.SetBytes(int64(len(buf)))
	b.ResetTimer()
	for range b.N {
		if _, err := c1.Write(buf); err != nil {
			b.Fatal(err)
		}
	}
	c1.(*sdp.Conn).CloseWrite()
	<-done
	c2.Close()
}
