package gateway

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"sync"

	"github.com/tidwall/gjson"
)

// Usage is what a replica reported for one request.
type Usage struct {
	PromptTokens     int
	CompletionTokens int
	CachedTokens     int
}

func parseUsage(u gjson.Result) (Usage, bool) {
	if !u.IsObject() {
		return Usage{}, false
	}
	return Usage{
		PromptTokens:     int(u.Get("prompt_tokens").Int()),
		CompletionTokens: int(u.Get("completion_tokens").Int()),
		CachedTokens:     int(u.Get("prompt_tokens_details.cached_tokens").Int()),
	}, true
}

// observer receives what a response body reveals as it is read. Every
// callback may be nil; done is called exactly once.
type observer struct {
	firstByte func()
	usage     func(Usage)
	// done reports the end of the body: err is nil after a clean EOF.
	done func(err error)
}

// maxEventBytes bounds one SSE event (or a non-streaming body kept for
// usage parsing), so a misbehaving upstream cannot exhaust memory.
const maxEventBytes = 8 << 20

var errEventTooLarge = errors.New("gateway: upstream SSE event exceeds 8 MiB")

// sseFilter passes an upstream text/event-stream through event by event:
// each event is released as soon as its terminating blank line arrives, so
// nothing is held back. On the way it learns usage, drops the usage-only
// chunk when the client did not ask for one, and rewrites vLLM's
// mid-stream errors into OpenAI's envelope.
type sseFilter struct {
	src       io.ReadCloser
	br        *bufio.Reader
	dropUsage bool
	obs       observer

	event   []byte // lines of the event being read
	out     []byte // processed bytes not yet returned
	started bool
	err     error
	once    sync.Once
}

func newSSEFilter(src io.ReadCloser, dropUsage bool, obs observer) *sseFilter {
	return &sseFilter{src: src, br: bufio.NewReaderSize(src, 32<<10), dropUsage: dropUsage, obs: obs}
}

func (f *sseFilter) Read(p []byte) (int, error) {
	for len(f.out) == 0 {
		if f.err != nil {
			f.finish(f.err)
			return 0, f.err
		}
		f.readLine()
	}
	n := copy(p, f.out)
	f.out = f.out[n:]
	return n, nil
}

// readLine reads one line into the current event, and on a blank line
// processes the event into f.out.
func (f *sseFilter) readLine() {
	line, err := f.br.ReadSlice('\n')
	if len(f.event)+len(line) > maxEventBytes {
		f.err = errEventTooLarge
		return
	}
	f.event = append(f.event, line...)
	switch {
	case errors.Is(err, bufio.ErrBufferFull):
		return // the line continues
	case err != nil:
		// End of stream: release whatever is pending as is.
		f.out = append(f.out, f.event...)
		f.event = f.event[:0]
		f.err = err
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
		if f.obs.firstByte != nil {
			f.obs.firstByte()
		}
	}
	data := sseData(ev)
	if data == nil || bytes.Equal(data, []byte("[DONE]")) {
		f.out = append(f.out, ev...)
		return
	}
	if bytes.Contains(data, []byte(`"usage"`)) {
		if u, ok := parseUsage(gjson.GetBytes(data, "usage")); ok {
			if f.obs.usage != nil {
				f.obs.usage(u)
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
			if fixed := normalizeErrorBody(500, data); fixed != nil {
				f.out = append(f.out, "data: "...)
				f.out = append(f.out, fixed...)
				f.out = append(f.out, "\n\n"...)
				return
			}
		}
	}
	f.out = append(f.out, ev...)
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
		if f.obs.done != nil {
			f.obs.done(err)
		}
	})
}

// jsonTap passes a non-streaming body through unchanged while keeping a
// bounded copy, from which it reads usage at EOF.
type jsonTap struct {
	src     io.ReadCloser
	obs     observer
	kept    []byte
	started bool
	once    sync.Once
}

func (t *jsonTap) Read(p []byte) (int, error) {
	n, err := t.src.Read(p)
	if n > 0 {
		if !t.started {
			t.started = true
			if t.obs.firstByte != nil {
				t.obs.firstByte()
			}
		}
		if len(t.kept)+n <= maxEventBytes {
			t.kept = append(t.kept, p[:n]...)
		}
	}
	if err != nil {
		if errors.Is(err, io.EOF) && t.obs.usage != nil {
			if u, ok := parseUsage(gjson.GetBytes(t.kept, "usage")); ok {
				t.obs.usage(u)
			}
		}
		t.finish(err)
	}
	return n, err
}

func (t *jsonTap) Close() error {
	err := t.src.Close()
	t.finish(io.ErrUnexpectedEOF)
	return err
}

func (t *jsonTap) finish(err error) {
	t.once.Do(func() {
		if errors.Is(err, io.EOF) {
			err = nil
		}
		if t.obs.done != nil {
			t.obs.done(err)
		}
	})
}
