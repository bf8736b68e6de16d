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
