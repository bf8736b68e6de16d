package fleet

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warmpath/warmpath/internal/testrun"
)

// logRecorder is a slog.Handler that keeps every record with the logger's
// attributes, for asserting on warnings.
type logRecorder struct {
	mu    *sync.Mutex
	recs  *[]recorded // guarded by mu
	attrs []slog.Attr
}

type recorded struct {
	level slog.Level
	msg   string
	attrs map[string]string
}

func newLogRecorder() *logRecorder {
	return &logRecorder{mu: new(sync.Mutex), recs: new([]recorded)}
}

func (h *logRecorder) Enabled(context.Context, slog.Level) bool { return true }

func (h *logRecorder) Handle(_ context.Context, r slog.Record) error {
	rec := recorded{level: r.Level, msg: r.Message, attrs: map[string]string{}}
	for _, a := range h.attrs {
		rec.attrs[a.Key] = a.Value.String()
	}
	r.Attrs(func(a slog.Attr) bool {
		rec.attrs[a.Key] = a.Value.String()
		return true
	})
	h.mu.Lock()
	defer h.mu.Unlock()
	*h.recs = append(*h.recs, rec)
	return nil
}

func (h *logRecorder) WithAttrs(as []slog.Attr) slog.Handler {
	c := *h
	c.attrs = append(slices.Clone(h.attrs), as...)
	return &c
}

func (h *logRecorder) WithGroup(string) slog.Handler { return h }

// matching returns the records about replica whose message contains msg.
func (h *logRecorder) matching(replica, msg string) []recorded {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []recorded
	for _, r := range *h.recs {
		if r.attrs["replica"] == replica && strings.Contains(r.msg, msg) {
			out = append(out, r)
		}
	}
	return out
}

// A replica pinned to a model it does not serve (vLLM started without
// --served-model-name serves the model path) is reported at startup with
// what it does serve, and checked again each time it recovers.
func TestConfiguredModelCheck(t *testing.T) {
	wrong := newFakeVLLM(t)
	wrong.models.Store(&[]string{"Qwen/Qwen3-32B"})
	right := newFakeVLLM(t)
	right.models.Store(&[]string{"qwen3-32b"})
	mute := newFakeVLLM(t)
	mute.models.Store(&[]string{}) // lists nothing: cannot be checked
	logs := newLogRecorder()
	cfg := fastConfig(wrong.spec("qwen3-32b"), right.spec("qwen3-32b"), mute.spec("qwen3-32b"))
	cfg.Logger = slog.New(logs)
	f := startFleet(t, cfg)
	name := func(v *fakeVLLM) string { return strings.TrimPrefix(v.URL, "http://") }

	// The health goroutine checks the model right after the first
	// successful health check, so a second health check means it is done.
	for _, v := range []*fakeVLLM{wrong, right, mute} {
		testrun.Eventually(t, 10*time.Second, func() bool { return v.hit("/health") >= 2 }, "a second health check on "+name(v))
	}
	const msg = "does not serve the configured model"
	warns := logs.matching(name(wrong), msg)
	if len(warns) != 1 || warns[0].level != slog.LevelWarn {
		t.Fatalf("warnings for the mismatched replica = %+v; want one WARN", warns)
	}
	if got := warns[0].attrs; got["model"] != "qwen3-32b" || !strings.Contains(got["served"], "Qwen/Qwen3-32B") {
		t.Errorf("warning attrs = %v; want the configured model and what the replica serves", got)
	}
	if got := logs.matching(name(right), msg); len(got) != 0 {
		t.Errorf("the replica serving its model was warned about: %+v", got)
	}
	if got := logs.matching(name(mute), "cannot check"); len(got) != 1 || got[0].level != slog.LevelInfo {
		t.Errorf("unreadable /v1/models: records %+v; want one INFO", got)
	}
	if got := logs.matching(name(mute), msg); len(got) != 0 {
		t.Errorf("an unreadable /v1/models was reported as a mismatch: %+v", got)
	}

	// Fixed and restarted (a flap): checked again, no new warning. Still
	// wrong after another flap: warned again.
	flap := func(v *fakeVLLM) {
		t.Helper()
		r := f.Replica(name(v))
		n := v.hit("/v1/models")
		v.health.Store(500)
		testrun.Eventually(t, 10*time.Second, func() bool { return !r.State().Healthy }, "unhealthy")
		v.health.Store(0)
		testrun.Eventually(t, 10*time.Second, func() bool { return v.hit("/v1/models") > n }, "checked again")
		h := v.hit("/health")
		testrun.Eventually(t, 10*time.Second, func() bool { return v.hit("/health") > h }, "the check to finish")
	}
	wrong.models.Store(&[]string{"qwen3-32b"})
	flap(wrong)
	if got := logs.matching(name(wrong), msg); len(got) != 1 {
		t.Errorf("after the fix: %d warnings; want still 1", len(got))
	}
	wrong.models.Store(&[]string{"Qwen/Qwen3-32B"})
	flap(wrong)
	if got := logs.matching(name(wrong), msg); len(got) != 2 {
		t.Errorf("after it regressed: %d warnings; want 2", len(got))
	}
	if got := f.Replica(name(wrong)).State().Models; !slices.Equal(got, []string{"qwen3-32b"}) {
		t.Errorf("Models = %v; want the configured model, kept", got)
	}
}
