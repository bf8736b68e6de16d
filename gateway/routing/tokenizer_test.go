package routing

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/warmpath/warmpath/gateway/fleet"
	"github.com/warmpath/warmpath/gateway/request"
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
		tok := newTokenizer(client, 1<<20, newTokMetrics(prometheus.NewRegistry()))
		reps := testReplicas(t, "http://r:8000")
		req, err := request.Parse(request.Chat, http.Header{}, []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`), nil)
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		got := make([][]uint32, 6)
		for i := range got {
			wg.Go(func() {
				ids, err := tok.tokens(context.Background(), req, reps)
				if err != nil {
					t.Error(err)
				}
				got[i] = ids
			})
		}
		gone, cancel := context.WithCancel(context.Background())
		quit := make(chan error, 1)
		go func() {
			_, err := tok.tokens(gone, req, reps)
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
		if ids, _ := tok.tokens(context.Background(), req, reps); !slices.Equal(ids, []uint32{7, 8, 9}) || calls.Load() != 1 {
			t.Errorf("after the call: %v with %d calls; want the cached ids", ids, calls.Load())
		}
	})
}

// testReplicas returns fleet members for urls (the fleet is not run).
func testReplicas(t *testing.T, urls ...string) []*fleet.Replica {
	t.Helper()
	var specs []fleet.ReplicaSpec
	for _, u := range urls {
		specs = append(specs, fleet.ReplicaSpec{URL: u, Model: "m"})
	}
	f, err := fleet.New(fleet.Config{Replicas: specs})
	if err != nil {
		t.Fatal(err)
	}
	return f.Snapshot().Replicas
}

// The cache is bounded by the bytes of the token ids it holds: long
// prompts evict the least recently used ones, and a prompt larger than
// the budget is not kept.
func TestTokenCacheBytes(t *testing.T) {
	c := newTokenCache(10 * weight(make([]uint32, 1000)))
	for k := range uint64(25) {
		c.add(k, make([]uint32, 1000))
		if b := c.bytes.Load(); b > c.budget {
			t.Fatalf("after %d adds: %d bytes > budget %d", k+1, b, c.budget)
		}
	}
	if _, ok := c.get(0); ok {
		t.Error("the oldest prompt survived")
	}
	if _, ok := c.get(24); !ok {
		t.Error("the newest prompt was evicted")
	}
	if n := c.lru.Len(); n != 10 {
		t.Errorf("%d prompts cached; want 10", n)
	}
	c.add(99, make([]uint32, 100_000))
	if _, ok := c.get(99); ok {
		t.Error("a prompt larger than the budget was cached")
	}
}

// A replica whose /tokenize fails is reported to the fleet and asked last
// afterwards; one that refuses a prompt (4xx) is neither.
func TestTokenizerAvoidsFailingReplicas(t *testing.T) {
	var hits sync.Map
	client := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		v, _ := hits.LoadOrStore(r.URL.Host, new(atomic.Int32))
		v.(*atomic.Int32).Add(1)
		switch r.URL.Host {
		case "bad:8000":
			return nil, errors.New("connection reset")
		case "no:8000":
			return &http.Response{StatusCode: http.StatusNotFound, Body: io.NopCloser(strings.NewReader("no"))}, nil
		}
		return &http.Response{StatusCode: http.StatusOK, Body: io.NopCloser(strings.NewReader(`{"tokens":[1]}`))}, nil
	})}
	tok := newTokenizer(client, 1<<20, newTokMetrics(prometheus.NewRegistry()))
	reps := testReplicas(t, "http://bad:8000", "http://good:8000", "http://no:8000")
	for i := range 12 {
		body := fmt.Appendf(nil, `{"model":"m","messages":[{"role":"user","content":"p%d"}]}`, i)
		req, _ := request.Parse(request.Chat, http.Header{}, body, nil)
		if _, err := tok.tokens(context.Background(), req, reps); err != nil && !errors.Is(err, errTokenizeRefused) {
			t.Fatalf("prompt %d: %v", i, err)
		}
	}
	count := func(host string) int32 {
		v, _ := hits.LoadOrStore(host, new(atomic.Int32))
		return v.(*atomic.Int32).Load()
	}
	if n := count("bad:8000"); n != 1 {
		t.Errorf("the failing replica was asked %d times; want once, then last", n)
	}
	if !strings.Contains(reps[0].State().HealthReason, "connection reset") {
		t.Errorf("failure not reported to health: %q", reps[0].State().HealthReason)
	}
	if n := count("no:8000"); n != 1 {
		t.Errorf("the replica without /tokenize was asked %d times; want once, then last", n)
	}
	if reps[2].State().HealthReason != reps[1].State().HealthReason {
		t.Errorf("a 404 from /tokenize was reported to health: %q", reps[2].State().HealthReason)
	}
}

// A target without /tokenize (404) is asked once, then left alone for 30s,
// then 60s (the wait doubling), and asked again at once after an answer;
// the tokenizer service is asked before the replicas.
func TestTokenizerBacksOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var hits sync.Map
		var serviceUp atomic.Bool
		client := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
			v, _ := hits.LoadOrStore(r.URL.Host, new(atomic.Int32))
			v.(*atomic.Int32).Add(1)
			if r.URL.Host == "svc:9000" && serviceUp.Load() {
				return &http.Response{StatusCode: http.StatusOK, Body: io.NopCloser(strings.NewReader(`{"tokens":[1,2]}`))}, nil
			}
			return &http.Response{StatusCode: http.StatusNotFound, Body: io.NopCloser(strings.NewReader(`{"detail":"Not Found"}`))}, nil
		})}
		reg := prometheus.NewRegistry()
		tok := newTokenizer(client, 1<<20, newTokMetrics(reg))
		tok.service = "http://svc:9000"
		reps := testReplicas(t, "http://a:8000", "http://b:8000")
		calls := func() (n int32) {
			hits.Range(func(_, v any) bool { n += v.(*atomic.Int32).Load(); return true })
			return n
		}
		i := 0
		ask := func() error {
			i++
			req, _ := request.Parse(request.Chat, http.Header{}, fmt.Appendf(nil, `{"model":"m","messages":[{"role":"user","content":"p%d"}]}`, i), nil)
			_, err := tok.tokens(context.Background(), req, reps)
			return err
		}
		for range 20 {
			if err := ask(); err == nil {
				t.Fatal("tokenized with no /tokenize anywhere")
			}
		}
		if n := calls(); n != 3 {
			t.Errorf("%d /tokenize calls for 20 prompts; want 3 (one per target, then backoff)", n)
		}
		if err := ask(); !errors.Is(err, ErrTokenizeUnavailable) {
			t.Errorf("every target backed off: err = %v; want ErrTokenizeUnavailable", err)
		}
		for _, name := range []string{"a:8000", "b:8000", serviceTarget} {
			if v := gauge(tok.m.backoff.WithLabelValues(name)); v != 1 {
				t.Errorf("warmpath_tokenizer_backoff{replica=%s} = %v; want 1", name, v)
			}
		}
		time.Sleep(tokenizeBackoffMin + time.Second)
		ask()
		if n := calls(); n != 6 {
			t.Errorf("after the first backoff: %d calls; want 6 (each target asked again once)", n)
		}
		time.Sleep(tokenizeBackoffMin + time.Second) // within the doubled wait
		ask()
		if n := calls(); n != 6 {
			t.Errorf("within the doubled backoff: %d calls; want still 6", n)
		}
		time.Sleep(tokenizeBackoffMin)
		serviceUp.Store(true)
		if err := ask(); err != nil {
			t.Errorf("service back: %v", err)
		}
		if v := gauge(tok.m.backoff.WithLabelValues(serviceTarget)); v != 0 {
			t.Errorf("service answered, backoff gauge %v; want 0", v)
		}
		before := calls()
		ask()
		if calls() != before+1 {
			t.Errorf("with the service answering, a prompt took %d calls; want 1 (the service first)", calls()-before)
		}
	})
}

func TestDecodeTokens(t *testing.T) {
	good := map[string][]uint32{
		`{"count":3,"max_model_len":8192,"tokens":[1,22,4294967295]}`: {1, 22, 4294967295},
		`{"tokens": [ 7 , 8 ]}`:    {7, 8},
		`{"tokens":[]}`:            {},
		"{\"tokens\":[\n1,\n2\n]}": {1, 2},
	}
	for in, want := range good {
		if got, err := decodeTokens([]byte(in)); err != nil || !slices.Equal(got, want) {
			t.Errorf("decodeTokens(%s) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{`{"tokens":[1,-2]}`, `{"tokens":[1.5]}`, `{"tokens":[4294967296]}`, `{"tokens":["1"]}`, `{"tokens":3}`, `{}`, `nope`, `{"tokens":[1,2}`, `{"tokens":[1e3]}`} {
		if got, err := decodeTokens([]byte(in)); err == nil {
			t.Errorf("decodeTokens(%s) = %v; want an error", in, got)
		}
	}
}

// FuzzDecodeTokens: a replica's /tokenize answer is untrusted; whatever
// decodeTokens accepts is exactly what encoding/json reads as uint32s.
func FuzzDecodeTokens(f *testing.F) {
	for _, s := range []string{`{"tokens":[1,2,3]}`, `{"count":1,"tokens":[0]}`, `{"tokens":[4294967295]}`, `{"tokens":[-1]}`, `{"tokens":[1.0]}`, `{"tokens":[ 1 ,2 ]}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		got, err := decodeTokens([]byte(in))
		if err != nil {
			return
		}
		var want struct {
			Tokens []uint32 `json:"tokens"`
		}
		if jerr := json.Unmarshal([]byte(in), &want); jerr != nil {
			return // encoding/json is stricter about duplicate keys and the like
		}
		if !slices.Equal(got, want.Tokens) && !(len(got) == 0 && len(want.Tokens) == 0) {
			t.Fatalf("decodeTokens(%q) = %v; encoding/json reads %v", in, got, want.Tokens)
		}
	})
}

func BenchmarkDecodeTokens(b *testing.B) {
	ids := make([]uint32, 16000)
	for i := range ids {
		ids[i] = uint32(1000 + i*37%150000)
	}
	body, _ := json.Marshal(map[string]any{"count": len(ids), "max_model_len": 32768, "tokens": ids})
	b.Run("fast", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := decodeTokens(body); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var out struct {
				Tokens []uint32 `json:"tokens"`
			}
			if err := json.Unmarshal(body, &out); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// gauge reads a gauge's value.
func gauge(g prometheus.Gauge) float64 {
	var m dto.Metric
	if err := g.Write(&m); err != nil {
		return -1
	}
	return m.GetGauge().GetValue()
}
