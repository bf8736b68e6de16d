package responses

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/warmpath/warmpath/internal/apierror"
	"github.com/warmpath/warmpath/internal/backoff"
	"github.com/warmpath/warmpath/internal/chatapi"
	"github.com/warmpath/warmpath/internal/periodic"
)

// Background responses: POST stores the record as queued with its first
// two events (response.created, response.queued) in the event stream
// <prefix>ev:{tag}:<id> and adds a job to the stream <prefix>resp:jobs.
// Workers of any Service read jobs through the consumer group "workers",
// claim the record (queued → in_progress) under a lease scored in the
// sorted set <prefix>resp:leases, and append each event with the stream
// ID 0-<sequence_number+1>, so GET ?stream=true&starting_after=N reads
// from 0-<N+1>. A final entry with field "end" (auto ID, so nothing can be
// appended after it) closes the stream. Cancellation sets the record's
// cancel flag and publishes the record key on <prefix>resp:cancel.

const (
	jobGroup = "workers"
	fieldEv  = "e" // event JSON
	fieldTyp = "t" // event type
	fieldEnd = "end"
)

func seqID(seq int) string { return "0-" + strconv.Itoa(seq+1) }

// enqueue stores a queued background response and answers at once: the
// queued Response, or (stream: true) its event stream.
func (s *Service) enqueue(w http.ResponseWriter, r *http.Request, t *turn, body []byte) error {
	ctx := r.Context()
	if err := s.validateHistory(ctx, t); err != nil {
		return err
	}
	t.resp.Status = StatusQueued
	if err := s.st.queue(ctx, t, body); err != nil {
		return apierror.Unavailable(err, "the response store is unavailable")
	}
	if !t.p.stream {
		return chatapi.WriteJSON(w, http.StatusOK, t.resp)
	}
	return s.tail(w, r, t.tenant, t.resp.ID, -1)
}

// validateHistory checks at creation what the worker will load when it
// runs, so a bad previous_response_id or conversation is a 400/404 now.
func (s *Service) validateHistory(ctx context.Context, t *turn) error {
	switch {
	case t.p.previous != "":
		return s.loadHistory(ctx, t)
	case t.p.conversation != "":
		if _, err := s.st.getConversation(ctx, t.tenant, t.p.conversation); err != nil {
			return s.convError(err, t.p.conversation)
		}
	}
	return nil
}

func (s *store) queue(ctx context.Context, t *turn, body []byte) error {
	obj, err := chatapi.Marshal(t.resp)
	if err != nil {
		return fmt.Errorf("responses: encode %s: %w", t.resp.ID, err)
	}
	in, err := chatapi.Marshal(nonNilItems(t.input))
	if err != nil {
		return fmt.Errorf("responses: encode input of %s: %w", t.resp.ID, err)
	}
	rec, evk := s.recKey(t.tenant, t.resp.ID), s.eventsKey(t.tenant, t.resp.ID)
	pipe := s.rdb.TxPipeline()
	pipe.HSet(ctx, rec, fObj, obj, fIn, in, fPrev, t.p.previous, fStatus, StatusQueued, fBG, "1",
		fBody, body, fHdr, headerJSON(t.header), fIDs, "[]")
	pipe.PExpire(ctx, rec, s.ttl)
	for seq, typ := range []string{"response.created", "response.queued"} {
		ev, _ := chatapi.Marshal(&event{Type: typ, SequenceNumber: seq, Response: t.resp})
		pipe.XAdd(ctx, &redis.XAddArgs{Stream: evk, ID: seqID(seq), Values: []any{fieldTyp, typ, fieldEv, ev}})
	}
	pipe.PExpire(ctx, evk, s.evTTL)
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("responses: queue %s: %w", t.resp.ID, err)
	}
	if err := s.rdb.XAdd(ctx, &redis.XAddArgs{Stream: s.jobsKey(), Values: []any{"t", t.tenant, "id", t.resp.ID}}).Err(); err != nil {
		return fmt.Errorf("responses: queue job %s: %w", t.resp.ID, err)
	}
	return nil
}

