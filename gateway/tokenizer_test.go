package gateway

import (
	"context"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"

	"github.com/prometheus/client_golang/prometheus"
)

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// Identical prompts tokenized concurrently share one /tokenize call, and a
// caller that gives up does not cancel it for the others.
func TestTokenizerSharesConcurrentCalls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		var calls atomic.Int32
		client := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
			calls.Add(1)
			<-release
			return &http.Response{StatusCode: http.StatusOK, Body: io.NopCloser(strings.NewReader(`{"tokens":[7,8,9]}`))}, nil
		})}
		tok := newTokenizer(client, 16, newMetrics(prometheus.NewRegistry()))
		req, err := ParseRequest(APIChat, http.Header{}, []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`), "")
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		got := make([][]uint32, 6)
		for i := range got {
			wg.Go(func() {
				ids, err := tok.tokens(context.Background(), "http://r", req)
				if err != nil {
					t.Error(err)
				}
				got[i] = ids
			})
		}
		gone, cancel := context.WithCancel(context.Background())
		quit := make(chan error, 1)
		go func() {
			_, err := tok.tokens(gone, "http://r", req)
			quit <- err
		}()
		synctest.Wait() // every caller waits on the one call in flight
		if n := calls.Load(); n != 1 {
			t.Fatalf("%d /tokenize calls for 7 identical prompts; want 1", n)
		}
		cancel()
		if err := <-quit; err != context.Canceled {
			t.Errorf("canceled caller: err = %v", err)
		}
		close(release)
		wg.Wait()
		for i, ids := range got {
			if !slices.Equal(ids, []uint32{7, 8, 9}) {
				t.Errorf("caller %d got %v", i, ids)
			}
		}
		if ids, _ := tok.tokens(context.Background(), "http://r", req); !slices.Equal(ids, []uint32{7, 8, 9}) || calls.Load() != 1 {
			t.Errorf("after the call: %v with %d calls; want the cached ids", ids, calls.Load())
		}
	})
}
