package gossip

import (
	"encoding/binary"
	"errors"
	"sync"
	"testing"
)

// recorder is a Handler that records unicasts and fails on gossip.
type recorder struct {
	mu  sync.Mutex
	got []string
}

func (r *recorder) Gossip() Data                             { return nil }
func (r *recorder) OnGossip([]byte) (Data, error)            { return nil, errors.New("bad gossip") }
func (r *recorder) OnBroadcast(string, []byte) (Data, error) { return nil, errors.New("bad broadcast") }
func (r *recorder) OnUnicast(src string, msg []byte) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, src+":"+string(msg))
	return nil
}

func (r *recorder) received() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.got...)
}

// TestMeshUnicastEnvelope feeds forged unicasts to a channel's receiving
// side: none reaches the handler, none is an error that would close the
// connection, and a well-formed one does.
func TestMeshUnicastEnvelope(t *testing.T) {
	r, err := NewMeshRouter(MeshConfig{ID: "a", Host: "127.0.0.1", Port: 1})
	if err != nil {
		t.Fatal(err)
	}
	h := &recorder{}
	ch, err := r.Channel("c", h)
	if err != nil {
		t.Fatal(err)
	}
	recv := (*meshReceiver)(ch.(*meshChannel))
	good := append(binary.AppendUvarint(nil, 1), "b"...)
	tests := []struct {
		name string
		env  []byte
		src  string
		want int // unicasts received so far
	}{
		{"empty", nil, "b", 0},
		{"bad varint", []byte{0xff}, "b", 0},
		{"length beyond data", binary.AppendUvarint(nil, 50), "b", 0},
		{"id of another peer", good, "c", 0},
		{"good", append(good, "hi"...), "b", 1},
	}
	for _, tt := range tests {
		if err := recv.OnGossipUnicast(PeerName(tt.src), tt.env); err != nil {
			t.Fatalf("%s: error %v would close the connection", tt.name, err)
		}
		if got := h.received(); len(got) != tt.want {
			t.Fatalf("%s: handler got %v", tt.name, got)
		}
	}
	if got := h.received(); got[0] != "b:hi" {
		t.Fatalf("unicast = %q", got[0])
	}
	// A handler error is swallowed too.
	if d, err := recv.OnGossip([]byte("x")); err != nil || d != nil {
		t.Fatalf("OnGossip with a handler error = %v, %v", d, err)
	}
	if err := ch.Unicast("a", nil); !errors.Is(err, ErrUnknownPeer) {
		t.Fatalf("Unicast to self = %v", err)
	}
}
