// Package changelog is the masters' bounded log of changes: per state
// index, the agent ids whose record or tombstone changed there (or that
// every record did, for a configuration or cluster id change), from which
// GET /overlay-master/changes?since=N answers only what changed after N.
// Every master derives the same entries from the same Raft log, but the
// bound is each master's own: beyond it the oldest entries are dropped,
// and a reader asking for changes since an index older than what is kept
// is told so (GoneError) and reads the whole state. Pure: no I/O, no
// locks (the lease table's lock guards it); imports nothing of ours.
package changelog

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
)

// DefaultIDs bounds a change log: agent ids held in all (a change of every
// record counts as one). A watcher further behind reads the whole state
// once. 65,536 covers a change of every agent at 50,000 (say all
// re-registering after an upgrade) with room for churn, so that a watcher
// that missed it (its master failed over) is answered the changes rather
// than 2.6 MB of state; each id costs about 40 bytes (2.5 MB in all), a
// state read at 50,000 readers 130 GB of writes.
const DefaultIDs = 65536

// ErrGone: changes since that index are not kept any more.
var ErrGone = errors.New("changes since that index are not kept")

// GoneError says which index is the oldest the masters can serve changes
// since (it wraps ErrGone).
type GoneError struct{ Oldest uint64 }

func (e *GoneError) Error() string {
	return fmt.Sprintf("%v: the oldest index served is %d", ErrGone, e.Oldest)
}

// Unwrap makes errors.Is(err, ErrGone) hold.
func (e *GoneError) Unwrap() error { return ErrGone }

// entry is what one state index changed.
type entry struct {
	index uint64
	ids   []string
	// all: every record was re-rendered (configuration or cluster id).
	all bool
}

// Log is the bounded log of changes, by ascending index. The zero Log
// holds nothing and keeps at most one id; New bounds it.
type Log struct {
	entries []entry
	// start: every change after it is in entries.
	start uint64
	ids   int // ids held (an all entry counts one)
	max   int
}

// New is an empty log, starting at index 0, that keeps at most maxIDs
// agent ids (at least 1).
func New(maxIDs int) Log { return Log{max: max(maxIDs, 1)} }

// SetMax bounds the log to maxIDs agent ids (at least 1) from its next
// Add on.
func (l *Log) SetMax(maxIDs int) { l.max = max(maxIDs, 1) }

// Start is the index every change after which the log holds.
func (l *Log) Start() uint64 { return l.start }

// Restart empties the log, which then holds every change after index
// (a table restored from a snapshot at that index: what changed before
// it is not known one by one).
func (l *Log) Restart(index uint64) { *l = Log{start: index, max: l.max} }

// Add appends what the command at index changed: ids (sorted, without
// repeats), or every record when all is set. Indexes only grow. Beyond
// the bound, the oldest entries are dropped, down to three quarters of
// it, so that the copy is rare.
func (l *Log) Add(index uint64, ids []string, all bool) {
	l.entries = append(l.entries, entry{index: index, ids: ids, all: all})
	l.ids += max(1, len(ids))
	if l.ids <= max(l.max, 1) {
		return
	}
	n := 0
	for l.ids > l.max*3/4 && n < len(l.entries)-1 {
		l.ids -= max(1, len(l.entries[n].ids))
		l.start = l.entries[n].index
		n++
	}
	l.entries = slices.Clone(l.entries[n:])
}

// Trim drops the entries at or below index (the compaction horizon).
func (l *Log) Trim(index uint64) {
	n := sort.Search(len(l.entries), func(i int) bool { return l.entries[i].index > index })
	for _, e := range l.entries[:n] {
		l.ids -= max(1, len(e.ids))
	}
	l.entries = slices.Clone(l.entries[n:])
	l.start = max(l.start, index)
}

// Since returns the ids changed after index, sorted, and whether every
// record was (then no ids). The caller checks that index is at or after
// Start.
func (l *Log) Since(index uint64) ([]string, bool) {
	n := sort.Search(len(l.entries), func(i int) bool { return l.entries[i].index > index })
	set := map[string]bool{}
	for _, e := range l.entries[n:] {
		if e.all {
			return nil, true
		}
		for _, id := range e.ids {
			set[id] = true
		}
	}
	return slices.Sorted(maps.Keys(set)), false
}
