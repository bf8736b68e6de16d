package deploy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
)

// vllmServe is a parsed `vllm serve` command line.
type vllmServe struct {
	Model string              // the positional model (or --model)
	Flags map[string][]string // flag name without dashes → values ("" for booleans)
}

// vllmBoolFlags are the boolean flags the recipes use; any other flag takes
// a value (as --flag=value or --flag value).
var vllmBoolFlags = map[string]bool{
	"enable-prefix-caching":        true,
	"no-enable-prefix-caching":     true,
	"enable-prompt-tokens-details": true,
	"trust-remote-code":            true,
	"enforce-eager":                true,
}

// parseVLLMServe parses the arguments after `vllm serve`.
func parseVLLMServe(args []string) (vllmServe, error) {
	v := vllmServe{Flags: map[string][]string{}}
	for i := 0; i < len(args); i++ {
		a := args[i]
		name, ok := strings.CutPrefix(a, "--")
		if !ok {
			if v.Model != "" {
				return v, fmt.Errorf("second positional argument %q (model %q)", a, v.Model)
			}
			v.Model = a
			continue
		}
		name, val, hasVal := strings.Cut(name, "=")
		if !hasVal && !vllmBoolFlags[name] {
			if i+1 >= len(args) {
				return v, fmt.Errorf("--%s needs a value", name)
			}
			i++
			val = args[i]
		}
		v.Flags[name] = append(v.Flags[name], val)
	}
	if m := v.Flags["model"]; len(m) > 0 && v.Model == "" {
		v.Model = m[0]
	}
	if v.Model == "" {
		return v, fmt.Errorf("no model")
	}
	return v, nil
}

// flag returns the last value of a flag and whether it was given.
func (v vllmServe) flag(name string) (string, bool) {
	vs := v.Flags[name]
	if len(vs) == 0 {
		return "", false
	}
	return vs[len(vs)-1], true
}

// ModelID is the id vLLM serves the model under, which requests and
// /tokenize calls must name: the first --served-model-name, else the model
// path itself.
func (v vllmServe) ModelID() string {
	if s, ok := v.flag("served-model-name"); ok && s != "" {
		return strings.Split(s, ",")[0]
	}
	return v.Model
}

// kvEventsConfig mirrors vLLM's KVEventsConfig (vllm/config/kv_events.py);
// decoding rejects unknown fields, so a misspelt key fails.
type kvEventsConfig struct {
	EnableKVCacheEvents bool   `json:"enable_kv_cache_events"`
	Publisher           string `json:"publisher"`
	Endpoint            string `json:"endpoint"`
	ReplayEndpoint      string `json:"replay_endpoint"`
	Topic               string `json:"topic"`
	BufferSteps         int    `json:"buffer_steps"`
	HWM                 int    `json:"hwm"`
	MaxQueueSize        int    `json:"max_queue_size"`
}

// vllmPorts are the ports a checked vLLM command line uses.
type vllmPorts struct {
	HTTP, KV, Replay int
}

// maxDPRanks is how many data-parallel ranks the replay port must leave
// room for above the KV-event port (vLLM offsets both by the rank).
const maxDPRanks = 8

// checkVLLMServe checks what warmpath needs from a vLLM command line (with
// variable references already expanded) and returns its ports.
func checkVLLMServe(t *testing.T, where string, v vllmServe) vllmPorts {
	t.Helper()
	var p vllmPorts
	for _, f := range []string{"enable-prefix-caching", "enable-prompt-tokens-details"} {
		if _, ok := v.flag(f); !ok {
			t.Errorf("%s: vllm serve lacks --%s", where, f)
		}
	}
	if _, ok := v.flag("served-model-name"); !ok {
		t.Errorf("%s: vllm serve lacks --served-model-name: it serves %q, which clients and the gateway must then name", where, v.Model)
	}
	if algo, ok := v.flag("prefix-caching-hash-algo"); ok {
		switch algo {
		case "sha256", "sha256_cbor", "xxhash", "xxhash_cbor":
		default:
			t.Errorf("%s: --prefix-caching-hash-algo %q is not one vLLM accepts", where, algo)
		}
	}
	p.HTTP = 8000
	if s, ok := v.flag("port"); ok {
		n, err := strconv.Atoi(s)
		if err != nil {
			t.Errorf("%s: --port %q: %v", where, s, err)
		}
		p.HTTP = n
	}
	raw, ok := v.flag("kv-events-config")
	if !ok {
		t.Errorf("%s: vllm serve lacks --kv-events-config", where)
		return p
	}
	var kc kvEventsConfig
	dec := json.NewDecoder(bytes.NewReader([]byte(raw)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&kc); err != nil {
		t.Errorf("%s: --kv-events-config %s: %v", where, raw, err)
		return p
	}
	if !kc.EnableKVCacheEvents || kc.Publisher != "zmq" {
		t.Errorf("%s: --kv-events-config: enable_kv_cache_events %v, publisher %q; want true and \"zmq\" (0.10.x defaulted to \"null\")", where, kc.EnableKVCacheEvents, kc.Publisher)
	}
	p.KV = bindPort(t, where, "endpoint", kc.Endpoint)
	p.Replay = bindPort(t, where, "replay_endpoint", kc.ReplayEndpoint)
	if p.Replay > 0 && p.Replay-p.KV < maxDPRanks && p.KV-p.Replay < maxDPRanks {
		t.Errorf("%s: KV events on %d and replay on %d collide once data-parallel ranks offset them (want %d ranks apart)", where, p.KV, p.Replay, maxDPRanks)
	}
	parts := strings.Split(kc.Topic, "@")
	if len(parts) != 3 || parts[0] != "kv" || parts[2] != v.ModelID() {
		t.Errorf("%s: topic %q; want kv@<host:port>@%s (llm-d's convention, naming the served model)", where, kc.Topic, v.ModelID())
	}
	return p
}

// bindPort checks that ep is a wildcard tcp endpoint, which makes vLLM bind
// (the per-replica topology), and returns its port.
func bindPort(t *testing.T, where, field, ep string) int {
	t.Helper()
	addr, ok := strings.CutPrefix(ep, "tcp://")
	host, port, err := net.SplitHostPort(addr)
	n, perr := strconv.Atoi(port)
	if !ok || err != nil || perr != nil || host != "*" {
		t.Errorf("%s: %s %q; want tcp://*:<port> (vLLM binds wildcard endpoints)", where, field, ep)
		return 0
	}
	return n
}

func TestParseVLLMServe(t *testing.T) {
	v, err := parseVLLMServe([]string{"Qwen/Qwen3-32B", "--served-model-name", "qwen3-32b", "--enable-prefix-caching", "--port=8001"})
	if err != nil {
		t.Fatal(err)
	}
	if v.Model != "Qwen/Qwen3-32B" || v.ModelID() != "qwen3-32b" {
		t.Errorf("model %q id %q", v.Model, v.ModelID())
	}
	if p, _ := v.flag("port"); p != "8001" {
		t.Errorf("port %q", p)
	}
	if _, ok := v.flag("enable-prefix-caching"); !ok {
		t.Error("boolean flag lost")
	}
	v, err = parseVLLMServe([]string{"--model", "Qwen/Qwen3-32B"})
	if err != nil || v.ModelID() != "Qwen/Qwen3-32B" {
		t.Errorf("without --served-model-name: id %q, %v; want the model path", v.ModelID(), err)
	}
	for _, bad := range [][]string{nil, {"a", "b"}, {"m", "--port"}} {
		if _, err := parseVLLMServe(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}
