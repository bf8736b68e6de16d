package kvevents

import (
	"encoding/binary"
	"fmt"
	"net"
	"strconv"
	"strings"
)

// EndSeq is the sequence number of the replay end marker: the eight bytes
// FF…FF (−1 as a signed int64), sent with an empty payload.
const EndSeq uint64 = 1<<64 - 1

// ParseTopic splits a topic of the form kv@<replica>@<model>, llm-d's
// convention (the replica is usually ip:port), into its replica and model.
// Any other topic, including one with more or fewer '@', is returned whole
// as the replica with an empty model.
func ParseTopic(topic string) (replica, model string) {
	parts := strings.Split(topic, "@")
	if len(parts) == 3 {
		return parts[1], parts[2]
	}
	return topic, ""
}

// Topic returns the topic kv@<replica>@<model> that ParseTopic splits.
func Topic(replica, model string) string {
	return "kv@" + replica + "@" + model
}

// ParseSeq decodes a sequence-number frame: eight bytes, big-endian
// unsigned.
func ParseSeq(frame []byte) (uint64, error) {
	if len(frame) != 8 {
		return 0, fmt.Errorf("kvevents: sequence frame of %d bytes, want 8", len(frame))
	}
	return binary.BigEndian.Uint64(frame), nil
}

// seqFrame encodes seq as a sequence-number frame.
func seqFrame(seq uint64) []byte {
	return binary.BigEndian.AppendUint64(make([]byte, 0, 8), seq)
}

// OffsetEndpoint returns the endpoint vLLM's data-parallel rank dpRank
// uses when configured with endpoint: tcp ports are offset by dpRank and
// inproc endpoints get the suffix _dp<rank>, as vLLM's offset_endpoint_port
// does; other endpoints, and rank 0, are returned unchanged.
func OffsetEndpoint(endpoint string, dpRank int) string {
	if dpRank == 0 {
		return endpoint
	}
	switch {
	case strings.HasPrefix(endpoint, "inproc://"):
		return endpoint + "_dp" + strconv.Itoa(dpRank)
	case strings.HasPrefix(endpoint, "tcp://"):
		host, port, err := net.SplitHostPort(strings.TrimPrefix(endpoint, "tcp://"))
		if err != nil {
			return endpoint
		}
		p, err := strconv.Atoi(port)
		if err != nil {
			return endpoint
		}
		return "tcp://" + net.JoinHostPort(host, strconv.Itoa(p+dpRank))
	}
	return endpoint
}

// bindsEndpoint reports whether vLLM binds (rather than connects) a PUB
// socket on endpoint: wildcards, IPv6 any-addresses, ipc and inproc bind.
func bindsEndpoint(endpoint string) bool {
	return strings.Contains(endpoint, "*") || strings.Contains(endpoint, "::") ||
		strings.HasPrefix(endpoint, "ipc://") || strings.HasPrefix(endpoint, "inproc://")
}

// CheckPortLayout checks the endpoints of an engine with size
// data-parallel ranks for collisions. vLLM offsets the events endpoint
// and the replay endpoint of rank r by r (OffsetEndpoint), so the events
// take ports [e, e+size) and the replays [p, p+size): the two ranges must
// not overlap on one host, nor run past 65535. With vLLM's example ports
// (events 5557, replay 5558) and two ranks, rank 1 would publish on rank
// 0's replay port. replay may be empty (no replay endpoint). Endpoints
// other than tcp://host:port (ipc, inproc) are offset by name and never
// collide; hosts that differ (neither a wildcard) do not collide either.
// The returned error says which ports collide and how to space them.
func CheckPortLayout(events, replay string, size int) error {
	if size < 1 {
		return fmt.Errorf("kvevents: data-parallel size %d < 1", size)
	}
	eh, ep, eok := tcpHostPort(events)
	rh, rp, rok := tcpHostPort(replay)
	for _, c := range []struct {
		name, ep string
		port     int
		ok       bool
	}{{"events", events, ep, eok}, {"replay", replay, rp, rok}} {
		if c.ok && c.port+size-1 > 65535 {
			return fmt.Errorf("kvevents: %s endpoint %s: %d data-parallel ranks need ports %d-%d, past 65535",
				c.name, c.ep, size, c.port, c.port+size-1)
		}
	}
	if !eok || !rok || !sameHost(eh, rh) {
		return nil
	}
	if ep < rp+size && rp < ep+size {
		// The first collision: events rank i on replay rank j's port.
		i, j := rp-ep, 0
		if rp < ep {
			i, j = 0, ep-rp
		}
		return fmt.Errorf("kvevents: with %d data-parallel ranks the events ports %d-%d (%s + rank) and the replay "+
			"ports %d-%d (%s + rank) overlap: rank %d's events port %d is rank %d's replay port; put the replay "+
			"endpoint at least %d ports away from the events endpoint (e.g. events %d, replay %d)",
			size, ep, ep+size-1, events, rp, rp+size-1, replay, i, ep+i, j, size, ep, ep+max(size, 10))
	}
	return nil
}

// tcpHostPort splits tcp://host:port; ok is false for anything else.
func tcpHostPort(endpoint string) (host string, port int, ok bool) {
	rest, found := strings.CutPrefix(endpoint, "tcp://")
	if !found {
		return "", 0, false
	}
	h, p, err := net.SplitHostPort(rest)
	if err != nil {
		return "", 0, false
	}
	n, err := strconv.Atoi(p)
	if err != nil || n < 1 || n > 65535 {
		return "", 0, false
	}
	return h, n, true
}

// sameHost reports whether two endpoint hosts may be the same interface:
// equal, or either a wildcard.
func sameHost(a, b string) bool {
	wild := func(h string) bool { return h == "*" || h == "" || h == "0.0.0.0" || h == "::" }
	return a == b || wild(a) || wild(b)
}
