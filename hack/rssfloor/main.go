// Command rssfloor measures what the Go runtime itself keeps of a process's
// resident memory after a peak, with debug.FreeOSMemory semantics: the
// floor under issue 16's "RSS after closing all connections within 10% of
// a fresh daemon's". It holds a heap of small objects of the sizes a
// daemon's QPs are made of, and as many goroutines as a peak of
// connections ran, frees them all, collects twice and returns what is
// free, then prints the process's RSS and the runtime's accounts.
//
//	go run ./hack/rssfloor [-heap MiB] [-goroutines N] [-sockets N]
package main

import (
	"flag"
	"fmt"
	"net"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"time"
)

func rss() string {
	b, _ := os.ReadFile("/proc/self/status")
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return "?"
}

func trim() {
	runtime.GC()
	runtime.GC()
	debug.FreeOSMemory()
	time.Sleep(100 * time.Millisecond)
}

func report(what string) {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	fmt.Printf("%-26s RSS %-10s heap in use %6.1f MB, stacks %4.1f MB, GC metadata %4.1f MB, other %4.1f MB, spans %4.1f MB, goroutines %d\n",
		what, rss(), float64(ms.HeapInuse)/1e6, float64(ms.StackInuse)/1e6, float64(ms.GCSys)/1e6, float64(ms.OtherSys)/1e6,
		float64(ms.MSpanSys)/1e6, runtime.NumGoroutine())
}

var keep [][]byte

func main() {
	heap := flag.Int("heap", 72, "MiB of small objects held at the peak (10,000 idle QPs hold about 70)")
	gs := flag.Int("goroutines", 10000, "goroutines alive at the peak (one per connection's receive goroutine)")
	socks := flag.Int("sockets", 10000, "TCP sockets open at the peak (each has a netpoll descriptor)")
	flag.Parse()
	trim()
	report("fresh")
	sizes := []int{64, 200, 512, 1024, 3000, 2048}
	for n := 0; n < *heap<<20; {
		for _, sz := range sizes {
			b := make([]byte, sz)
			for i := range b {
				b[i] = 1 // resident, as a QP's state is
			}
			keep = append(keep, b)
			n += sz
		}
	}
	var wg sync.WaitGroup
	release := make(chan struct{})
	for range *gs {
		wg.Add(1)
		go func() { defer wg.Done(); <-release }()
	}
	var conns []net.Conn
	if *socks > 0 {
		ln, err := net.Listen("tcp4", "127.0.0.1:0")
		if err == nil {
			go func() {
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					conns = append(conns, c)
				}
			}()
			for range *socks / 2 {
				c, err := net.Dial("tcp4", ln.Addr().String())
				if err != nil {
					fmt.Println("sockets:", err)
					break
				}
				conns = append(conns, c)
			}
			time.Sleep(200 * time.Millisecond)
			ln.Close()
		}
	}
	report("peak")
	keep = nil
	close(release)
	wg.Wait()
	for _, c := range conns {
		c.Close()
	}
	conns = nil
	trim()
	report("all freed")
	time.Sleep(2 * time.Second)
	trim()
	report("all freed, 2 s later")
}
