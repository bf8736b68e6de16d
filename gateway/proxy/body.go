package proxy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"sync"

	"github.com/tidwall/gjson"

	"github.com/warmpath/warmpath/gateway/request"
	"github.com/warmpath/warmpath/internal/apierror"
)

// parseUsage reads an OpenAI usage object.
func parseUsage(u gjson.Result) (request.Usage, bool) {
	if !u.IsObject() {
		return request.Usage{}, false
	}
	return request.Usage{
		PromptTokens:     int(u.Get("prompt_tokens").Int()),
		CompletionTokens: int(u.Get("completion_tokens").Int()),
		CachedTokens:     int(u.Get("prompt_tokens_details.cached_tokens").Int()),
	}, true
}

// Observer receives what a response body reveals as it is read. Every
// callback may be nil; Done is called exactly once.
type Observer struct {
	FirstByte func()
	Usage     func(request.Usage)
	// Done reports the end of the body: err is nil after a clean EOF.
	Done func(err error)
}

// maxEventBytes bounds one SSE event (or a non-streaming body kept for
// usage parsing), so a misbehaving upstream cannot exhaust memory.
const maxEventBytes = 8 << 20

// ErrEventTooLarge ends a stream whose event exceeds 8 MiB.
var ErrEventTooLarge = errors.New("proxy: upstream SSE event exceeds 8 MiB")

// sseFilter passes an upstream text/event-stream through event by event:
// each event is released as soon as its terminating blank line arrives, so
// nothing is held back (events that arrived together are released
// together). On the way it learns usage, drops the usage-only
// chunk when the client did not ask for one, and rewrites vLLM's
// mid-stream errors into OpenAI's envelope. A stream that breaks, stalls
// or ends without [DONE] is ended with an error event and [DONE] (see
// end), so no client takes a partial answer for a whole one.
type sseFilter struct {
	src       io.ReadCloser
	br        *bufio.Reader
	dropUsage bool
	obs       Observer

	event   []byte // lines of the event being read
	out     []byte // processed bytes not yet returned
	started bool
	sawDone bool  // the [DONE] event went through
	err     error // what Read returns once out is drained
	cause   error // why the stream ended, for done (nil after [DONE])
	once    sync.Once
}

// NewSSEFilter filters src, an upstream text/event-stream (sseFilter);
// dropUsage drops the usage-only chunk the client did not ask for.
func NewSSEFilter(src io.ReadCloser, dropUsage bool, obs Observer) io.ReadCloser {
	return &sseFilter{src: src, br: bufio.NewReaderSize(src, 32<<10), dropUsage: dropUsage, obs: obs}
}

func (f *sseFilter) Read(p []byte) (int, error) {
	for len(f.out) == 0 {
		if f.err != nil {
			f.finish(f.cause)
			return 0, f.err
		}
		f.readLine()
	}
	// The events already received go out with it: what one read from the
	// replica brought is one write (and one flush) to the client, as a
	// plain proxy passes it, not one per event.
	for f.err == nil && len(f.out) < len(p) && f.lineBuffered() {
		f.readLine()
	}
	n := copy(p, f.out)
	f.out = f.out[n:]
	return n, nil
}

// lineBuffered reports whether a whole line is buffered, so that
// readLine returns it without waiting on the replica.
func (f *sseFilter) lineBuffered() bool {
	b, _ := f.br.Peek(f.br.Buffered())
	return bytes.IndexByte(b, '\n') >= 0
}

// readLine reads one line into the current event, and on a blank line
// processes the event into f.out.
func (f *sseFilter) readLine() {
	line, err := f.br.ReadSlice('\n')
	if len(f.event)+len(line) > maxEventBytes {
		f.event = f.event[:0]
		f.end(ErrEventTooLarge, false)
		return
	}
	f.event = append(f.event, line...)
	switch {
	case errors.Is(err, bufio.ErrBufferFull):
		return // the line continues
	case err != nil:
		// End of stream: release whatever is pending as is (an event
		// without its blank line, which end closes if it must add one).
		open := len(f.event) > 0
		f.out = append(f.out, f.event...)
		f.event = f.event[:0]
		f.end(err, open)
		return
	}
	if len(bytes.TrimRight(line, "\r\n")) == 0 {
		f.processEvent()
	}
}

func (f *sseFilter) processEvent() {
	ev := f.event
	f.event = f.event[:0]
	if !f.started {
		f.started = true
		if f.obs.FirstByte != nil {
			f.obs.FirstByte()
		}
	}
	data := sseData(ev)
	if data == nil || bytes.Equal(data, []byte("[DONE]")) {
		f.sawDone = f.sawDone || data != nil
		f.out = append(f.out, ev...)
		return
	}
	if bytes.Contains(data, []byte(`"usage"`)) {
		if u, ok := parseUsage(gjson.GetBytes(data, "usage")); ok {
			if f.obs.Usage != nil {
				f.obs.Usage(u)
			}
			if f.dropUsage {
				if ch := gjson.GetBytes(data, "choices"); !ch.Exists() || (ch.IsArray() && len(ch.Array()) == 0) {
					return // the usage-only chunk the client did not ask for
				}
			}
		}
	}
	if bytes.Contains(data, []byte(`"error"`)) {
		if e := gjson.GetBytes(data, "error"); e.IsObject() {
			if fixed := NormalizeErrorBody(500, data); fixed != nil {
				f.out = append(f.out, "data: "...)
				f.out = append(f.out, fixed...)
				f.out = append(f.out, "\n\n"...)
				return
			}
		}
	}
	f.out = append(f.out, ev...)
}

