// Package goroutines owns background goroutines: a Group starts each one
// with the group's context, and Stop cancels that context and waits for
// every one of them to end, so that nothing a component started outlives
// it (and, say, uses a store its owner closes next). Modelled on
// hashicorp/raft's goFunc and its WaitGroup, with one addition: a stopped
// group starts nothing more, so no goroutine can slip in after Stop's wait.
package goroutines

import (
	"context"
	"sync"
)

// Group is a set of goroutines with one owner. The zero value is not
// usable: make one with New.
type Group struct {
	ctx    context.Context
	cancel context.CancelFunc

	// mu orders Go's Add against Stop's Wait: a WaitGroup must not grow
	// from zero while someone waits on it.
	mu      sync.Mutex
	stopped bool
	wg      sync.WaitGroup
}

// New returns a running group whose goroutines' context is a child of
// parent (context.Background for a component that decides alone when it
// stops).
func New(parent context.Context) *Group {
	ctx, cancel := context.WithCancel(parent)
	return &Group{ctx: ctx, cancel: cancel}
}

// Go runs f in a goroutine of the group with the group's context, and
// reports true; once Stop was called it runs nothing and reports false, so
// the caller can answer that it is stopping.
func (g *Group) Go(f func(ctx context.Context)) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stopped {
		return false
	}
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		f(g.ctx)
	}()
	return true
}

// Stop cancels the group's context, refuses new goroutines and returns
// once every goroutine of the group has ended. It may be called more than
// once, and from several goroutines (each returns after the wait), but not
// from a goroutine of the group itself, which would wait for itself.
func (g *Group) Stop() {
	g.mu.Lock()
	g.stopped = true
	g.mu.Unlock()
	g.cancel()
	g.wg.Wait()
}
