package gateway

import "testing"

// A request counts in its model's backlog while the Admitter holds it,
// and not before or after.
func TestBacklogCountsWaiting(t *testing.T) {
	var b backlog
	entered, release, done := make(chan struct{}), make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		_, _ = b.wait("m", func() (func(Usage), error) {
			close(entered)
			<-release
			return releaseNothing, nil
		})
	}()
	<-entered
	if got := b.of("m"); got != 1 {
		t.Errorf("backlog while admitting = %d; want 1", got)
	}
	if got := b.of("other"); got != 0 {
		t.Errorf("another model's backlog = %d; want 0", got)
	}
	close(release)
	<-done
	if got := b.of("m"); got != 0 {
		t.Errorf("backlog after admission = %d; want 0", got)
	}
}