// tail streams a background response's buffered events after sequence
// number after, then follows new ones until the end marker. It reads with
// bounded blocking reads, so a vanished writer cannot hold it forever:
// after a read that finds nothing, a terminal record ends the stream.
func (s *Service) tail(w http.ResponseWriter, r *http.Request, tenant, id string, after int) error {
	ctx := r.Context()
	key := s.st.eventsKey(tenant, id)
	last := seqID(after)
	sw := chatapi.NewWriter(w, "")
	for {
		res, err := s.opts.Redis.XRead(ctx, &redis.XReadArgs{Streams: []string{key, last}, Count: 256, Block: s.pollBlock()}).Result()
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, redis.Nil):
			st, err := s.st.get(ctx, tenant, id, false)
			if err != nil || terminal(st.resp.Status) {
				return s.drain(ctx, sw, key, last)
			}
			continue
		case err != nil:
			return s.tailError(sw, fmt.Errorf("responses: read events of %s: %w", id, err))
		}
		for _, m := range res[0].Messages {
			last = m.ID
			if _, ok := m.Values[fieldEnd]; ok {
				return nil
			}
			typ, _ := m.Values[fieldTyp].(string)
			data, _ := m.Values[fieldEv].(string)
			if err := sw.Event(typ, []byte(data)); err != nil {
				return fmt.Errorf("%w: %w", chatapi.ErrStreamStarted, err)
			}
		}
	}
}

// drain sends whatever follows last without blocking.
func (s *Service) drain(ctx context.Context, sw *chatapi.Writer, key, last string) error {
	msgs, err := s.opts.Redis.XRange(ctx, key, "("+last, "+").Result()
	if err != nil {
		return s.tailError(sw, err)
	}
	for _, m := range msgs {
		if _, ok := m.Values[fieldEnd]; ok {
			return nil
		}
		typ, _ := m.Values[fieldTyp].(string)
		data, _ := m.Values[fieldEv].(string)
		if err := sw.Event(typ, []byte(data)); err != nil {
			return fmt.Errorf("%w: %w", chatapi.ErrStreamStarted, err)
		}
	}
	return nil
}

func (s *Service) tailError(sw *chatapi.Writer, err error) error {
	if sw.Started() {
		return fmt.Errorf("%w: %w", chatapi.ErrStreamStarted, err)
	}
	return apierror.Unavailable(err, "the response store is unavailable")
}

// ensureGroup creates the job stream's consumer group if it is missing.
func (s *Service) ensureGroup(ctx context.Context) error {
	err := s.opts.Redis.XGroupCreateMkStream(ctx, s.st.jobsKey(), jobGroup, "0").Err()
	if err != nil && !strings.HasPrefix(err.Error(), "BUSYGROUP") {
		return fmt.Errorf("responses: create job group: %w", err)
	}
	return nil
}

// pollBlock is how long a worker's blocking read waits: LeaseTTL/3, at
// most 2s. go-redis cannot interrupt a blocking read, so this also bounds
// how long Run takes to return after its context ends.
func (s *Service) pollBlock() time.Duration { return min(2*time.Second, s.opts.LeaseTTL/3) }

// workLoop runs one worker: it reads jobs from the group and runs them one
// at a time until ctx ends.
func (s *Service) workLoop(ctx context.Context, consumer string) error {
	for ctx.Err() == nil {
		res, err := s.opts.Redis.XReadGroup(ctx, &redis.XReadGroupArgs{Group: jobGroup, Consumer: consumer,
			Streams: []string{s.st.jobsKey(), ">"}, Count: 1, Block: s.pollBlock()}).Result()
		if errors.Is(err, redis.Nil) || ctx.Err() != nil {
			continue
		}
		if err != nil {
			if strings.HasPrefix(err.Error(), "NOGROUP") {
				_ = s.ensureGroup(ctx) // Redis lost the group (restart): recreate it
			}
			s.log.Warn("responses: read jobs", "err", err)
			s.pause(ctx, time.Second)
			continue
		}
		for _, m := range res[0].Messages {
			s.runJob(ctx, m)
		}
	}
	return ctx.Err()
}

