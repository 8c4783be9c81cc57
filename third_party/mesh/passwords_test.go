package mesh

import (
	"testing"
)

// introWith runs a version 2 intro between a (outbound) and b with their
// passwords, then sends one message each way; it returns the first error.
func introWith(a, b []byte, aAccepts, bAccepts [][]byte) error {
	aconn, bconn := connPair()
	type result struct {
		res protocolIntroResults
		err error
	}
	run := func(conn protocolIntroConn, name string, out bool, pw []byte, acc [][]byte) <-chan result {
		ch := make(chan result, 1)
		go func() {
			res, err := protocolIntroParams{MinVersion: 2, MaxVersion: 2, Features: map[string]string{"Name": name},
				Conn: conn, Outbound: out, Password: pw, Accepted: acc}.doIntro()
			ch <- result{res, err}
		}()
		return ch
	}
	ach, bch := run(aconn, "A", true, a, aAccepts), run(bconn, "B", false, b, bAccepts)
	ar, br := <-ach, <-bch
	// A failed side leaves the other waiting on the pipe: close both.
	defer aconn.(*testConn).Writer.(interface{ Close() error }).Close()
	defer bconn.(*testConn).Writer.(interface{ Close() error }).Close()
	if ar.err != nil {
		return ar.err
	}
	if br.err != nil {
		return br.err
	}
	go func() { _ = ar.res.Sender.Send([]byte("from A")) }()
	if _, err := br.res.Receiver.Receive(); err != nil {
		return err
	}
	go func() { _ = br.res.Sender.Send([]byte("from B")) }()
	_, err := ar.res.Receiver.Receive()
	return err
}

// TestPasswordChange walks the three rounds of a password change between
// peers a round apart, and checks that peers two rounds apart, or with
// unrelated passwords, still fail.
func TestPasswordChange(t *testing.T) {
	old, next := []byte("old"), []byte("next")
	type peer struct {
		pw  []byte
		acc [][]byte
	}
	start, accept, send, done := peer{old, nil}, peer{old, [][]byte{next}}, peer{next, [][]byte{old}}, peer{next, nil}
	tests := []struct {
		name string
		a, b peer
		ok   bool
	}{
		{"before", start, start, true},
		{"round 1: one accepts the next", start, accept, true},
		{"round 1 done", accept, accept, true},
		{"round 2: one sends the next", accept, send, true},
		{"round 2: the other way", send, accept, true},
		{"round 2 done", send, send, true},
		{"round 3: one drops the old", send, done, true},
		{"round 3: the other way", done, send, true},
		{"after", done, done, true},
		{"two rounds apart: refused", start, send, false},
		{"three rounds apart: refused", start, done, false},
		{"an intruder accepting both: refused", accept, peer{[]byte("guess"), [][]byte{old, next}}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := introWith(tt.a.pw, tt.b.pw, tt.a.acc, tt.b.acc)
			if (err == nil) != tt.ok {
				t.Errorf("intro: %v, want success %v", err, tt.ok)
			}
		})
	}
}
