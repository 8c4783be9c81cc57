package httpapi

import (
	"fmt"
	"net"
	"net/http"
	"testing"
)

// TestCapToFDs: a connection cap is lowered to the descriptor limit less
// the process's reserve (never below half of it), and left alone when it
// fits or the limit is unknown.
func TestCapToFDs(t *testing.T) {
	tests := []struct {
		want    int
		nofile  uint64
		cap     int
		lowered bool
	}{
		{want: 32768, nofile: 65536, cap: 32768},
		{want: 32768, nofile: 20000, cap: 20000 - reservedFDs, lowered: true},
		{want: 16384, nofile: 20000, cap: 16384},
		{want: 32768, nofile: 1024, cap: 512, lowered: true},
		{want: 32768, nofile: 0, cap: 32768},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%d in %d", tt.want, tt.nofile), func(t *testing.T) {
			got, lowered := capToFDs(tt.want, tt.nofile)
			if got != tt.cap || lowered != tt.lowered {
				t.Fatalf("capToFDs(%d, %d) = %d, %v; want %d, %v", tt.want, tt.nofile, got, lowered, tt.cap, tt.lowered)
			}
		})
	}
}

// TestServeCapsConnectionsToTheDescriptorLimit: a server asked for more
// connections than its process can hold serves with a cap that fits.
func TestServeCapsConnectionsToTheDescriptorLimit(t *testing.T) {
	nofile := fdLimit()
	if nofile == 0 {
		t.Skip("no descriptor limit")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer(http.NotFoundHandler(), ServerOptions{MaxConns: int(nofile) + 1})
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close(); <-done })
	resp, err := http.Get("http://" + ln.Addr().String() + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if n := srv.MaxConns(); n >= int(nofile) {
		t.Fatalf("cap %d with a descriptor limit of %d", n, nofile)
	}
}
