package ipamwire

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
)

// FuzzDecodeSpaceMessage: a space message from the network never panics
// the decoder; what it accepts is within bounds, encodes back to a message
// it accepts again as the same, and what it refuses wraps
// ErrBadSpaceMessage. Seeds: the previous release's messages (golden) and
// hand-made edge cases.
func FuzzDecodeSpaceMessage(f *testing.F) {
	for name, b := range readGolden(f) {
		if len(name) > 5 && name[:5] == "space" {
			f.Add(b)
		}
	}
	f.Add([]byte(`{"v":1,"kind":"request","cluster_id":"c1","from":"a","id":"a-1","overlay":"carve","family":"4","bits":27}`))
	f.Add([]byte(`{"v":1,"kind":"grant","cluster_id":"c1","from":"b","id":"a-1","overlay":"carve","family":"6","prefix":"fd00::/64","ring":"AAEC"}`))
	f.Add([]byte(`{"v":1,"kind":"refuse","cluster_id":"","from":"b","id":"a-1","overlay":"carve","family":"4","reason":"no_space"}`))
	f.Add([]byte(`{"v":1,"kind":"request","from":"a","id":"a-1","overlay":"carve","family":"4","bits":27,"bits":28}`))
	f.Add([]byte(`{}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := DecodeSpaceMessage(data)
		if err != nil {
			if !errors.Is(err, ErrBadSpaceMessage) {
				t.Fatalf("error %v does not wrap ErrBadSpaceMessage", err)
			}
			return
		}
		if len(m.ID) > MaxRequestIDLen || len(m.Reason) > MaxReasonLen || len(m.Sig) > MaxSigLen || len(m.GrantSig) > MaxSigLen || len(m.ClusterID) > MaxClusterIDLen {
			t.Fatalf("accepted a field beyond its bound: %+v", m)
		}
		if m.Kind == KindGrant && !m.GrantedPrefix().IsValid() {
			t.Fatalf("accepted a grant of no prefix: %q", m.Prefix)
		}
		enc := EncodeSpaceMessage(m)
		again, err := DecodeSpaceMessage(enc)
		if err != nil {
			t.Fatalf("refused its own encoding of an accepted message: %v\n%s", err, enc)
		}
		if !reflect.DeepEqual(again, m) || !bytes.Equal(EncodeSpaceMessage(again), enc) {
			t.Fatalf("a round trip changed the message:\n%+v\n%+v", m, again)
		}
		if !bytes.Equal(SpaceRequestSigningBytes(m), SpaceRequestSigningBytes(again)) {
			t.Fatal("the signed bytes of one request differ")
		}
	})
}

// FuzzDecodeRingMessage: a ring message from the network never panics
// the decoder; what it accepts names valid rings, encodes back to a
// message it accepts again as the same, and joins with itself; what it
// refuses wraps ErrBadRingMessage.
func FuzzDecodeRingMessage(f *testing.F) {
	for name, b := range readGolden(f) {
		if len(name) > 4 && name[:4] == "ring" && !isRingBytes(name) {
			f.Add(b)
		}
	}
	f.Add([]byte(`{"cluster_id":"c1","rings":[{"overlay":"carve","family":"4","ring":"AAEC","n":4,"buckets":[0,2]}]}`))
	f.Add([]byte(`{"from":"p","digest":[]}`))
	f.Add([]byte(`{"buckets":[{"overlay":"carve","family":"6","hashes":"AAAAAAAAAAA="}]}`))
	f.Add([]byte(`{}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := DecodeRingMessage(data)
		if err != nil {
			if !errors.Is(err, ErrBadRingMessage) {
				t.Fatalf("error %v does not wrap ErrBadRingMessage", err)
			}
			return
		}
		for _, e := range m.Rings {
			if ValidRingKey(e.Overlay, e.Family) != nil {
				t.Fatalf("accepted a ring of %q/%q", e.Overlay, e.Family)
			}
		}
		enc := EncodeRingMessage(m)
		again, err := DecodeRingMessage(enc)
		if err != nil {
			t.Fatalf("refused its own encoding of an accepted message: %v\n%s", err, enc)
		}
		if !bytes.Equal(EncodeRingMessage(again), enc) {
			t.Fatalf("a round trip changed the message:\n%s\n%s", enc, EncodeRingMessage(again))
		}
		if IsSpaceMessage(enc) {
			t.Fatalf("a ring message passes for a space message: %s", enc)
		}
		j := JoinRingMessages(m, m)
		if len(j.Rings) > len(m.Rings) || j.ClusterID != m.ClusterID {
			t.Fatalf("joined with itself: %d rings of %d, cluster %q of %q", len(j.Rings), len(m.Rings), j.ClusterID, m.ClusterID)
		}
	})
}

// isRingBytes tells the golden file's bare rings (package ring's bytes)
// from its ring messages.
func isRingBytes(name string) bool { return name == "ring whole" || name == "ring delta" }
