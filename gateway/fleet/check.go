package fleet

import (
	"fmt"
	"strconv"

	"github.com/warmpath/warmpath/kvevents"
)

// CheckSpecs checks every replica and discovery spec, as a configuration
// check does before anything starts: with [CheckReplica] and [CheckDNS]
// (base URLs without /v1, ZMQ endpoints that can be dialled, names
// unique) and their port layouts against [kvevents.CheckPortLayout] (the
// replay ports clear of every data-parallel rank's KV-event port). Unlike
// [New] it reports every problem, each error starting with its spec's
// yaml path (replicas[1].url: …, discovery[0].port: …).
func CheckSpecs(replicas []ReplicaSpec, discovery []DNSSpec) []error {
	var errs []error
	names := map[string]int{}
	for i, r := range replicas {
		probe := r
		if field, err := checkPorts(r); err != nil {
			// Reported with CheckPortLayout's advice, not again by the fleet.
			errs = append(errs, fmt.Errorf("replicas[%d].%s: %w", i, field, err))
			probe.KVEndpoint, probe.ReplayEndpoint = "", ""
		}
		ns, err := CheckReplica(probe)
		if err != nil {
			errs = append(errs, fmt.Errorf("replicas[%d].%w", i, err))
			continue
		}
		if j, dup := names[ns.Name]; dup {
			errs = append(errs, fmt.Errorf("replicas[%d].name: duplicate %q (also replicas[%d])", i, ns.Name, j))
		}
		names[ns.Name] = i
	}
	for i, d := range discovery {
		if err := checkDNSPorts(d); err != nil {
			errs = append(errs, fmt.Errorf("discovery[%d].replay_port: %w", i, err))
			d.ReplayPort = 0 // reported; not again by the fleet
		}
		if _, err := CheckDNS(d); err != nil {
			for _, e := range Each(err) {
				errs = append(errs, fmt.Errorf("discovery[%d].%w", i, e))
			}
		}
	}
	return errs
}

// checkPorts checks a replica's port layout with kvevents.CheckPortLayout
// and returns the field to blame: kv_events or kv_replay when a rank's
// port is out of range, kv_replay when the ranks' ports overlap.
func checkPorts(r ReplicaSpec) (string, error) {
	n := max(r.DataParallelSize, 1)
	if err := kvevents.CheckPortLayout(r.KVEndpoint, "", n); err != nil {
		return "kv_events", err
	}
	return "kv_replay", kvevents.CheckPortLayout(r.KVEndpoint, r.ReplayEndpoint, n)
}

// checkDNSPorts checks a discovery spec's port layout as every pod it
// finds will have it.
func checkDNSPorts(d DNSSpec) error {
	if d.KVPort <= 0 || d.ReplayPort <= 0 || d.DataParallelSize < 0 {
		return nil // a missing port, or a range error CheckDNS reports
	}
	return kvevents.CheckPortLayout("tcp://pod:"+strconv.Itoa(d.KVPort), "tcp://pod:"+strconv.Itoa(d.ReplayPort), max(d.DataParallelSize, 1))
}
