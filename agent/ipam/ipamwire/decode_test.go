package ipamwire

import (
	"bytes"
	"encoding/base64"
	"strings"
	"testing"
)

func TestDecodeSpaceMessageRejects(t *testing.T) {
	ok := `{"v":1,"kind":"request","cluster_id":"c1","from":"a","id":"a-1","overlay":"carve","family":"4","bits":27}`
	if _, err := DecodeSpaceMessage([]byte(ok)); err != nil {
		t.Fatalf("a good request refused: %v", err)
	}
	tests := []struct{ name, msg string }{
		{"not json", `{`},
		{"unknown field", strings.Replace(ok, `"bits":27`, `"bits":27,"x":1`, 1)},
		{"trailing data", ok + `{}`},
		{"other version", strings.Replace(ok, `"v":1`, `"v":2`, 1)},
		{"bad kind", strings.Replace(ok, `"request"`, `"steal"`, 1)},
		{"bad family", strings.Replace(ok, `"family":"4"`, `"family":"5"`, 1)},
		{"bits out of range", strings.Replace(ok, `"bits":27`, `"bits":33`, 1)},
		{"bad sender", strings.Replace(ok, `"from":"a"`, `"from":"A B"`, 1)},
		{"empty id", strings.Replace(ok, `"id":"a-1"`, `"id":""`, 1)},
		{"request with a ring", strings.Replace(ok, `"bits":27`, `"bits":27,"ring":"AAEC"`, 1)},
		{"oversized request", strings.Replace(ok, `"c1"`, `"`+strings.Repeat("x", MaxSpaceRequestBytes)+`"`, 1)},
		{"grant without ring", `{"v":1,"kind":"grant","cluster_id":"c1","from":"b","id":"a-1","overlay":"carve","family":"4","prefix":"10.128.0.96/27"}`},
		{"grant of an unaligned prefix", `{"v":1,"kind":"grant","cluster_id":"c1","from":"b","id":"a-1","overlay":"carve","family":"4","prefix":"10.128.0.97/27","ring":"AAEC"}`},
		{"grant of the other family", `{"v":1,"kind":"grant","cluster_id":"c1","from":"b","id":"a-1","overlay":"carve","family":"6","prefix":"10.128.0.96/27","ring":"AAEC"}`},
		{"refusal with control characters", `{"v":1,"kind":"refuse","cluster_id":"c1","from":"b","id":"a-1","overlay":"carve","family":"4","reason":"\u0007"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := DecodeSpaceMessage([]byte(tt.msg)); err == nil {
				t.Errorf("accepted %.100s", tt.msg)
			}
		})
	}
}

func TestDecodeRingMessageRejects(t *testing.T) {
	tests := []struct{ name, msg string }{
		{"not json", `{`},
		{"bad family", `{"rings":[{"overlay":"carve","family":"5","ring":""}]}`},
		{"bad overlay", `{"rings":[{"overlay":"Carve!","family":"4","ring":""}]}`},
		{"long cluster id", `{"cluster_id":"` + string(bytes.Repeat([]byte("x"), MaxClusterIDLen+1)) + `","rings":[]}`},
		{"oversized", `{"rings":[` + string(bytes.Repeat([]byte(" "), MaxMessageBytes)) + `]}`},
		{"digest without sender", `{"digest":[{"overlay":"carve","family":"4","hash":1}]}`},
		{"digest bad family", `{"from":"p","digest":[{"overlay":"carve","family":"5","hash":1}]}`},
		{"digest bad overlay", `{"from":"p","digest":[{"overlay":"Carve!","family":"4","hash":1}]}`},
		{"digest too long", `{"from":"p","digest":[` + strings.TrimSuffix(strings.Repeat(`{"overlay":"carve","family":"4","hash":1},`, MaxDigestRings+1), ",") + `]}`},
		{"push of 3 buckets", `{"rings":[{"overlay":"carve","family":"4","ring":"","n":3,"buckets":[0]}]}`},
		{"push bucket outside", `{"rings":[{"overlay":"carve","family":"4","ring":"","n":4,"buckets":[4]}]}`},
		{"push bucket negative", `{"rings":[{"overlay":"carve","family":"4","ring":"","n":4,"buckets":[-1]}]}`},
		{"push buckets without n", `{"rings":[{"overlay":"carve","family":"4","ring":"","buckets":[0]}]}`},
		{"push n without buckets", `{"rings":[{"overlay":"carve","family":"4","ring":"","n":4}]}`},
		{"push too many buckets", `{"rings":[{"overlay":"carve","family":"4","ring":"","n":1,"buckets":[0,0]}]}`},
		{"push n too large", `{"rings":[{"overlay":"carve","family":"4","ring":"","n":8192,"buckets":[0]}]}`},
		{"bucket hashes not 8 a bucket", `{"buckets":[{"overlay":"carve","family":"4","hashes":"AAAA"}]}`},
		{"bucket hashes of 3 buckets", `{"buckets":[{"overlay":"carve","family":"4","hashes":"` + base64.StdEncoding.EncodeToString(make([]byte, 24)) + `"}]}`},
		{"bucket hashes empty", `{"buckets":[{"overlay":"carve","family":"4","hashes":""}]}`},
		{"bucket hashes bad family", `{"buckets":[{"overlay":"carve","family":"5","hashes":"AAAAAAAAAAA="}]}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := DecodeRingMessage([]byte(tt.msg)); err == nil {
				t.Errorf("accepted %.80s", tt.msg)
			}
		})
	}
}
