package admission

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/warmpath/warmpath/gateway/fleet"
	"github.com/warmpath/warmpath/gateway/request"
	"github.com/warmpath/warmpath/tenancy"
	"github.com/warmpath/warmpath/tenancy/fairq"
)

// Options are a Queue's dependencies.
type Options struct {
	// KeyPrefix prefixes the Redis keys of the tenants' shared virtual
	// counters.
	KeyPrefix string
	// Redis, when not nil, shares the tenants' virtual counters with the
	// other gateways.
	Redis redis.UniversalClient
	// Labels bounds the tenant label of the queue's metrics.
	Labels *tenancy.Labeler
	// Registerer receives the queue's metrics; nil registers none.
	Registerer prometheus.Registerer
	// Logger receives the queue's logs.
	Logger *slog.Logger
}

// Queue is the gateway's admission queue: the fair queue (package
// tenancy/fairq) over the fleet's Capacity. Its Run goroutine is started
// by the gateway's Run.
type Queue struct {
	q        *fairq.Queue
	capacity *Capacity
	fleet    *fleet.Fleet
	labels   *tenancy.Labeler
	names    sync.Map // tenant ID → tenant name, for metric labels
}

// New builds the queue of cfg (defaulted and validated) over fl.
func New(cfg Config, fl *fleet.Fleet, o Options) (*Queue, error) {
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	a := &Queue{fleet: fl, labels: o.Labels, capacity: &Capacity{fleet: fl, sat: cfg.Saturation, priority: cfg.VLLMPriority, log: log.With("component", "queue")}}
	label := func(id string) string {
		name := id
		if v, ok := a.names.Load(id); ok {
			name = v.(string)
		}
		return a.labels.Label(name)
	}
	q, err := fairq.New(cfg.fairqConfig(o.KeyPrefix, label), a.capacity, o.Redis, o.Registerer, log.With("component", "fairq"))
	if err != nil {
		return nil, fmt.Errorf("config: queue: %w", err)
	}
	a.q = q
	if o.Registerer != nil && cfg.Saturation.InteractiveReserve > 0 {
		if err := o.Registerer.Register(reserveCollector{a.capacity}); err != nil {
			return nil, fmt.Errorf("queue: metrics: %w", err)
		}
	}
	return a, nil
}

// Capacity returns the fleet's capacity as the queue judges it.
func (a *Queue) Capacity() *Capacity { return a.capacity }

// Run runs the queue's exchange with Redis and its re-checks until ctx
// ends.
func (a *Queue) Run(ctx context.Context) error { return a.q.Run(ctx) }

// Kick makes the queue look again for room now (a replica's room grew).
func (a *Queue) Kick() { a.q.Kick() }

// Refill re-checks the queue once a request it dispatched without a place
// has reached its replica (fairq.Queue.Refill).
func (a *Queue) Refill() { a.q.Refill() }

// Grant is an admitted request's place in the queue, ended by Done.
type Grant struct {
	gr *fairq.Grant // nil: admitted without the queue
}

// Waited is how long the request waited in the queue.
func (g Grant) Waited() time.Duration {
	if g.gr == nil {
		return 0
	}
	return g.gr.Waited()
}

// Done ends the grant with what the replica reported: output tokens are
// charged and the predicted prompt cost replaced by the actual one. A
// request that reported nothing (it failed, or its client left) keeps the
// prediction.
func (g Grant) Done(u request.Usage) {
	if g.gr == nil {
		return
	}
	if u != (request.Usage{}) {
		g.gr.Charge(float64(u.CompletionTokens))
		g.gr.Settle(float64(u.PromptTokens), float64(u.CachedTokens))
	}
	g.gr.Done()
}

// Admit waits, if r's model is saturated, until the queue dispatches r;
// promptTokens is its estimated prompt. place, when not nil, routes r
// as the queue considers it and reports whether the replica chosen has
// room (fairq.Ticket.Place). A model that no healthy replica serves skips
// the queue, so routing answers 404 or 503 at once rather than the queue
// a 429 after its timeout (and no client-chosen name becomes queue
// state).
func (a *Queue) Admit(ctx context.Context, r *request.R, promptTokens int, place func(*Capacity) bool) (Grant, error) {
	if !a.serves(r.Model()) {
		return Grant{}, nil
	}
	if p := r.Principal(); p != nil {
		if _, ok := a.names.Load(p.TenantID); !ok {
			// First sight: the queue labels the tenant now, before its
			// first request has finished and been counted.
			a.names.Store(p.TenantID, p.TenantName)
			a.labels.Observe(p.TenantName, 0)
		}
	}
	t := Ticket(r, promptTokens)
	if place != nil {
		t.Place = func() bool { return place(a.capacity) }
	}
	gr, err := a.q.Admit(ctx, t)
	if err != nil {
		return Grant{}, err
	}
	return Grant{gr: gr}, nil
}

// serves reports whether a healthy replica serves model.
func (a *Queue) serves(model string) bool {
	for _, rep := range a.fleet.Snapshot().Replicas {
		if st := rep.State(); st.Healthy && st.Serves(model) {
			return true
		}
	}
	return false
}

// Ticket is what the queue knows of r, whose prompt is estimated at
// promptTokens. The session's progress comes from the conversation
// itself, so admission needs no Redis: a chat request carrying assistant
// messages continues a session (Turn is their count), the prompt up to
// the last of them is predicted cached on the replica serving the session
// (sticky routing keeps it there), and that prefix is also the service
// the session has received (Attained). Cost is the prompt net of that
// prediction; Settle corrects it from the usage.
func Ticket(r *request.R, promptTokens int) fairq.Ticket {
	t := fairq.Ticket{Class: r.Class(), Model: r.Model(), Session: r.Session().Value, Turn: r.Turns()}
	if p := r.Principal(); p != nil {
		t.Tenant, t.Weight = p.TenantID, float64(p.Weight)
	}
	held := min(promptTokens, r.HeldBytes()/4)
	t.Attained, t.Cost = float64(held), float64(promptTokens-held)
	return t
}

// Waiting returns how many requests wait in the queue now, by class.
func (a *Queue) Waiting() map[string]int { return a.q.Waiting() }
