package fairq

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"testing/synctest"
	"time"

	"github.com/warmpath/warmpath/internal/apierror"
)

type result struct {
	g   *Grant
	err error
}

func admitAsync(ctx context.Context, q *Queue, tk Ticket) <-chan result {
	ch := make(chan result, 1)
	go func() {
		g, err := q.Admit(ctx, tk)
		ch <- result{g, err}
	}()
	return ch
}

// check429 asserts err is a 429 rate_limit_exceeded wrapping sentinel,
// written as OpenAI's envelope with a Retry-After.
func check429(t *testing.T, err, sentinel error) {
	t.Helper()
	if !errors.Is(err, sentinel) {
		t.Fatalf("err = %v; want %v", err, sentinel)
	}
	rec := httptest.NewRecorder()
	apierror.Write(rec, err)
	if rec.Code != http.StatusTooManyRequests {
		t.Fatalf("status %d; want 429", rec.Code)
	}
	if ra, err := strconv.Atoi(rec.Header().Get("Retry-After")); err != nil || ra < 1 {
		t.Errorf("Retry-After = %q; want whole seconds ≥ 1", rec.Header().Get("Retry-After"))
	}
	var env apierror.Envelope
	if err := json.Unmarshal(rec.Body.Bytes(), &env); err != nil || env.Error.Code == nil || *env.Error.Code != "rate_limit_exceeded" ||
		env.Error.Type != apierror.TypeRateLimit || env.Error.Message == "" {
		t.Errorf("body %s: want the OpenAI envelope with code rate_limit_exceeded", rec.Body)
	}
}

func TestCancelLeavesQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q, _ := newTestQueue(t, Config{}, newCap(1), nil)
		running := grantNow(t, q, Ticket{Tenant: "a", Model: "m"})
		ctx, cancel := context.WithCancel(t.Context())
		gone := admitAsync(ctx, q, Ticket{Tenant: "a", Model: "m", Class: Background})
		stays := admitAsync(t.Context(), q, Ticket{Tenant: "a", Model: "m"})
		synctest.Wait()
		if n := q.total.Load(); n != 2 {
			t.Fatalf("%d waiting; want 2", n)
		}
		cancel()
		synctest.Wait()
		select {
		case r := <-gone:
			if !errors.Is(r.err, context.Canceled) || r.g != nil {
				t.Fatalf("Admit = %v, %v; want context.Canceled", r.g, r.err)
			}
		default:
			t.Fatal("Admit still blocked after its context was canceled")
		}
		if n := q.total.Load(); n != 1 {
			t.Fatalf("%d waiting after the cancel; want 1", n)
		}
		s := q.met.seriesFor("a")
		if d, c := metricValue(t, s.depth[Background]), metricValue(t, s.canceled[Background]); d != 0 || c != 1 {
			t.Errorf("background depth %v, canceled %v; want 0, 1", d, c)
		}
		running.Done()
		synctest.Wait()
		r := <-stays
		if r.err != nil {
			t.Fatal(r.err)
		}
		r.g.Done()
		if q.total.Load() != 0 || q.modelFor("m").queued != 0 {
			t.Error("queue not empty at the end")
		}
	})
}

func TestCanceledBeforeAdmit(t *testing.T) {
	q, _ := newTestQueue(t, Config{}, newCap(1), nil)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := q.Admit(ctx, Ticket{Model: "m"}); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v; want context.Canceled", err)
	}
}

func TestTimeout429(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q, _ := newTestQueue(t, Config{Timeout: 5 * time.Second}, newCap(1), nil)
		running := grantNow(t, q, Ticket{Tenant: "a", Model: "m"})
		start := time.Now()
		_, err := q.Admit(t.Context(), Ticket{Tenant: "a", Model: "m"})
		if waited := time.Since(start); waited != 5*time.Second {
			t.Errorf("timed out after %v of simulated time; want 5s", waited)
		}
		check429(t, err, ErrTimeout)
		if v := metricValue(t, q.met.seriesFor("a").shed[Interactive][reasonTimeout]); v != 1 {
			t.Errorf("timeout sheds = %v; want 1", v)
		}
		if q.total.Load() != 0 {
			t.Error("the timed-out request is still queued")
		}
		running.Done()
	})
}

