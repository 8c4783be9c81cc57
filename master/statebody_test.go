package master_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/api/apiclient"
	"github.com/carve-net/carve/master/netconfig"
	"github.com/carve-net/carve/pki"
	"github.com/carve-net/carve/test/lab/mastertest"
)

// stateRead is one answer of GET /overlay-master/state.
type stateRead struct {
	index    string // X-Carve-State-Index
	encoding string // Content-Encoding
	body     []byte
}

// Concurrent readers of a secure master's state, over TLS, get the same
// bytes at the same index, gzip'ed when they ask for it and plain when they
// do not, and both decode to the same whole state. The state is larger
// than the write batch (several batches plain, less than one gzip'ed).
func TestStateConcurrentReadersSameBody(t *testing.T) {
	t.Parallel() // its own masters: loopback ports, data dirs; it mostly waits on Raft
	if testing.Short() {
		t.Skip("master test")
	}
	const agents = 600
	ms, tlsCfg, op := secureOperator(t)
	ctx := context.Background()
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < agents; i = int(next.Add(1) - 1) {
				req := api.RegisterRequest{AgentID: fmt.Sprintf("a%04d", i), IP: fmt.Sprintf("198.18.%d.%d", i/250, i%250+1),
					NetworkConfig: api.AgentNetworkConfig{MesosBridge: true}}
				if _, err := op.Register(ctx, req); err != nil {
					t.Errorf("register %s: %v", req.AgentID, err)
					return
				}
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}

	const readers, each = 16, 4
	var mu sync.Mutex
	var reads []stateRead
	for r := range readers {
		tr := &http.Transport{TLSClientConfig: tlsCfg, DisableCompression: true, MaxConnsPerHost: 1}
		t.Cleanup(tr.CloseIdleConnections)
		hc := &http.Client{Transport: tr}
		wg.Go(func() {
			for k := range each {
				accept := []string{"gzip", "identity"}[(r+k)%2]
				read, err := getState(ctx, hc, ms.URL()+"/overlay-master/state", accept)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				reads = append(reads, read)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}

	// Per index: one body per encoding, the gzip'ed one the plain one
	// compressed.
	byIndex := map[string]map[string][]byte{}
	for _, rd := range reads {
		enc := byIndex[rd.index]
		if enc == nil {
			enc = map[string][]byte{}
			byIndex[rd.index] = enc
		}
		if prev, ok := enc[rd.encoding]; ok && !bytes.Equal(prev, rd.body) {
			t.Errorf("index %s, encoding %q: two readers got different bodies (%d and %d bytes)", rd.index, rd.encoding, len(prev), len(rd.body))
		}
		enc[rd.encoding] = rd.body
	}
	for index, enc := range byIndex {
		plain, zipped := enc[""], enc["gzip"]
		if plain != nil && zipped != nil {
			zr, err := gzip.NewReader(bytes.NewReader(zipped))
			if err != nil {
				t.Fatalf("index %s: the gzip'ed body: %v", index, err)
			}
			unzipped, err := io.ReadAll(zr)
			if err != nil {
				t.Fatalf("index %s: the gzip'ed body: %v", index, err)
			}
			if !bytes.Equal(unzipped, plain) {
				t.Errorf("index %s: the gzip'ed body decompresses to %d bytes other than the %d of the plain body", index, len(unzipped), len(plain))
			}
		}
		if plain == nil {
			continue
		}
		var st api.State
		if err := api.DecodeStrict(bytes.NewReader(plain), &st); err != nil {
			t.Fatalf("index %s: decode the state: %v", index, err)
		}
		if strconv.FormatUint(st.Index, 10) != index {
			t.Errorf("the answer of index header %s holds index %d", index, st.Index)
		}
		signed := 0
		for _, a := range st.Agents {
			if a.Signature != "" {
				signed++
			}
		}
		if len(st.Agents) != agents || signed != agents {
			t.Errorf("index %s: %d agents, %d signed; want %d, all signed", index, len(st.Agents), signed, agents)
		}
		if len(plain) <= 256<<10 {
			t.Errorf("the plain state is %d bytes: too small to span several write batches", len(plain))
		}
	}
}

// getState reads the state with Accept-Encoding accept (not decompressed)
// and checks its length header.
func getState(ctx context.Context, hc *http.Client, url, accept string) (stateRead, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return stateRead{}, err
	}
	req.Header.Set("Accept-Encoding", accept)
	resp, err := hc.Do(req)
	if err != nil {
		return stateRead{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return stateRead{}, fmt.Errorf("read the state (%s): %w", accept, err)
	}
	if resp.StatusCode != http.StatusOK {
		return stateRead{}, fmt.Errorf("GET state (%s): %s %s", accept, resp.Status, body)
	}
	enc := resp.Header.Get("Content-Encoding")
	if want := map[string]string{"gzip": "gzip", "identity": ""}[accept]; enc != want {
		return stateRead{}, fmt.Errorf("GET state, Accept-Encoding %s: Content-Encoding %q, want %q", accept, enc, want)
	}
	if cl := resp.Header.Get("Content-Length"); cl != strconv.Itoa(len(body)) {
		return stateRead{}, fmt.Errorf("GET state (%s): Content-Length %s, body %d bytes", accept, cl, len(body))
	}
	return stateRead{index: resp.Header.Get("X-Carve-State-Index"), encoding: enc, body: body}, nil
}

// A poller that sends back the ETag of the state it holds gets 304 and no
// body while the state is unchanged, whatever the encoding it reads, and
// the new state (with a new ETag) once it changed.
func TestStateConditionalRead(t *testing.T) {
	ms, tlsCfg, op := secureOperator(t)
	ctx := context.Background()
	register := func(i int) {
		t.Helper()
		if _, err := op.Register(ctx, api.RegisterRequest{AgentID: fmt.Sprintf("a%04d", i), IP: fmt.Sprintf("198.18.1.%d", i+1),
			NetworkConfig: api.AgentNetworkConfig{MesosBridge: true}}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 40 { // a state above gzipMinBytes: both encodings served
		register(i)
	}
	tr := &http.Transport{TLSClientConfig: tlsCfg, DisableCompression: true}
	t.Cleanup(tr.CloseIdleConnections)
	hc := &http.Client{Transport: tr}
	get := func(accept, ifNoneMatch string) (status int, etag string, body []byte) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, ms.URL()+"/overlay-master/state", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Accept-Encoding", accept)
		if ifNoneMatch != "" {
			req.Header.Set("If-None-Match", ifNoneMatch)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, err = io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, resp.Header.Get("ETag"), body
	}
	status, etag, body := get("gzip", "")
	if status != http.StatusOK || etag == "" || len(body) == 0 {
		t.Fatalf("first read: %d, ETag %q, %d bytes", status, etag, len(body))
	}
	if _, plainTag, _ := get("identity", ""); plainTag != etag {
		t.Errorf("the plain answer's ETag %q differs from the gzip'ed one's %q: the same state", plainTag, etag)
	}
	for _, tt := range []struct {
		name, accept, ifNoneMatch string
		want                      int
	}{
		{"same tag, gzip", "gzip", etag, http.StatusNotModified},
		{"same tag, plain", "identity", etag, http.StatusNotModified},
		{"same tag in a list", "gzip", `"other", ` + etag, http.StatusNotModified},
		{"same tag, strong form", "gzip", strings.TrimPrefix(etag, "W/"), http.StatusNotModified},
		{"any", "gzip", "*", http.StatusNotModified},
		{"another tag", "gzip", `W/"0123456789abcdef01234567"`, http.StatusOK},
		{"garbage", "gzip", `not a tag`, http.StatusOK},
	} {
		t.Run(tt.name, func(t *testing.T) {
			status, got, body := get(tt.accept, tt.ifNoneMatch)
			if status != tt.want || got != etag {
				t.Errorf("If-None-Match %q: %d with ETag %q, want %d with %q", tt.ifNoneMatch, status, got, tt.want, etag)
			}
			if status == http.StatusNotModified && len(body) != 0 {
				t.Errorf("304 with a body of %d bytes", len(body))
			}
		})
	}
	register(40)
	status, newTag, body := get("gzip", etag)
	if status != http.StatusOK || newTag == etag || len(body) == 0 {
		t.Fatalf("after a registration, If-None-Match of the old state: %d, ETag %q (was %q), %d bytes; want 200, a new ETag and the state", status, newTag, etag, len(body))
	}
}

// secureOperator is a secure master, an operator's TLS configuration and
// an API client with it.
func secureOperator(t *testing.T) (*mastertest.Secure, *tls.Config, *apiclient.Client) {
	t.Helper()
	ms := mastertest.StartSecure(t, t.TempDir(), netconfig.Default(), slog.New(slog.DiscardHandler))
	tlsCfg := ms.CA.ClientTLS("op", pki.RoleOperator)
	op, err := apiclient.NewClientWith([]string{ms.URL()}, apiclient.ClientOptions{TLS: tlsCfg})
	if err != nil {
		t.Fatal(err)
	}
	return ms, tlsCfg, op
}