func (s *Service) pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// runJob runs one job and acknowledges it.
func (s *Service) runJob(ctx context.Context, m redis.XMessage) {
	tenant, _ := m.Values["t"].(string)
	id, _ := m.Values["id"].(string)
	if id != "" {
		if err := s.runBackground(ctx, tenant, id); err != nil && ctx.Err() == nil {
			s.log.Error("responses: background run", "id", id, "err", err)
		}
	}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	s.opts.Redis.XAck(actx, s.st.jobsKey(), jobGroup, m.ID)
	s.opts.Redis.XDel(actx, s.st.jobsKey(), m.ID)
}

// claimScript moves a queued record to in_progress with a lease deadline;
// it answers the status it found.
var claimScript = redis.NewScript(`
local st = redis.call('HGET', KEYS[1], 'status')
if st ~= 'queued' then return st or '' end
redis.call('HSET', KEYS[1], 'status', 'in_progress', 'lease', ARGV[1])
return 'queued'
`)

// renewLeaseScript extends a running record's lease and reports whether
// cancellation was asked: 1 renewed, 2 cancel asked, 0 no longer running.
var renewLeaseScript = redis.NewScript(`
if redis.call('HGET', KEYS[1], 'status') ~= 'in_progress' then
  if redis.call('HGET', KEYS[1], 'cancel') == '1' then return 2 end
  return 0
end
redis.call('HSET', KEYS[1], 'lease', ARGV[1])
return 1
`)

// runBackground claims and runs one background response.
func (s *Service) runBackground(ctx context.Context, tenant, id string) error {
	rec := s.st.recKey(tenant, id)
	deadline := func() string { return ms(s.opts.Now().Add(s.opts.LeaseTTL)) }
	if err := s.opts.Redis.ZAdd(ctx, s.st.leasesKey(), redis.Z{Score: float64(s.opts.Now().Add(s.opts.LeaseTTL).UnixMilli()), Member: rec}).Err(); err != nil {
		return fmt.Errorf("responses: lease %s: %w", id, err)
	}
	unlease := func() { s.opts.Redis.ZRem(context.WithoutCancel(ctx), s.st.leasesKey(), rec) }
	found, err := claimScript.Run(ctx, s.opts.Redis, []string{rec}, deadline()).Text()
	if err != nil {
		unlease()
		return fmt.Errorf("responses: claim %s: %w", id, err)
	}
	if found != StatusQueued {
		unlease()
		return nil // cancelled while queued, or run by another worker
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s.mu.Lock()
	s.running[rec] = cancel
	s.mu.Unlock()
	s.metrics.running.Inc()
	defer func() {
		s.mu.Lock()
		delete(s.running, rec)
		s.mu.Unlock()
		s.metrics.running.Dec()
	}()
	done := make(chan struct{})
	go func() {
		defer close(done)
		periodic.Every(rctx, s.opts.LeaseTTL/3, func() { s.renewLease(rctx, rec, deadline(), cancel) })
	}()
	err = s.execBackground(rctx, tenant, id)
	cancel()
	<-done
	if ctx.Err() != nil {
		// Shutting down mid-run: the lease stays and lapses, and a sweeper
		// (of any gateway) fails the response with a reason and closes its
		// stream.
		return ctx.Err()
	}
	if err != nil && !errors.Is(err, errCancelled) && !errors.Is(err, context.Canceled) {
		// The run failed, most likely on Redis itself, and its final
		// status may not be stored: the lease stays and lapses, and a
		// sweeper fails the response if it is still in progress. Removing
		// the lease here left such a response in_progress with nothing
		// to end it.
		return err
	}
	unlease()
	s.endEvents(context.WithoutCancel(ctx), tenant, id)
	if errors.Is(err, errCancelled) || errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

func (s *Service) renewLease(ctx context.Context, rec, deadline string, cancel context.CancelFunc) {
	n, err := renewLeaseScript.Run(ctx, s.opts.Redis, []string{rec}, deadline).Int()
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("responses: renew lease", "record", rec, "err", err)
		}
		return
	}
	score, _ := strconv.ParseFloat(deadline, 64)
	s.opts.Redis.ZAdd(ctx, s.st.leasesKey(), redis.Z{Score: score, Member: rec})
	if n != 1 {
		cancel()
	}
}