func TestOverflow429(t *testing.T) {
	q, _ := newTestQueue(t, Config{MaxQueued: 4, MaxQueuedPerTenant: 2}, newCap(0), nil) // always saturated
	enqueue(t, q, Ticket{Tenant: "a", Model: "m"})
	enqueue(t, q, Ticket{Tenant: "a", Model: "other-model"}) // the tenant limit spans models
	_, err := q.Admit(t.Context(), Ticket{Tenant: "a", Model: "m"})
	check429(t, err, ErrFull)
	enqueue(t, q, Ticket{Tenant: "b", Model: "m"})
	enqueue(t, q, Ticket{Tenant: "c", Model: "m"})
	_, err = q.Admit(t.Context(), Ticket{Tenant: "d", Model: "m"})
	check429(t, err, ErrFull)
	s := q.met.seriesFor("a")
	if v := metricValue(t, s.shed[Interactive][reasonTenantFull]); v != 1 {
		t.Errorf("tenant_queue_full sheds of a = %v; want 1", v)
	}
	if v := metricValue(t, q.met.seriesFor("d").shed[Interactive][reasonFull]); v != 1 {
		t.Errorf("queue_full sheds of d = %v; want 1", v)
	}
	if n := q.total.Load(); n != 4 {
		t.Errorf("%d waiting; want 4 (refused requests are not counted)", n)
	}
}

// Retry-After follows the waits the model has seen.
func TestRetryAfterFollowsWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q, _ := newTestQueue(t, Config{MaxQueued: 1, Timeout: time.Minute}, newCap(1), nil)
		running := grantNow(t, q, Ticket{Model: "m"})
		for range 20 {
			it := enqueue(t, q, Ticket{Model: "m"})
			time.Sleep(8 * time.Second) // simulated: each request waits 8 s
			running.Done()
			if !ready(it) {
				t.Fatal("not dispatched")
			}
			running = &it.grant
		}
		enqueue(t, q, Ticket{Model: "m"})
		_, err := q.Admit(t.Context(), Ticket{Model: "m"})
		ae, _ := errors.AsType[*apierror.Error](err)
		if ae == nil || ae.Header.Get("Retry-After") != "8" {
			t.Fatalf("err %v; want Retry-After 8", err)
		}
	})
}

// The aged key lets a long-waiting, well-served session overtake a newer,
// less-served one: 10 s of waiting forgives 10,000 tokens at the default
// credit.
func TestAgingWithinTenant(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q, _ := newTestQueue(t, Config{}, newCap(1), nil)
		s := newStepper(t, grantNow(t, q, Ticket{Tenant: "a", Model: "m"}))
		s.add(enqueue(t, q, Ticket{Tenant: "a", Model: "m", Session: "long", Turn: 9, Attained: 8000}))
		time.Sleep(10 * time.Second) // simulated
		s.add(enqueue(t, q, Ticket{Tenant: "a", Model: "m", Session: "short", Turn: 1, Attained: 500}))
		if got := s.step(0).Session; got != "long" {
			t.Errorf("dispatched %s first; want the session that waited 10 s longer", got)
		}
	})
}

func TestSaturatedSeconds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q, _ := newTestQueue(t, Config{}, newCap(1), nil)
		running := grantNow(t, q, Ticket{Model: "m"})
		it := enqueue(t, q, Ticket{Model: "m"})
		time.Sleep(2 * time.Second) // simulated
		q.accountSaturated(time.Now())
		sat := q.met.saturated.WithLabelValues("m")
		if v := metricValue(t, sat); v != 2 {
			t.Errorf("saturated seconds while waiting = %v; want 2", v)
		}
		time.Sleep(time.Second)
		running.Done()
		if !ready(it) {
			t.Fatal("not dispatched")
		}
		if v := metricValue(t, sat); v != 3 {
			t.Errorf("saturated seconds = %v; want 3", v)
		}
		time.Sleep(time.Second)
		q.accountSaturated(time.Now())
		if v := metricValue(t, sat); v != 3 {
			t.Errorf("saturated seconds after the queue drained = %v; want 3", v)
		}
	})
}
