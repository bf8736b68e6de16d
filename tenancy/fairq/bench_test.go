package fairq

import (
	"context"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// never is a Capacity that is never saturated: every Admit takes the fast
// path.
var never = CapacityFunc(func(string, int) bool { return false })

// The fast path allocates the Grant and nothing else.
func TestFastPathAllocs(t *testing.T) {
	q, _ := newTestQueue(t, Config{}, never, nil)
	ctx := context.Background()
	tk := Ticket{Tenant: "a", Model: "m", Session: "s", Turn: 3, Cost: 500}
	allocs := testing.AllocsPerRun(1000, func() {
		g, err := q.Admit(ctx, tk)
		if err != nil {
			t.Fatal(err)
		}
		g.Charge(10)
		g.Done()
	})
	if allocs > 1 {
		t.Errorf("fast path: %v allocations per request; want at most 1 (the Grant)", allocs)
	}
}

// BenchmarkAdmitFastPath measures what admission adds below saturation:
// Admit, one Charge and Done. cpu-ns/op is the process's CPU time per op,
// which, unlike ns/op, does not grow when other processes take the cores.
func BenchmarkAdmitFastPath(b *testing.B) {
	q, _ := newTestQueue(b, Config{}, never, nil)
	ctx := context.Background()
	tk := Ticket{Tenant: "a", Model: "m", Cost: 500}
	b.ReportAllocs()
	cpu0 := cpuTime(b)
	for b.Loop() {
		g, _ := q.Admit(ctx, tk)
		g.Charge(10)
		g.Done()
	}
	b.ReportMetric(float64(cpuTime(b)-cpu0)/float64(b.N), "cpu-ns/op")
}

// cpuTime is the process's user and system CPU time.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkAdmitFastPathParallel is the fast path from every core at once,
// 64 tenants, one model (one lock).
func BenchmarkAdmitFastPathParallel(b *testing.B) {
	q, _ := newTestQueue(b, Config{}, never, nil)
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			i++
			g, _ := q.Admit(ctx, Ticket{Tenant: tenantNames[i%len(tenantNames)], Model: "m", Cost: 500})
			g.Done()
		}
	})
}

var tenantNames = func() []string {
	s := make([]string, 64)
	for i := range s {
		s[i] = "tenant-" + strconv.Itoa(i)
	}
	return s
}()

// BenchmarkDispatchSaturated measures the slow path at saturation: one
// request queued and one dispatched per op, with a backlog of 1000
// requests over 64 tenants, both classes, sessions in progress and new.
func BenchmarkDispatchSaturated(b *testing.B) {
	budget := 0 // dispatches allowed; the benchmark's goroutine only
	c := CapacityFunc(func(string, int) bool {
		if budget > 0 {
			budget--
			return false
		}
		return true
	})
	q, _ := newTestQueue(b, Config{}, c, nil)
	tk := func(i int) Ticket {
		return Ticket{Tenant: tenantNames[i%64], Model: "m", Class: Class(i % 2), Session: strconv.Itoa(i % 200),
			Turn: i % 3, Attained: float64(i % 97 * 100), Cost: 300}
	}
	for i := range 1000 {
		enqueue(b, q, tk(i))
	}
	b.ReportAllocs()
	i := 1000
	for b.Loop() {
		enqueue(b, q, tk(i))
		i++
		budget = 1
		q.Kick()
	}
	if q.total.Load() != 1000 {
		b.Fatalf("backlog %d; want 1000", q.total.Load())
	}
}
