package record

import (
	"bufio"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// Entry is one routed request.
type Entry struct {
	// Time is when the request was routed; files keep milliseconds.
	Time time.Time
	// Tenant and Session identify the sender and the conversation: given
	// to Record as they are, written and read back as 16 hex digits of
	// their hash.
	Tenant, Session string
	// Blocks are the prompt's block keys at BlockTokens tokens a block.
	Blocks      []uint64
	BlockTokens int
	// PromptTokens and OutputTokens are the request's lengths in tokens.
	PromptTokens, OutputTokens int
	// Replica is the replica chosen.
	Replica string
	// CachedTokens is the prompt tokens the replica served from cache.
	CachedTokens int
}

// Recorder writes Entries to rotating files. The zero value is not valid;
// use New. Record is safe for concurrent use; Run must be called once.
type Recorder struct {
	cfg     Config
	queue   chan Entry
	dropped atomic.Uint64
	written atomic.Uint64
	failed  atomic.Uint64
}

// New validates cfg and returns a Recorder. It creates no file and
// starts no goroutine: the caller runs Run.
func New(cfg Config) (*Recorder, error) {
	if cfg.Dir == "" {
		return nil, errors.New("record: Dir is required")
	}
	if cfg.MaxFileBytes <= 0 {
		cfg.MaxFileBytes = DefaultMaxFileBytes
	}
	if cfg.Keep <= 0 {
		cfg.Keep = DefaultKeep
	}
	if cfg.Queue <= 0 {
		cfg.Queue = DefaultQueue
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Recorder{cfg: cfg, queue: make(chan Entry, cfg.Queue)}, nil
}

// Record queues e for writing without blocking, and reports whether it
// was queued; a full queue drops it (counted by Dropped). The Recorder
// keeps e.Blocks: the caller must not modify it afterwards.
func (r *Recorder) Record(e Entry) bool {
	select {
	case r.queue <- e:
		return true
	default:
		r.dropped.Add(1)
		return false
	}
}

// Dropped returns how many entries Record dropped for a full queue.
func (r *Recorder) Dropped() uint64 { return r.dropped.Load() }

// Written returns how many entries Run has written.
func (r *Recorder) Written() uint64 { return r.written.Load() }

// Failed returns how many entries Run could not write (disk errors).
func (r *Recorder) Failed() uint64 { return r.failed.Load() }

// Run writes queued entries until ctx ends, then writes what is still
// queued, closes the file and returns nil. It returns an error only when
// Dir cannot be created; a failed write is logged and counted (Failed),
// and the next entry starts a new file.
func (r *Recorder) Run(ctx context.Context) error {
	if err := os.MkdirAll(r.cfg.Dir, 0o750); err != nil {
		return fmt.Errorf("record: %w", err)
	}
	w := &rotator{cfg: &r.cfg}
	defer w.close()
	for {
		select {
		case <-ctx.Done():
			r.drain(w)
			return nil
		case e := <-r.queue:
			r.write(w, e)
			r.drain(w)
		}
	}
}

// drain writes the entries queued now, then flushes.
func (r *Recorder) drain(w *rotator) {
	for {
		select {
		case e := <-r.queue:
			r.write(w, e)
		default:
			if err := w.flush(); err != nil {
				r.cfg.Log.Warn("record: flush", "err", err)
			}
			return
		}
	}
}

func (r *Recorder) write(w *rotator, e Entry) {
	e.Tenant, e.Session = r.hash(e.Tenant), r.hash(e.Session)
	line, err := appendLine(nil, e)
	if err == nil {
		err = w.write(line)
	}
	if err != nil {
		r.failed.Add(1)
		r.cfg.Log.Warn("record: write", "err", err)
		w.close()
		return
	}
	r.written.Add(1)
}

// hash returns 16 hex digits of id's (keyed) hash; "" stays "".
func (r *Recorder) hash(id string) string {
	if id == "" {
		return ""
	}
	var sum []byte
	if len(r.cfg.Key) > 0 {
		m := hmac.New(sha256.New, r.cfg.Key)
		m.Write([]byte(id))
		sum = m.Sum(nil)
	} else {
		s := sha256.Sum256([]byte(id))
		sum = s[:]
	}
	return hex.EncodeToString(sum[:8])
}

// line is an Entry as a file holds it.
type line struct {
	Timestamp    int64   `json:"timestamp"`
	Tenant       string  `json:"tenant"`
	Session      string  `json:"session"`
	BlockTokens  int     `json:"block_tokens"`
	HashIDs      []int64 `json:"hash_ids"`
	InputLength  int     `json:"input_length"`
	OutputLength int     `json:"output_length"`
	Replica      string  `json:"replica"`
	CachedTokens int     `json:"cached_tokens"`
}

// appendLine appends e as one JSON line, clamped into the ranges Read
// accepts (a zero Time is the epoch; negative lengths are 0; cached
// tokens are at most the prompt's) so that every written line can be
// read back. It fails for what cannot be clamped: block hashes without
// a block size, or an id longer than 256 bytes.
func appendLine(b []byte, e Entry) ([]byte, error) {
	l := line{Timestamp: min(max(0, e.Time.UnixMilli()), maxTimestamp), Tenant: e.Tenant, Session: e.Session,
		BlockTokens: min(max(0, e.BlockTokens), maxTokens), HashIDs: make([]int64, len(e.Blocks)),
		InputLength: min(max(0, e.PromptTokens), maxTokens), OutputLength: min(max(0, e.OutputTokens), maxTokens),
		Replica: e.Replica}
	l.CachedTokens = min(max(0, e.CachedTokens), l.InputLength)
	for i, k := range e.Blocks {
		l.HashIDs[i] = int64(k)
	}
	if err := l.validate(); err != nil {
		return b, fmt.Errorf("record: %w", err)
	}
	j, err := json.Marshal(l)
	if err != nil {
		return b, err
	}
	return append(append(b, j...), '\n'), nil
}

// filePrefix and fileSuffix frame a recorded file's name around its
// sequence number.
const (
	filePrefix = "warmpath-record-"
	fileSuffix = ".jsonl"
)

// rotator is Run's current file. Only Run's goroutine uses it.
type rotator struct {
	cfg  *Config
	f    *os.File
	buf  *bufio.Writer
	size int64
	seq  int // the current (or last) file's number, 0 before the first
}

func (w *rotator) write(line []byte) error {
	if w.f != nil && w.size > 0 && w.size+int64(len(line)) > w.cfg.MaxFileBytes {
		w.close()
	}
	if w.f == nil {
		if err := w.open(); err != nil {
			return err
		}
	}
	n, err := w.buf.Write(line)
	w.size += int64(n)
	return err
}

// open starts the next file and deletes the ones beyond Keep.
func (w *rotator) open() error {
	if w.seq == 0 {
		names, err := Files(w.cfg.Dir)
		if err != nil {
			return err
		}
		if len(names) > 0 {
			w.seq, _ = seqOf(filepath.Base(names[len(names)-1]))
		}
	}
	w.seq++
	f, err := os.OpenFile(filepath.Join(w.cfg.Dir, fmt.Sprintf("%s%08d%s", filePrefix, w.seq, fileSuffix)),
		os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o640)
	if err != nil {
		return fmt.Errorf("record: %w", err)
	}
	w.f, w.buf, w.size = f, bufio.NewWriterSize(f, 64<<10), 0
	return w.prune()
}

// prune deletes the oldest files beyond Keep.
func (w *rotator) prune() error {
	names, err := Files(w.cfg.Dir)
	if err != nil {
		return err
	}
	for _, n := range names[:max(0, len(names)-w.cfg.Keep)] {
		if err := os.Remove(n); err != nil {
			return fmt.Errorf("record: %w", err)
		}
	}
	return nil
}

func (w *rotator) flush() error {
	if w.buf == nil {
		return nil
	}
	return w.buf.Flush()
}

// close flushes and closes the current file, if any.
func (w *rotator) close() {
	if w.f == nil {
		return
	}
	ferr := w.buf.Flush()
	if err := errors.Join(ferr, w.f.Close()); err != nil {
		w.cfg.Log.Warn("record: close", "file", w.f.Name(), "err", err)
	}
	w.f, w.buf = nil, nil
}

// Files returns the recorded files in dir, oldest first.
func Files(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("record: %w", err)
	}
	type file struct {
		seq  int
		path string
	}
	var fs []file
	for _, e := range ents {
		if seq, ok := seqOf(e.Name()); ok && e.Type().IsRegular() {
			fs = append(fs, file{seq, filepath.Join(dir, e.Name())})
		}
	}
	slices.SortFunc(fs, func(a, b file) int { return a.seq - b.seq })
	out := make([]string, len(fs))
	for i, f := range fs {
		out[i] = f.path
	}
	return out, nil
}

// seqOf returns the sequence number of a recorded file's name.
func seqOf(name string) (int, bool) {
	s, ok := strings.CutPrefix(name, filePrefix)
	if !ok {
		return 0, false
	}
	if s, ok = strings.CutSuffix(s, fileSuffix); !ok {
		return 0, false
	}
	n, err := strconv.Atoi(s)
	return n, err == nil && n > 0 && n < 1<<40
}
