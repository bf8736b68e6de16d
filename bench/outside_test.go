package bench

import (
	"testing"
	"time"
)

func TestParseServerTiming(t *testing.T) {
	got := parseServerTiming("prepare;dur=1.5, queue;dur=0.00, route;dur=0.25, upstream;dur=10, other;dur=3", 4)
	want := gatewayTiming{prepare: 6 * time.Millisecond, route: time.Millisecond, upstream: 40 * time.Millisecond}
	if got == nil || *got != want {
		t.Errorf("parsed %+v; want %+v (wall-clock ms × speed 4)", got, want)
	}
	for _, v := range []string{"", "total;dur=3", "prepare;dur=x"} {
		if got := parseServerTiming(v, 4); got != nil {
			t.Errorf("%q parsed as %+v; want nil", v, got)
		}
	}
}

// The breakdown's phases add up to each request's TTFT, and the tail is
// the requests at or above p90.
func TestOutsideOf(t *testing.T) {
	ms := func(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }
	mk := func(ttft, engine, prepare, upstream float64, reason string) sample {
		return sample{ttft: ms(ttft), engineTTFT: ms(engine), reason: reason,
			timing: &gatewayTiming{prepare: ms(prepare), upstream: ms(upstream)}}
	}
	samples := []sample{
		mk(100, 50, 10, 80, "sticky"),
		mk(100, 50, 10, 80, "sticky"),
		mk(400, 50, 300, 80, "scored"),
		{ttft: ms(999), engineTTFT: -1}, // no timing: left out
	}
	o := outsideOf(samples, 400)
	if o == nil || o.Requests != 3 {
		t.Fatalf("breakdown %+v; want 3 requests", o)
	}
	if o.Prepare.P50Ms != 10 || o.Prepare.TailMeanMs != 300 || o.Host.P50Ms != 30 || o.After.P50Ms != 10 || o.After.TailMeanMs != 20 {
		t.Errorf("prepare %+v host %+v after %+v", o.Prepare, o.Host, o.After)
	}
	if o.TailReasons["scored"] != 1 || len(o.TailReasons) != 1 {
		t.Errorf("tail reasons %v; want the one scored request", o.TailReasons)
	}
	if outsideOf(samples[3:], 0) != nil {
		t.Error("a breakdown from no timed sample")
	}
}
