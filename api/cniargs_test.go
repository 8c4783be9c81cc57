package api

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestParseCNIArgs(t *testing.T) {
	tests := []struct {
		name  string
		in    string
		owner Owner
		ips   string
		err   string // part of the error; "" for none
	}{
		{name: "containerd CRI", in: "IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME=web-0;K8S_POD_INFRA_CONTAINER_ID=abc;K8S_POD_UID=u1",
			owner: Owner{PodNamespace: "shop", PodName: "web-0", PodInfraContainerID: "abc", PodUID: "u1"}},
		{name: "another order", in: "K8S_POD_UID=u1;IgnoreUnknown=1;K8S_POD_NAME=web-0;K8S_POD_NAMESPACE=shop",
			owner: Owner{PodNamespace: "shop", PodName: "web-0", PodUID: "u1"}},
		{name: "Podman with --ip", in: "IgnoreUnknown=1;K8S_POD_NAME=happy_turing;IP=10.0.0.5", owner: Owner{PodName: "happy_turing"}, ips: "[10.0.0.5]"},
		{name: "Nomad", in: "IgnoreUnknown=true;NOMAD_REGION=global;NOMAD_NAMESPACE=default;NOMAD_JOB_ID=api;NOMAD_GROUP_NAME=web;NOMAD_ALLOC_ID=8c2b",
			owner: Owner{NomadNamespace: "default", NomadJobID: "api", NomadGroup: "web", NomadAllocID: "8c2b"}},
		{name: "IP= both families, with prefixes", in: "IP=10.0.0.5/24,fd00::5/64", ips: "[10.0.0.5 fd00::5]"},
		{name: "empty", in: ""},
		{name: "empty pairs skipped", in: ";;K8S_POD_NAME=a;", owner: Owner{PodName: "a"}},
		{name: "empty value", in: "K8S_POD_NAME=", owner: Owner{}},
		{name: "no =", in: "IgnoreUnknown=1;garbage", err: `pair 2 "garbage": want KEY=VALUE`},
		{name: "empty key", in: "=x", err: "want KEY=VALUE"},
		{name: "twice", in: "K8S_POD_NAME=a;K8S_POD_NAME=b", err: "K8S_POD_NAME is given twice"},
		{name: "control character", in: "K8S_POD_NAME=a\tb", err: "K8S_POD_NAME: non-printable"},
		{name: "too long a pair", in: "K8S_POD_NAME=" + strings.Repeat("x", 300), err: "K8S_POD_NAME: 313 bytes"},
		{name: "too long", in: strings.Repeat("A=1;", 1100), err: "at most 4096"},
		{name: "bad IP", in: "IP=10.0.0", err: "IP=10.0.0"},
		{name: "two IPv4", in: "IP=10.0.0.5,10.0.0.6", err: "two IPv4 addresses"},
		{name: "zoned IP", in: "IP=fe80::1%eth0", err: "not an IP address"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseCNIArgs(tt.in)
			if tt.err != "" {
				if !errors.Is(err, ErrBadCNIArgs) || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err %v, want ErrBadCNIArgs saying %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.Owner != tt.owner {
				t.Errorf("owner %+v, want %+v", got.Owner, tt.owner)
			}
			if ips := fmt.Sprint(got.IPs); (tt.ips != "" || len(got.IPs) > 0) && ips != tt.ips {
				t.Errorf("IPs %s, want %s", ips, tt.ips)
			}
		})
	}
}

func TestOwnerText(t *testing.T) {
	tests := []struct {
		name  string
		owner *Owner
		want  string
		match string
	}{
		{"pod", &Owner{Runtime: RuntimeCNI, ContainerID: "0123456789abcdef", IfName: "eth0", NetNS: "/run/netns/cni-1", PodNamespace: "shop", PodName: "web-0"},
			"pod shop/web-0 [id 0123456789ab, eth0, netns /run/netns/cni-1]", "WEB"},
		{"podman", &Owner{Runtime: RuntimeCNI, PodName: "happy_turing"}, "container happy_turing", "turing"},
		{"docker", &Owner{Runtime: RuntimeDocker, ContainerName: "db", EndpointID: "e1"}, "docker container db [endpoint e1]", "e1"},
		{"docker by mac", &Owner{Runtime: RuntimeDocker, MAC: "02:42:ac:11:00:02"}, "docker container [mac 02:42:ac:11:00:02]", "ac:11"},
		{"none", nil, "an unknown container (recorded before carve kept owners)", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.owner.String(); got != tt.want {
				t.Errorf("String() = %q, want %q", got, tt.want)
			}
			if tt.match != "" && !tt.owner.Matches(tt.match) {
				t.Errorf("does not match %q", tt.match)
			}
			if tt.owner != nil && tt.owner.Matches("no-such-text") {
				t.Error("matches anything")
			}
		})
	}
}

// FuzzParseCNIArgs: CNI_ARGS is the runtime's environment; no input
// panics, and what parses yields a valid owner.
func FuzzParseCNIArgs(f *testing.F) {
	for _, s := range []string{
		"IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME=web-0;K8S_POD_INFRA_CONTAINER_ID=abc;K8S_POD_UID=u1",
		"IgnoreUnknown=1;K8S_POD_NAME=happy_turing;IP=10.0.0.5",
		"IgnoreUnknown=true;NOMAD_NAMESPACE=default;NOMAD_JOB_ID=api;NOMAD_GROUP_NAME=web;NOMAD_ALLOC_ID=8c2b",
		"IP=10.0.0.5/24,fd00::5", ";;=", "K8S_POD_NAME=\x00", "IP=::ffff:1.2.3.4",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := ParseCNIArgs(s)
		if err != nil {
			if !errors.Is(err, ErrBadCNIArgs) {
				t.Fatalf("error %v is not ErrBadCNIArgs", err)
			}
			return
		}
		if err := got.Owner.Validate(); err != nil {
			t.Fatalf("parsed owner does not validate: %v", err)
		}
		if len(got.IPs) > 2 {
			t.Fatalf("%d IPs", len(got.IPs))
		}
	})
}
