package remote

// Crash stops the renewer and drops the connections without releasing
// any lease, as a kill -9 of the replica would.
func (s *Store) Crash() {
	s.mu.Lock()
	s.closed = true
	s.held = map[*Lease]struct{}{}
	s.mu.Unlock()
	close(s.stop)
	<-s.done
	s.c.Close()
}

// Instance is the Store's random instance id.
func (s *Store) Instance() string { return s.instance }
