package raftlog

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/raft"
)

// StateMachine is the application state the log replicates. Apply must be
// deterministic: the same commands in the same order give the same state on
// every node. All three methods are called from a single goroutine (raft's
// FSM goroutine), never concurrently with each other.
type StateMachine interface {
	// Apply applies one committed command. index is its raft log index, the
	// same on every node, usable as a version. The result is handed back to the
	// caller of Node.Apply on the node that proposed cmd (and dropped
	// elsewhere). cmd must not be modified or retained after Apply returns.
	Apply(index uint64, cmd []byte) any
	// Snapshot returns a point-in-time copy of the state. It blocks Apply, so
	// it must be quick (copy-on-write or an immutable reference); the heavy
	// lifting belongs in Snapshot.WriteTo.
	Snapshot() (Snapshot, error)
	// Restore replaces the whole state with the one read from r, which
	// reflects every log entry up to and including index (index may exceed
	// the last command's index: configuration entries count too). It is called at
	// start-up when a snapshot exists and when the leader installs a snapshot
	// on a node that fell too far behind.
	Restore(index uint64, r io.Reader) error
}

// Snapshot is a point-in-time copy that can be written out later,
// concurrently with Apply.
type Snapshot interface {
	// WriteTo writes the state out; Restore must be able to read it back. It
	// has io.WriterTo's signature (go vet insists on it for this name); the
	// byte count is informational only.
	WriteTo(w io.Writer) (n int64, err error)
	// Release is called once the snapshot is no longer needed, whether or not
	// it was written.
	Release()
}

// Snapshot framing: see the package documentation.
const (
	snapMagic      = "CRVS"
	snapVersion    = uint32(1)
	snapHeaderSize = 16
)

func writeSnapHeader(w io.Writer, index uint64) error {
	var hdr [snapHeaderSize]byte
	copy(hdr[:4], snapMagic)
	binary.BigEndian.PutUint32(hdr[4:8], snapVersion)
	binary.BigEndian.PutUint64(hdr[8:16], index)
	_, err := w.Write(hdr[:])
	return err
}

func readSnapHeader(r io.Reader) (uint64, error) {
	var hdr [snapHeaderSize]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, fmt.Errorf("read snapshot header: %w", err)
	}
	if string(hdr[:4]) != snapMagic {
		return 0, fmt.Errorf("not a raftlog snapshot (magic %q)", hdr[:4])
	}
	if v := binary.BigEndian.Uint32(hdr[4:8]); v != snapVersion {
		return 0, fmt.Errorf("unsupported raftlog snapshot version %d", v)
	}
	return binary.BigEndian.Uint64(hdr[8:16]), nil
}

// fsmAdapter is the raft.BatchingFSM that feeds a StateMachine. It tracks the
// index of the last entry the StateMachine has seen (commands and
// configuration entries; raft does not pass no-op and barrier entries to the
// FSM) and wakes up goroutines waiting for that index to advance.
type fsmAdapter struct {
	sm StateMachine

	applied atomic.Uint64

	mu       sync.Mutex
	advanced chan struct{} // closed and replaced whenever applied changes
	restores atomic.Uint64 // number of Restore calls, for tests and logs
	// history learns the history the state machine names (nil: none).
	history *historyGuard
}

// observeHistory tells the history guard what the state machine names now.
func (f *fsmAdapter) observeHistory() {
	if f.history != nil {
		f.history.observe(f.sm)
	}
}

var _ raft.BatchingFSM = (*fsmAdapter)(nil)

func newFSMAdapter(sm StateMachine) *fsmAdapter {
	return &fsmAdapter{sm: sm, advanced: make(chan struct{})}
}

// changed returns a channel closed the next time the applied index changes.
func (f *fsmAdapter) changed() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.advanced
}

func (f *fsmAdapter) setApplied(index uint64) {
	f.applied.Store(index)
	f.mu.Lock()
	close(f.advanced)
	f.advanced = make(chan struct{})
	f.mu.Unlock()
}

func (f *fsmAdapter) applyOne(l *raft.Log) any {
	if l.Type == raft.LogCommand {
		return f.sm.Apply(l.Index, l.Data)
	}
	// Configuration entries (and anything else raft may pass in the future)
	// are not application commands; they only move the applied index.
	return nil
}

// Apply is used by raft only when batching is off; kept for completeness.
func (f *fsmAdapter) Apply(l *raft.Log) any {
	res := f.applyOne(l)
	f.observeHistory()
	f.setApplied(l.Index)
	return res
}

// ApplyBatch applies committed entries in order and returns one result per
// entry, as raft requires.
func (f *fsmAdapter) ApplyBatch(logs []*raft.Log) []any {
	out := make([]any, len(logs))
	for i, l := range logs {
		out[i] = f.applyOne(l)
	}
	if len(logs) > 0 {
		f.observeHistory()
		f.setApplied(logs[len(logs)-1].Index)
	}
	return out
}

func (f *fsmAdapter) Snapshot() (raft.FSMSnapshot, error) {
	index := f.applied.Load()
	s, err := f.sm.Snapshot()
	if err != nil {
		return nil, fmt.Errorf("raftlog: state machine snapshot: %w", err)
	}
	if s == nil {
		return nil, errors.New("raftlog: state machine returned a nil snapshot")
	}
	return &fsmSnapshot{s: s, index: index}, nil
}

func (f *fsmAdapter) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	br := bufio.NewReaderSize(rc, 64<<10)
	index, err := readSnapHeader(br)
	if err != nil {
		return fmt.Errorf("raftlog: restore: %w", err)
	}
	if err := f.sm.Restore(index, br); err != nil {
		return fmt.Errorf("raftlog: restore state machine at index %d: %w", index, err)
	}
	f.restores.Add(1)
	f.observeHistory()
	f.setApplied(index)
	return nil
}

// fsmSnapshot frames a StateMachine snapshot with the header.
type fsmSnapshot struct {
	s     Snapshot
	index uint64
}

func (s *fsmSnapshot) Persist(sink raft.SnapshotSink) error {
	bw := bufio.NewWriterSize(sink, 64<<10)
	err := writeSnapHeader(bw, s.index)
	if err == nil {
		_, err = s.s.WriteTo(bw)
	}
	if err == nil {
		err = bw.Flush()
	}
	if err != nil {
		_ = sink.Cancel()
		return fmt.Errorf("raftlog: persist snapshot at index %d: %w", s.index, err)
	}
	if err := sink.Close(); err != nil {
		return fmt.Errorf("raftlog: close snapshot at index %d: %w", s.index, err)
	}
	return nil
}

func (s *fsmSnapshot) Release() { s.s.Release() }