// execBackground loads the stored request, its history, and runs it,
// appending events to the record's stream.
func (s *Service) execBackground(ctx context.Context, tenant, id string) error {
	st, err := s.st.get(ctx, tenant, id, true)
	if err != nil {
		return err
	}
	t, err := s.backgroundTurn(ctx, tenant, st)
	if err != nil {
		return err
	}
	emit := s.streamEmitter(ctx, tenant, id)
	b := newBuilder(t.resp, 2, t.namespaced, emit)
	if t.p.conversation != "" {
		release, err := s.lockConversation(ctx, t, true)
		if err != nil {
			return s.failBackground(ctx, t, b, err)
		}
		defer release()
	}
	if err := s.loadHistory(ctx, t); err != nil {
		return s.failBackground(ctx, t, b, err)
	}
	tctx, cancel := context.WithTimeout(ctx, s.opts.TurnTimeout)
	defer cancel()
	start := s.opts.Now()
	up, err := s.call(tctx, t)
	if err != nil {
		return s.failBackground(ctx, t, b, err)
	}
	err = s.execute(tctx, t, up, b, true, true)
	s.metrics.duration.WithLabelValues("background").Observe(s.opts.Now().Sub(start).Seconds())
	return err
}

// backgroundTurn rebuilds the turn from the stored request body, keeping
// the stored input items (their IDs were given out at creation).
func (s *Service) backgroundTurn(ctx context.Context, tenant string, st *stored) (*turn, error) {
	p, err := parseCreate(st.body)
	if err != nil {
		return nil, err
	}
	t := &turn{p: p, tenant: tenant, header: st.header, namespaced: map[string]bool{}, input: st.input, resp: st.resp}
	for _, tool := range p.tools {
		if strings.Contains(tool.Function.Name, namespaceSep) {
			t.namespaced[tool.Function.Name] = true
		}
	}
	t.hintSession(st.header)
	if t.inMsgs, err = renderItems(t.input); err != nil {
		return nil, err
	}
	if !t.sessSet {
		// The input's stored items decided the key at creation; look again.
		if err := s.inheritSession(ctx, t); err != nil {
			return nil, err
		}
	}
	return t, nil
}

func (s *Service) inheritSession(ctx context.Context, t *turn) error {
	ids := make([]string, 0, len(t.input))
	for _, it := range t.input {
		ids = append(ids, it.ID)
	}
	found, err := s.st.items(ctx, t.tenant, ids)
	if err != nil {
		return err
	}
	for _, id := range ids {
		if si, ok := found[id]; ok && si.Sess != "" {
			t.sess, t.sessSet = si.Sess, true
		}
	}
	return nil
}

// failBackground ends a background run that could not reach the model:
// the response fails with the reason, stored, and response.failed is
// appended.
func (s *Service) failBackground(ctx context.Context, t *turn, b *builder, cause error) error {
	if errors.Is(cause, context.Canceled) {
		return cause
	}
	he := apierror.From(cause)
	code := he.Code
	if code == "" {
		code = "server_error"
	}
	if err := b.begin(true); err != nil {
		return err
	}
	return s.finish(ctx, t, b, &ResponseError{Code: code, Message: he.Msg}, true)
}

// streamEmitter appends each event to the record's event stream.
func (s *Service) streamEmitter(ctx context.Context, tenant, id string) emitFunc {
	key := s.st.eventsKey(tenant, id)
	return func(ev *event) error {
		data, err := chatapi.Marshal(ev)
		if err != nil {
			return fmt.Errorf("responses: encode %s: %w", ev.Type, err)
		}
		args := &redis.XAddArgs{Stream: key, ID: seqID(ev.SequenceNumber), Values: []any{fieldTyp, ev.Type, fieldEv, data}}
		if err := s.appendEvent(ctx, args); err != nil {
			return fmt.Errorf("responses: append event %d of %s: %w", ev.SequenceNumber, id, err)
		}
		return nil
	}
}

