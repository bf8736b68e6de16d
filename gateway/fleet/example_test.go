package fleet_test

import (
	"fmt"

	"github.com/warmpath/warmpath/gateway/fleet"
)

func ExampleNew() {
	f, err := fleet.New(fleet.Config{
		Replicas: []fleet.ReplicaSpec{
			{URL: "http://10.0.0.8:8000", KVEndpoint: "tcp://10.0.0.8:5557"},
			{URL: "http://10.0.0.7:8000/", Model: "Qwen/Qwen3-8B"},
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, r := range f.Snapshot().Replicas {
		s := r.State()
		fmt.Println(r.Spec.Name, r.Spec.URL, s.Healthy, s.Models, r.Spec.KVSources())
	}
	_, err = fleet.New(fleet.Config{Replicas: []fleet.ReplicaSpec{{URL: "10.0.0.7:8000"}}})
	fmt.Println(err)
	// Output:
	// 10.0.0.7:8000 http://10.0.0.7:8000 false [Qwen/Qwen3-8B] []
	// 10.0.0.8:8000 http://10.0.0.8:8000 false [] [{0 tcp://10.0.0.8:5557 }]
	// fleet: replicas[0].url: "10.0.0.7:8000" is not an http(s) URL with a host
}

func ExampleReplicaSpec_KVSources() {
	spec := fleet.ReplicaSpec{
		URL:              "http://10.0.0.7:8000",
		KVEndpoint:       "tcp://10.0.0.7:5557",
		ReplayEndpoint:   "tcp://10.0.0.7:5600",
		DataParallelSize: 2,
	}
	for _, src := range spec.KVSources() {
		fmt.Println(src.Rank, src.Endpoint, src.ReplayEndpoint)
	}
	// Output:
	// 0 tcp://10.0.0.7:5557 tcp://10.0.0.7:5600
	// 1 tcp://10.0.0.7:5558 tcp://10.0.0.7:5601
}
