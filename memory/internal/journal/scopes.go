package journal

import "sync"

// Lazy is the load-once state of a log kept in a map by scope (a tenant's
// pool, a user's decisions log): embed it, and LoadedIn loads each once.
type Lazy struct {
	once sync.Once
	err  error
}

// lazy returns l; it lets LoadedIn reach the embedded state.
func (l *Lazy) lazy() *Lazy { return l }

// lazyValue is a value embedding Lazy.
type lazyValue interface{ lazy() *Lazy }

// LoadedIn returns (*m)[key], made by mk when missing, after load ran once
// for it (outside mu, which protects the map). A load that failed takes it
// out of the map, so that the next call tries again, and returns its error.
func LoadedIn[T lazyValue](mu *sync.Mutex, m *map[string]T, key string, mk func() T, load func(T) error) (T, error) {
	mu.Lock()
	v, ok := (*m)[key]
	if !ok {
		if *m == nil {
			*m = map[string]T{}
		}
		v = mk()
		(*m)[key] = v
	}
	mu.Unlock()
	l := v.lazy()
	l.once.Do(func() { l.err = load(v) })
	if l.err != nil {
		mu.Lock()
		if cur, ok := (*m)[key]; ok && cur.lazy() == l {
			delete(*m, key)
		}
		mu.Unlock()
		var zero T
		return zero, l.err
	}
	return v, nil
}
