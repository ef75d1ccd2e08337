package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/softrnic/softrnic/client"
)

// printStats asks the daemon on socket (or iface's default socket) for its
// statistics and writes them, one "name value" per line.
func printStats(w io.Writer, socket, iface string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ia, err := client.Open(ctx, client.Options{Socket: socket, Iface: iface, Name: "softrnicd --stats"})
	if err != nil {
		return err
	}
	defer ia.Close()
	st, err := ia.Stats()
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "sessions %d\npz %d\nlmr %d\nevd %d\nep %d\npsp %d\ncr %d\nstalls %d\n",
		st.Sessions, st.PZ, st.LMR, st.EVD, st.EP, st.PSP, st.CR, st.Stalls)
	return err
}