// Bounds of appendEvent's retries.
const (
	appendPatience = 10 * time.Second       // all tries of one event
	appendTry      = 5 * time.Second        // one try
	appendBackoff  = 100 * time.Millisecond // first pause, doubled up to a second
)

// appendEvent writes one event, retrying for up to appendPatience while
// Redis fails (a master failing over, the breaker open), so a run outlives
// a failover rather than dying on its first lost write. An ID at or below
// the stream's last is a try whose reply was lost: it counts as written.
// A run that is cancelled (by the client, or its lease lost) stops trying
// after its current try.
func (s *Service) appendEvent(ctx context.Context, args *redis.XAddArgs) error {
	deadline := s.opts.Now().Add(appendPatience)
	bo := backoff.Backoff{Min: appendBackoff, Max: time.Second}
	for {
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), appendTry)
		err := s.opts.Redis.XAdd(wctx, args).Err()
		cancel()
		if err == nil || strings.Contains(err.Error(), "equal or smaller than the target stream top item") {
			return nil
		}
		pause := bo.Next()
		if ctx.Err() != nil || !s.opts.Now().Add(pause).Before(deadline) {
			return err
		}
		s.metrics.appendRetries.Inc()
		select {
		case <-ctx.Done():
			return err
		case <-time.After(pause):
		}
	}
}

// endEvents closes a record's event stream.
func (s *Service) endEvents(ctx context.Context, tenant, id string) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	key := s.st.eventsKey(tenant, id)
	pipe := s.opts.Redis.Pipeline()
	pipe.XAdd(ctx, &redis.XAddArgs{Stream: key, Values: []any{fieldEnd, "1"}})
	pipe.PExpire(ctx, key, s.opts.EventTTL)
	if _, err := pipe.Exec(ctx); err != nil {
		s.log.Warn("responses: close event stream", "id", id, "err", err)
	}
}

// cancelScript cancels a background record: a queued one at once (its
// stream closed here, as no worker owns it), a running one by flag for its
// worker. It answers notbg, cancelled (was queued), running, or the
// terminal status it found. KEYS = {record, events}.
var cancelScript = redis.NewScript(`
local v = redis.call('HMGET', KEYS[1], 'status', 'bg')
if not v[1] then return 'missing' end
if v[2] ~= '1' then return 'notbg' end
if v[1] == 'queued' then
  redis.call('HSET', KEYS[1], 'status', 'cancelled', 'cancel', '1')
  redis.call('XADD', KEYS[2], '*', 'end', '1')
  return 'cancelled'
end
if v[1] == 'in_progress' then
  redis.call('HSET', KEYS[1], 'status', 'cancelled', 'cancel', '1')
  return 'running'
end
return v[1]
`)

func (s *store) cancel(ctx context.Context, tenant, id string) (string, error) {
	res, err := cancelScript.Run(ctx, s.rdb, []string{s.recKey(tenant, id), s.eventsKey(tenant, id)}).Text()
	if err != nil {
		return "", fmt.Errorf("responses: cancel %s: %w", id, err)
	}
	if res == "missing" {
		return "", errNotFound
	}
	return res, nil
}

// cancelLoop follows the cancel channel and stops runs of this process.
func (s *Service) cancelLoop(ctx context.Context) error {
	sub := s.opts.Redis.Subscribe(ctx, s.st.cancelChannel())
	defer sub.Close()
	ch := sub.Channel()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case m, ok := <-ch:
			if !ok {
				return ctx.Err()
			}
			s.mu.Lock()
			cancel := s.running[m.Payload]
			s.mu.Unlock()
			if cancel != nil {
				cancel()
			}
		}
	}
}
