package gateway

import (
	"encoding/hex"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
)

// log returns the exchange's logger: the request id, tenant, a hash of
// the session key (never the key itself: it may be a client's identifier),
// and, once routed, the decision's reason and the replica tried.
func (g *Gateway) logFor(x *exchange) *slog.Logger {
	attrs := []any{"request_id", x.req.ID()}
	if p := x.req.Principal(); p != nil {
		attrs = append(attrs, "tenant", p.TenantID)
	}
	if k := x.req.Session().Value; k != "" {
		sum := xxhash.Sum64String(k)
		attrs = append(attrs, "session", hex.EncodeToString([]byte{byte(sum >> 56), byte(sum >> 48), byte(sum >> 40), byte(sum >> 32), byte(sum >> 24), byte(sum >> 16), byte(sum >> 8), byte(sum)}))
	}
	if x.route != nil {
		attrs = append(attrs, "reason", x.route.Plan.Reason)
		if x.route.Plan.Rebind != "" {
			attrs = append(attrs, "rebind", x.route.Plan.Rebind)
		}
	}
	if x.replica != nil {
		attrs = append(attrs, "replica", x.replica.Spec.Name)
	}
	return g.log.With(attrs...)
}

// sometimes lets a log line through at most once per period, counting
// what it held back: for warnings a client can trigger at will (a prompt
// the tokenizer refuses), so that it cannot flood the log.
type sometimes struct {
	period time.Duration
	next   atomic.Int64 // Unix nanos before which lines are held back
	held   atomic.Int64 // lines held back since the last one let through
}

// allow reports whether a line may be logged now, and how many were held
// back before it.
func (s *sometimes) allow() (bool, int64) {
	now := time.Now().UnixNano()
	next := s.next.Load()
	if now < next || !s.next.CompareAndSwap(next, now+int64(s.period)) {
		s.held.Add(1)
		return false, 0
	}
	return true, s.held.Swap(0)
}
