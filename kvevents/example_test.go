package kvevents_test

import (
	"fmt"

	"github.com/warmpath/warmpath/kvevents"
)

func ExampleDecode() {
	parent := uint64(1<<63 + 1)
	payload, err := kvevents.Encode(kvevents.Batch{
		TS: 1789095808.5,
		Events: []kvevents.Event{
			&kvevents.BlockStored{
				BlockHashes:     []uint64{15760518052499183552},
				ParentBlockHash: &parent,
				TokenIDs:        []uint32{1, 2, 3, 4},
				BlockSize:       4,
				Medium:          kvevents.MediumGPU,
			},
			&kvevents.BlockRemoved{BlockHashes: []uint64{42}, Medium: kvevents.MediumGPU},
		},
	}, kvevents.FormatMap)
	if err != nil {
		panic(err)
	}
	b, stats, err := kvevents.Decode(payload)
	if err != nil {
		panic(err)
	}
	for _, ev := range b.Events {
		switch e := ev.(type) {
		case *kvevents.BlockStored:
			fmt.Println(e.Type(), e.BlockHashes, *e.ParentBlockHash, e.TokenIDs)
		case *kvevents.BlockRemoved:
			fmt.Println(e.Type(), e.BlockHashes)
		}
	}
	fmt.Println("skipped:", stats.UnknownEvents)
	// Output:
	// BlockStored [15760518052499183552] 9223372036854775809 [1 2 3 4]
	// BlockRemoved [42]
	// skipped: 0
}

func ExampleParseTopic() {
	replica, model := kvevents.ParseTopic(kvevents.Topic("10.0.0.7:8000", "qwen3-32b"))
	fmt.Println(replica, model)
	replica, model = kvevents.ParseTopic("engine-3")
	fmt.Printf("%s %q\n", replica, model)
	// Output:
	// 10.0.0.7:8000 qwen3-32b
	// engine-3 ""
}
