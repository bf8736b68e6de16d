package bench

import (
	"slices"
	"strconv"
	"strings"
	"time"
)

// gatewayTiming is one request's time in the gateway's phases, from its
// Server-Timing debug header, simulated: prepare (routing's I/O before
// admission: the session lookup, the tokenizer, the prefix match), queue
// (admission), route (the decision and its I/O) and upstream (from
// sending to the answering replica's headers, which the simulator sends
// with the first token).
type gatewayTiming struct {
	prepare, queue, route, upstream time.Duration
}

// parseServerTiming reads the gateway's Server-Timing value ("prepare;dur=1.2,
// queue;dur=0, …", wall-clock milliseconds) into simulated durations at
// speed; nil when it names none of the phases.
func parseServerTiming(v string, speed float64) *gatewayTiming {
	var t gatewayTiming
	found := false
	for _, m := range strings.Split(v, ",") {
		name, param, ok := strings.Cut(strings.TrimSpace(m), ";")
		dur, ok2 := strings.CutPrefix(strings.TrimSpace(param), "dur=")
		ms, err := strconv.ParseFloat(dur, 64)
		if !ok || !ok2 || err != nil || ms < 0 {
			continue
		}
		d := time.Duration(ms * speed * float64(time.Millisecond))
		switch name {
		case "prepare":
			t.prepare = d
		case "queue":
			t.queue = d
		case "route":
			t.route = d
		case "upstream":
			t.upstream = d
		default:
			continue
		}
		found = true
	}
	if !found {
		return nil
	}
	return &t
}

// Outside breaks a policy's TTFT down into where the time went, simulated
// milliseconds, from the gateway's Server-Timing phases and the engine's
// own TTFT: Prepare, Queue and Route are the gateway's phases before
// sending; Host is the upstream phase less the engine's TTFT (the HTTP
// hop to the replica and its front end, and host scheduling, none on the
// engine's simulated clock); After is the rest of the client's TTFT (the
// stream's way back through the gateway to the client, the load
// generator, parsing before the gateway's pipeline). Each phase has its
// median over all measured requests and its mean over the tail, the
// requests whose TTFT is at least the policy's p90; TailReasons counts
// the tail's routing reasons.
type Outside struct {
	Requests    int            `json:"requests"`
	Engine      Phase          `json:"engine"`
	Prepare     Phase          `json:"prepare"`
	Queue       Phase          `json:"queue"`
	Route       Phase          `json:"route"`
	Host        Phase          `json:"host"`
	After       Phase          `json:"after"`
	TailReasons map[string]int `json:"tail_reasons,omitempty"`
}

// Phase is one part of TTFT: its median and its mean over the tail,
// simulated milliseconds.
type Phase struct {
	P50Ms      float64 `json:"p50_ms"`
	TailMeanMs float64 `json:"tail_mean_ms"`
}

// outsideOf breaks down the TTFT of the samples that carry the gateway's
// timing and the engine's TTFT; nil when none does. p90 is the policy's
// p90 TTFT, ms.
func outsideOf(samples []sample, p90 float64) *Outside {
	var parts [6][]float64
	var tail [6]float64
	o := &Outside{TailReasons: map[string]int{}}
	nTail := 0
	for i := range samples {
		s := &samples[i]
		if s.warmup || !s.ok() || s.timing == nil || s.engineTTFT < 0 || s.ttft < 0 {
			continue
		}
		t := s.timing
		v := [6]float64{msOf(s.engineTTFT), msOf(t.prepare), msOf(t.queue), msOf(t.route),
			msOf(t.upstream - s.engineTTFT), msOf(s.ttft - t.prepare - t.queue - t.route - t.upstream)}
		for k := range v {
			parts[k] = append(parts[k], v[k])
		}
		if msOf(s.ttft) >= p90 {
			nTail++
			o.TailReasons[s.reason]++
			for k := range v {
				tail[k] += v[k]
			}
		}
	}
	o.Requests = len(parts[0])
	if o.Requests == 0 {
		return nil
	}
	out := [6]*Phase{&o.Engine, &o.Prepare, &o.Queue, &o.Route, &o.Host, &o.After}
	for k, ph := range out {
		slices.Sort(parts[k])
		ph.P50Ms = finiteOr0(percentile(parts[k], 50))
		if nTail > 0 {
			ph.TailMeanMs = tail[k] / float64(nTail)
		}
	}
	return o
}
