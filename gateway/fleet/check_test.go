package fleet

import (
	"strings"
	"testing"
)

// CheckSpecs reports every problem at once, each under its spec's yaml
// path, port layouts included.
func TestCheckSpecs(t *testing.T) {
	good := ReplicaSpec{URL: "http://a:1"}
	if errs := CheckSpecs([]ReplicaSpec{good}, []DNSSpec{{Name: "vllm", Port: 8000}}); errs != nil {
		t.Fatalf("CheckSpecs(good) = %v; want none", errs)
	}
	errs := CheckSpecs(
		[]ReplicaSpec{good, good, {URL: "http://b:1", KVEndpoint: "tcp://b:5557", ReplayEndpoint: "tcp://b:5558", DataParallelSize: 2}},
		[]DNSSpec{{Name: "vllm"}},
	)
	var all []string
	for _, err := range errs {
		all = append(all, err.Error())
	}
	for _, want := range []string{"replicas[1].name: duplicate", "replicas[2].kv_replay: kvevents:", "discovery[0].port:"} {
		if !strings.Contains(strings.Join(all, "\n"), want) {
			t.Errorf("CheckSpecs = %q; want an error starting %q", all, want)
		}
	}
}
