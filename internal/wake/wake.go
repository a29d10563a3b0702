// Package wake fans wake-ups out to the receivers of named channels: the
// broker's in-process wake-ups of subscriptions by table, and PostgreSQL's
// notifications by channel. It is the one home of that mechanism.
package wake

import "sync"

// Fanout holds receivers by name. A receiver is a channel of one slot that
// the caller owns; a wake-up never blocks. The zero value is ready to use.
type Fanout struct {
	mu   sync.Mutex
	subs map[string]map[chan struct{}]struct{}
}

// Add makes ch a receiver of name, and reports whether name is new.
func (f *Fanout) Add(name string, ch chan struct{}) (first bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.subs == nil {
		f.subs = map[string]map[chan struct{}]struct{}{}
	}
	if f.subs[name] == nil {
		f.subs[name] = map[chan struct{}]struct{}{}
		first = true
	}
	f.subs[name][ch] = struct{}{}
	return first
}

// Remove takes ch off name and reports whether it was there and whether
// name has no receiver left.
func (f *Fanout) Remove(name string, ch chan struct{}) (was, last bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.subs[name][ch]; !ok {
		return false, false
	}
	delete(f.subs[name], ch)
	if len(f.subs[name]) == 0 {
		delete(f.subs, name)
		return true, true
	}
	return true, false
}

// Wake pokes every receiver of name, or of every name for "".
func (f *Fanout) Wake(name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for n, chs := range f.subs {
		if name != "" && n != name {
			continue
		}
		for ch := range chs {
			Signal(ch)
		}
	}
}

// Names lists the names that have receivers.
func (f *Fanout) Names() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]string, 0, len(f.subs))
	for n := range f.subs {
		out = append(out, n)
	}
	return out
}

// Has reports whether name has a receiver.
func (f *Fanout) Has(name string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.subs[name] != nil
}

// Empty reports whether no receiver is left.
func (f *Fanout) Empty() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.subs) == 0
}

// Signal wakes one waiter on ch, a channel of one slot, without blocking.
func Signal(ch chan struct{}) {
	if len(ch) == 0 {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}
