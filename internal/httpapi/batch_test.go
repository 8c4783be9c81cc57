package httpapi

import (
	"bytes"
	"crypto/tls"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
)

// writeCounter counts the writes that reach a real connection.
type writeCounter struct {
	net.Conn
	writes atomic.Int64
}

func (c *writeCounter) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// tcpPair returns both ends of a loopback TCP connection, closed when the
// test ends.
func tcpPair(t *testing.T) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server = <-accepted
	if server == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

// Within a batch the writes reach the socket in batchBytes pieces, in
// order; outside of one each write goes straight through.
func TestBatchConnGathersWrites(t *testing.T) {
	tests := []struct {
		name      string
		batch     bool
		writes    []int // sizes
		maxWrites int64 // socket writes at most
	}{
		{"no batch", false, []int{100, 16 << 10, 16 << 10}, 3},
		{"one small write", true, []int{100}, 1},
		{"records of 16 KB", true, repeat(16<<10+22, 70), (70*(16<<10+22))/batchBytes + 1},
		{"a write larger than the batch", true, []int{1000, 2 * batchBytes, 1000}, 3},
		{"empty batch", true, nil, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			client, server := tcpPair(t)
			counter := &writeCounter{Conn: server}
			c := &batchConn{Conn: counter, bufs: newBatchBuffers()}
			var want bytes.Buffer
			got := make(chan []byte, 1)
			total := 0
			for _, n := range tt.writes {
				total += n
			}
			go func() {
				b := make([]byte, total)
				_, _ = io.ReadFull(client, b)
				got <- b
			}()
			if tt.batch {
				c.begin()
			}
			for i, n := range tt.writes {
				p := bytes.Repeat([]byte{byte(i)}, n)
				want.Write(p)
				if k, err := c.Write(p); k != n || err != nil {
					t.Fatalf("write %d: %d, %v", i, k, err)
				}
			}
			if tt.batch {
				if err := c.end(); err != nil {
					t.Fatalf("end: %v", err)
				}
			}
			if b := <-got; !bytes.Equal(b, want.Bytes()) {
				t.Errorf("the peer read %d bytes other than the %d written", len(b), want.Len())
			}
			if w := counter.writes.Load(); w > tt.maxWrites {
				t.Errorf("%d writes reached the socket for %d; want at most %d", w, len(tt.writes), tt.maxWrites)
			}
		})
	}
}

func repeat(n, times int) []int {
	out := make([]int, times)
	for i := range out {
		out[i] = n
	}
	return out
}

// Once a batch could not be written, the connection refuses every later
// write: TLS counted the lost records as sent, so what follows would reach
// the peer out of sequence.
func TestBatchConnFailedBatchIsSticky(t *testing.T) {
	_, server := tcpPair(t)
	c := &batchConn{Conn: server, bufs: newBatchBuffers()}
	c.begin()
	if _, err := c.Write([]byte("gathered")); err != nil {
		t.Fatalf("a gathered write failed: %v", err)
	}
	server.Close()
	if err := c.end(); err == nil {
		t.Fatal("end wrote to a closed connection without error")
	}
	if _, err := c.Write([]byte("later")); err == nil {
		t.Error("a write after the failed batch succeeded")
	}
}

// WriteLarge gives every client its whole body, over TLS (batched) and
// plain HTTP, to concurrent clients, on connections that then answer small
// requests correctly too.
func TestWriteLargeServesWholeBodies(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	sizes := []int{0, 100, batchBytes - 7, batchBytes, 3*batchBytes + 5}
	bodies := map[int][]byte{}
	for _, n := range sizes {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		bodies[n] = b
	}
	serverTLS, clientTLS := testTLS(t)
	for _, tt := range []struct {
		name string
		tls  bool
	}{{"tls", true}, {"plain", false}} {
		t.Run(tt.name, func(t *testing.T) {
			var batched atomic.Int64
			mux := http.NewServeMux()
			mux.HandleFunc("GET /large", func(w http.ResponseWriter, r *http.Request) {
				n, _ := strconv.Atoi(r.URL.Query().Get("n"))
				if r.Context().Value(batchKey{}) != nil {
					batched.Add(1)
				}
				w.Header().Set("Content-Length", strconv.Itoa(len(bodies[n])))
				if err := WriteLarge(w, r, bodies[n]); err != nil {
					t.Errorf("WriteLarge %d bytes: %v", n, err)
				}
			})
			mux.Handle("GET /small", okHandler)
			opts := ServerOptions{}
			scheme := "http"
			var ccfg *tls.Config
			if tt.tls {
				opts.TLS, scheme, ccfg = serverTLS, "https", clientTLS.Clone()
				ccfg.ServerName = "127.0.0.1"
			}
			_, addr := startServer(t, mux, opts)
			var wg sync.WaitGroup
			errs := make(chan error, 8)
			for range 8 {
				// One keep-alive connection per client: its large and
				// small answers follow each other on it.
				tr := &http.Transport{TLSClientConfig: ccfg, MaxConnsPerHost: 1, DisableCompression: true}
				t.Cleanup(tr.CloseIdleConnections)
				hc := &http.Client{Transport: tr}
				wg.Go(func() {
					for range 2 {
						for _, n := range sizes {
							if err := getBody(hc, fmt.Sprintf("%s://%s/large?n=%d", scheme, addr, n), bodies[n]); err != nil {
								errs <- err
								return
							}
							if err := getBody(hc, scheme+"://"+addr+"/small", []byte(`{"status":"ok"}`+"\n")); err != nil {
								errs <- err
								return
							}
						}
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			if got := batched.Load() > 0; got != tt.tls {
				t.Errorf("requests found the connection's batch: %v; want %v (only under TLS)", got, tt.tls)
			}
		})
	}
}

// getBody gets url and checks that its body is want.
func getBody(hc *http.Client, url string, want []byte) error {
	resp, err := hc.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("GET %s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK || !bytes.Equal(got, want) {
		return fmt.Errorf("GET %s: %s, %d bytes; want 200 and the %d bytes sent", url, resp.Status, len(got), len(want))
	}
	return nil
}

// With every batch buffer out, an answer goes unbatched (and whole); a
// buffer given back batches the next one.
func TestBatchConnBoundedBuffers(t *testing.T) {
	client, server := tcpPair(t)
	counter := &writeCounter{Conn: server}
	bufs := newBatchBuffers()
	var out []*[]byte
	for range maxBatches {
		out = append(out, bufs.get())
	}
	if b := bufs.get(); b != nil {
		t.Fatalf("buffer %d handed out; want at most %d", maxBatches+1, maxBatches)
	}
	c := &batchConn{Conn: counter, bufs: bufs}
	record := bytes.Repeat([]byte("r"), 16<<10)
	answer := func() int64 {
		before := counter.writes.Load()
		c.begin()
		for range 8 {
			if _, err := c.Write(record); err != nil {
				t.Fatal(err)
			}
		}
		if err := c.end(); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, 8*len(record))
		if _, err := io.ReadFull(client, got); err != nil || !bytes.Equal(got, bytes.Repeat(record, 8)) {
			t.Fatalf("the peer read other bytes than the answer (%v)", err)
		}
		return counter.writes.Load() - before
	}
	if w := answer(); w != 8 {
		t.Errorf("with every buffer out: %d socket writes for 8 records; want 8 (unbatched)", w)
	}
	bufs.put(out[0])
	if w := answer(); w != 1 {
		t.Errorf("with a buffer given back: %d socket writes for 8 records; want 1", w)
	}
}
