package ipamvalidate

import (
	"strings"
	"testing"

	"github.com/carve-net/carve/api"
)

func TestRequest(t *testing.T) {
	ok := func() api.IPAMRequest {
		return api.IPAMRequest{Network: "blue", ContainerID: "c1", IfName: "eth0"}
	}
	for _, tc := range []struct {
		name    string
		change  func(*api.IPAMRequest)
		wantErr string // "" when valid
	}{
		{"valid", func(*api.IPAMRequest) {}, ""},
		{"no network", func(r *api.IPAMRequest) { r.Network = "" }, "network is required"},
		{"bad bridge", func(r *api.IPAMRequest) { r.Bridge = "ovs" }, `bridge "ovs"`},
		{"bad address", func(r *api.IPAMRequest) { r.Address = "10.0.0.300" }, "is not an IP address"},
		{"bad family", func(r *api.IPAMRequest) { r.Family = "5" }, `family "5"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := ok()
			tc.change(&req)
			err := Request(&req)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("Request: %v", err)
				}
				if req.Bridge != api.BridgeMesos {
					t.Errorf("bridge %q, want the default %q", req.Bridge, api.BridgeMesos)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Request: %v, want an error naming %q", err, tc.wantErr)
			}
		})
	}
}

func TestRequestedAddrs(t *testing.T) {
	got, err := RequestedAddrs(api.IPAMRequest{Address: "10.0.0.5", Addresses: []string{"fd00::5"}})
	if err != nil {
		t.Fatalf("RequestedAddrs: %v", err)
	}
	if got[0].String() != "10.0.0.5" || got[1].String() != "fd00::5" {
		t.Errorf("RequestedAddrs = %v, want [10.0.0.5 fd00::5]", got)
	}
}

func TestGC(t *testing.T) {
	for _, tc := range []struct {
		name    string
		req     api.GCRequest
		wantErr string
	}{
		{"valid", api.GCRequest{Network: "blue"}, ""},
		{"bad bridge", api.GCRequest{Network: "blue", Bridge: "ovs"}, `bridge "ovs"`},
		{"bad keep", api.GCRequest{Network: "blue", Keep: []api.IPAMRequest{{ContainerID: ""}}}, "keep[0].container_id"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := GC(tc.req)
			if (err == nil) != (tc.wantErr == "") || err != nil && !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("GC: %v, want %q", err, tc.wantErr)
			}
		})
	}
}
