package bench

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"

	"github.com/warmpath/warmpath/gateway/request"
)

// simInput is the trace prepared once for every simulated run.
type simInput struct {
	blockTokens int
	reqs        []TraceRequest
	// arrival is each request's scaled arrival time in seconds.
	arrival []float64
	// ids holds each request's block keys as dense ids in [0, universe),
	// and approxKeys the same ids as non-zero keys for a
	// blockindex.Approx.
	ids        [][]int32
	approxKeys [][]uint64
	universe   int
	// sessions holds each request's session key, "" for none.
	sessions []string
}

func newSimInput(t *Trace, cfg AnalyzeConfig) (*simInput, error) {
	if t.Format == FormatMooncake && slices.ContainsFunc(t.Requests, func(r TraceRequest) bool { return r.Opening == 0 }) {
		// A trace built in memory rather than read: derive its openings.
		t = &Trace{Format: t.Format, BlockTokens: t.BlockTokens, Requests: slices.Clone(t.Requests)}
		setOpenings(t.Requests)
	}
	n := len(t.Requests)
	in := &simInput{
		blockTokens: t.BlockTokens,
		reqs:        t.Requests,
		arrival:     make([]float64, n),
		ids:         make([][]int32, n),
		approxKeys:  make([][]uint64, n),
		sessions:    make([]string, n),
	}
	total := 0
	for i := range t.Requests {
		total += len(t.Requests[i].Blocks)
	}
	flat := make([]int32, 0, total)
	flatKeys := make([]uint64, 0, total)
	dense := make(map[uint64]int32, total/2)
	for i := range t.Requests {
		r := &t.Requests[i]
		if r.InputTokens <= 0 {
			return nil, fmt.Errorf("bench: analyze: request %d has no prompt", i)
		}
		in.arrival[i] = r.Arrival.Seconds() * cfg.TimeScale
		start := len(flat)
		for _, k := range r.Blocks {
			id, ok := dense[k]
			if !ok {
				if in.universe >= math.MaxInt32-1 {
					return nil, errors.New("bench: analyze: too many distinct blocks")
				}
				id = int32(in.universe)
				dense[k] = id
				in.universe++
			}
			flat = append(flat, id)
			// Dense ids, not the trace's 64-bit keys, so that every key
			// is a valid non-zero blockindex key.
			flatKeys = append(flatKeys, uint64(id)+1)
		}
		in.ids[i] = flat[start:len(flat):len(flat)]
		in.approxKeys[i] = flatKeys[start:len(flatKeys):len(flatKeys)]
		in.sessions[i] = sessionKey(t.Format, r)
	}
	return in, nil
}

// sessionKey derives a request's session key as the gateway does: by
// parsing a chat request's body with the gateway's own parser (an
// unparseable body has no session). A recorded request carries the
// gateway's own key, hashed. A Mooncake record (no body, no roles)
// never reaches a gateway, so its key is the analyzer's own stand-in for
// the gateway's opening hash: the key of the last block of its opening
// (see ReadTrace), the chain over the blocks it shares with other
// conversations and the first where it parts from them, which every later
// turn of the conversation repeats. A one-block Mooncake request has no
// session.
func sessionKey(format string, r *TraceRequest) string {
	if format == FormatRecord {
		return r.Session
	}
	if format != FormatOpenAI {
		if len(r.Blocks) < 2 {
			return ""
		}
		return "m:" + strconv.FormatUint(r.Blocks[max(1, r.Opening)-1], 16)
	}
	req, err := request.Parse(request.Chat, http.Header{}, r.Body, nil)
	if err != nil {
		return ""
	}
	return req.Session().Value
}

// pooledLRU returns the cached fraction of one LRU of capacity blocks that
// sees every request of in; prompt is their total prompt tokens.
func pooledLRU(in *simInput, capacity int, prompt int64) float64 {
	l := newBlockLRU(in.universe, capacity)
	var cached int64
	for i := range in.reqs {
		cached += int64(min(l.prefix(in.ids[i])*in.blockTokens, in.reqs[i].InputTokens))
		l.touch(in.ids[i])
	}
	return ratio(cached, prompt)
}