// ErrTruncated is the cause of a stream that ended without [DONE].
var ErrTruncated = errors.New("proxy: upstream stream ended without [DONE]")

// The causes the forwarding step cuts a stream with, each named by
// CutReason.
var (
	// ErrFirstByte: no first event within upstream.first_byte_timeout.
	ErrFirstByte = errors.New("no first event within upstream.first_byte_timeout")
	// ErrIdle: no event within upstream.idle_timeout.
	ErrIdle = errors.New("no event within upstream.idle_timeout")
	// ErrDraining ends the streams still open when the drain timeout
	// passes.
	ErrDraining = errors.New("the gateway is shutting down (server.drain_timeout passed)")
)

// end records why the upstream stream ended. After [DONE] that is a clean
// end; otherwise the replica broke, stalled past a timeout, or stopped
// early, and the client gets an error event in OpenAI's envelope (the
// shape the OpenAI SDKs raise as an APIError) and [DONE], then a clean
// EOF. A client that went away gets nothing more.
// open reports that the output ends inside an event.
func (f *sseFilter) end(err error, open bool) {
	f.err = io.EOF
	switch {
	case errors.Is(err, io.EOF) && f.sawDone:
		return
	case errors.Is(err, context.Canceled):
		f.err, f.cause = err, err
		return
	case errors.Is(err, io.EOF):
		err = ErrTruncated
	}
	f.cause = err
	if open {
		f.out = append(f.out, "\n\n"...) // close the event the replica left open
	}
	f.out = append(f.out, cutEvent(err)...)
}

// cutEvent is the error event and [DONE] that end a stream cut short.
func cutEvent(cause error) []byte {
	msg := "The upstream replica stopped before the answer was complete (" + CutReason(cause) + "); the response is incomplete. Try again."
	if errors.Is(cause, ErrDraining) {
		msg = "The gateway is shutting down; the response is incomplete. Try again."
	}
	e := &apierror.Error{Type: apierror.TypeServer, Code: "upstream_error", Msg: msg}
	out := append([]byte("data: "), e.Marshal()...)
	return append(out, "\n\ndata: [DONE]\n\n"...)
}

// CutReason labels why a stream was cut, for warmpath_streams_cut_total
// and the client's error message.
func CutReason(cause error) string {
	switch {
	case errors.Is(cause, ErrIdle):
		return "idle_timeout"
	case errors.Is(cause, ErrFirstByte):
		return "first_byte_timeout"
	case errors.Is(cause, ErrTruncated):
		return "truncated"
	case errors.Is(cause, ErrEventTooLarge):
		return "event_too_large"
	case errors.Is(cause, ErrDraining):
		return "drain"
	}
	return "upstream_error"
}

// sseData joins an event's data lines, or returns nil when it has none.
func sseData(ev []byte) []byte {
	var data []byte
	found := false
	for len(ev) > 0 {
		i := bytes.IndexByte(ev, '\n')
		var line []byte
		if i < 0 {
			line, ev = ev, nil
		} else {
			line, ev = ev[:i], ev[i+1:]
		}
		line = bytes.TrimRight(line, "\r")
		if v, ok := bytes.CutPrefix(line, []byte("data:")); ok {
			v = bytes.TrimPrefix(v, []byte(" "))
			if found {
				data = append(data, '\n')
			}
			data = append(data, v...)
			found = true
		}
	}
	if !found {
		return nil
	}
	return data
}

func (f *sseFilter) Close() error {
	err := f.src.Close()
	f.finish(io.ErrUnexpectedEOF)
	return err
}

func (f *sseFilter) finish(err error) {
	f.once.Do(func() {
		if errors.Is(err, io.EOF) {
			err = nil
		}
		if f.obs.Done != nil {
			f.obs.Done(err)
		}
	})
}

// jsonTap passes a non-streaming body through unchanged while keeping a
// bounded copy, from which it reads usage at its end: EOF, or, for a body
// of declared length, the read that completes it, so that done has run
// before the caller passes the last bytes on (the client's next turn
// cannot overtake the binding write done queues).
type jsonTap struct {
	src     io.ReadCloser
	obs     Observer
	kept    []byte
	started bool
	left    int64 // bytes of a declared length still to come; -1 unknown
	once    sync.Once
}

// NewJSONTap taps src, a non-streaming body of declared length (-1:
// unknown), for its usage (jsonTap).
func NewJSONTap(src io.ReadCloser, length int64, obs Observer) io.ReadCloser {
	return &jsonTap{src: src, obs: obs, left: length}
}

func (t *jsonTap) Read(p []byte) (int, error) {
	n, err := t.src.Read(p)
	if n > 0 {
		if !t.started {
			t.started = true
			if t.obs.FirstByte != nil {
				t.obs.FirstByte()
			}
		}
		if len(t.kept)+n <= maxEventBytes {
			t.kept = append(t.kept, p[:n]...)
		}
		if t.left >= 0 {
			if t.left -= int64(n); t.left <= 0 && err == nil {
				t.end(io.EOF)
			}
		}
	}
	if err != nil {
		t.end(err)
	}
	return n, err
}

func (t *jsonTap) Close() error {
	err := t.src.Close()
	t.end(io.ErrUnexpectedEOF)
	return err
}

// end reports the usage when the body ended whole (err is EOF), then
// done, once.
func (t *jsonTap) end(err error) {
	t.once.Do(func() {
		if errors.Is(err, io.EOF) {
			if t.obs.Usage != nil {
				if u, ok := parseUsage(gjson.GetBytes(t.kept, "usage")); ok {
					t.obs.Usage(u)
				}
			}
			err = nil
		}
		if t.obs.Done != nil {
			t.obs.Done(err)
		}
	})
}
