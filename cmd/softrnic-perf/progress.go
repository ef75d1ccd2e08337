package main

import (
	"fmt"
	"io"
	"os"
	"time"
)

// progress shows how far a long run has come, once a second, on standard
// error when that is a terminal; elsewhere (CI logs, pipes) it is silent.
// The line is erased when the run ends, so the results table stays clean.
type progress struct {
	w     io.Writer // nil: silent
	label string
	total int           // iterations; 0 for a timed run
	dur   time.Duration // a timed run's length
	start time.Time
	next  time.Time
	shown bool
}

// newProgress starts the display for a run of total iterations, or of
// dur if dur is not zero.
func newProgress(label string, total int, dur time.Duration) *progress {
	fi, err := os.Stderr.Stat()
	if err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		return &progress{}
	}
	return startProgress(os.Stderr, label, total, dur, time.Now())
}

func startProgress(w io.Writer, label string, total int, dur time.Duration, now time.Time) *progress {
	if dur > 0 {
		total = 0
	}
	return &progress{w: w, label: label, total: total, dur: dur, start: now, next: now.Add(time.Second)}
}

// update is cheap enough for every iteration: it looks at the clock only
// every 64 iterations.
func (pr *progress) update(done int) {
	if pr.w == nil || done%64 != 0 {
		return
	}
	now := time.Now()
	if now.Before(pr.next) {
		return
	}
	pr.next = now.Add(time.Second)
	el := now.Sub(pr.start).Seconds()
	if pr.total > 0 {
		fmt.Fprintf(pr.w, "\r%s: %d of %d iterations (%.0f%%), %.0f s\033[K", pr.label, done, pr.total, 100*float64(done)/float64(pr.total), el)
	} else {
		fmt.Fprintf(pr.w, "\r%s: %.0f of %.0f s, %d iterations\033[K", pr.label, el, pr.dur.Seconds(), done)
	}
	pr.shown = true
}

func (pr *progress) end() {
	if pr.shown {
		fmt.Fprint(pr.w, "\r\033[K")
	}
}
