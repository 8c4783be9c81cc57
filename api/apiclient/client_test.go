package apiclient

import (
	"crypto/tls"
	"net/http"
	"strings"
	"testing"
)

func TestNewClientWithTLS(t *testing.T) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	tests := []struct {
		name    string
		masters []string
		opts    ClientOptions
		want    []string
		err     string
	}{
		{"plain default scheme", []string{"198.18.0.1:8080"}, ClientOptions{}, []string{"http://198.18.0.1:8080"}, ""},
		{"TLS default scheme", []string{"198.18.0.1:8080", "https://198.18.0.2:8080/"}, ClientOptions{TLS: cfg}, []string{"https://198.18.0.1:8080", "https://198.18.0.2:8080"}, ""},
		{"TLS refuses http", []string{"http://198.18.0.1:8080"}, ClientOptions{TLS: cfg}, nil, "must be https://"},
		{"TLS needs an http.Transport", []string{"198.18.0.1:8080"}, ClientOptions{TLS: cfg, HTTPClient: &http.Client{Transport: roundTripFunc(nil)}}, nil, "*http.Transport"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := NewClientWith(tt.masters, tt.opts)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := c.Masters(); strings.Join(got, " ") != strings.Join(tt.want, " ") {
				t.Errorf("masters %v, want %v", got, tt.want)
			}
			if tt.opts.TLS != nil && c.http.Transport.(*http.Transport).TLSClientConfig != cfg {
				t.Error("the transport does not carry the TLS configuration")
			}
		})
	}
	// A given HTTP client without TLS is used as it is.
	hc := &http.Client{}
	c, err := NewClient([]string{"198.18.0.1:8080"}, hc)
	if err != nil || c.http != hc {
		t.Errorf("NewClient replaced the given HTTP client (%v)", err)
	}
	// With TLS, a given client's transport is cloned, not changed.
	tr := &http.Transport{}
	c, err = NewClientWith([]string{"198.18.0.1:8080"}, ClientOptions{TLS: cfg, HTTPClient: &http.Client{Transport: tr}})
	if err != nil || tr.TLSClientConfig == cfg || c.http.Transport == http.RoundTripper(tr) {
		t.Errorf("the caller's transport was given the TLS configuration, or used as it is (%v)", err)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
