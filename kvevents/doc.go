// Package kvevents owns vLLM's KV-cache event stream: the msgpack codec for
// event batches (both the legacy tagged-array and the tagged-map layouts), a
// ZMQ subscriber that tracks sequence numbers, asks for replays and detects
// engine restarts, and a ZMQ publisher with a replay endpoint that sends
// frames exactly as vLLM does (used by the simulator).
//
// It does not interpret events: the block index (scoring/blockindex)
// implements [Handler] and turns batches into prefix keys. It reads no
// environment and keeps no package-level state; every socket lives in a
// caller-supplied *zmq.Context.
//
// # Wire format
//
// Each message is three frames: the topic (llm-d's convention is
// kv@<replica>@<model>, see [ParseTopic] and [Topic]), the sequence number
// (8 bytes, big-endian, from 0 per engine process, see [ParseSeq]), and a
// msgpack [Batch] [ts, events, data_parallel_rank]. [Decode] accepts events
// as tagged arrays (vLLM ≤ 0.23) and tagged maps (vLLM ≥ 0.26), mixed,
// skipping and counting unknown tags and fields ([DecodeStats]). [Encode]
// writes either layout as msgspec would ([FormatMap], [FormatArray]).
//
// Decode is a hand-written reader over the payload bytes, not a reflection
// or interface{} decode: it checks every declared length against the bytes
// that remain before allocating, bounds nesting, rejects wrong types
// instead of coercing them, and returns an error (never a panic) on
// malformed input. Events and their small values come from a few slabs
// per batch rather than an allocation each (a step evicting 512 blocks
// sends 512 BlockRemoved events: BenchmarkDecodeStep, 2,058 allocations
// before, 10 after). Encode uses github.com/vmihailenco/msgpack/v5's Encoder.
// Both are fuzzed together (FuzzDecode): whatever Decode accepts, Encode
// reproduces.
//
// # Topologies
//
// A [Subscriber] connects one SUB socket to one replica's PUB endpoint
// (vLLM binds tcp://*:5557); the gateway runs one per replica (and per
// data-parallel rank, at the endpoint's port + rank) and cancels it when
// the replica leaves. A [Central] binds one SUB socket that engines' PUB
// sockets connect to (one per data-parallel rank, CentralConfig.Ranks),
// naming replicas by topic, which CentralConfig.Resolve maps to fleet
// names: batches of a replica the fleet does not know are dropped,
// counted by topic and warned about once. Only one process can bind the
// address connecting engines dial, so several gateways put a [Relay] there
// (`warmpath kv-relay`): it binds that address and republishes every
// message unchanged on an XPUB socket that each gateway's Central connects
// to (CentralConfig.Connect); replays still go to each engine's ROUTER. A
// [Publisher] binds or connects its PUB socket by vLLM's rule and binds an
// optional replay ROUTER.
//
// # Sequencing
//
// Subscriber and Central keep sequence state per (replica, data-parallel
// rank) and call the Handler from their Run goroutine, for each replica in
// sequence order and exactly once per batch:
//
//   - first batch of a replica: Clear (whatever an earlier subscriber left
//     is stale), then, when it is not seq 0 and a replay endpoint is known,
//     a replay from 0;
//   - seq = last+1: Apply; seq ≤ last: dropped as a duplicate;
//   - gap: replay from last+1 over a DEALER (request ["", start_seq],
//     replies [seq, payload] or [topic, seq, payload] until the end marker
//     [EndSeq] with an empty payload), buffering live batches meanwhile and
//     delivering them after the replayed ones;
//   - the live seq goes backwards: the engine restarted; Clear, then
//     replay from 0 unless the new stream's seq 0 itself arrived;
//   - a gap that cannot be repaired (no replay endpoint, a replay that
//     times out, returns nothing, or starts later than asked because the
//     publisher's buffer moved on): Clear, then go on from the next batch.
//
// A replay from 0 (joining, or after a restart) asks for everything, and
// what the publisher still holds from its first retained batch on is
// everything there is: it is complete whether the publisher numbers from 1
// (llm-d-inference-sim) or has dropped its oldest batches. Live batches
// that a replay already applied are dropped without counting as
// duplicates.
//
// A data-parallel engine is one replica whose ranks publish separate
// streams (separate sockets in vLLM, rank r on port + r; see
// OffsetEndpoint and CheckPortLayout). When the Handler implements
// [RankClearer], each rank joins, restarts and clears on its own
// (ClearRank), and the other ranks keep their state and their sync. A
// plain Handler only knows Clear(replica), which also wipes what the other
// ranks contributed, so their sequence state is reset and they resync
// from 0 (with replay) on their next batch. Replays are bounded by an
// overall and an idle timeout and by the number of live batches buffered
// meanwhile.
//
// # Goroutines and concurrency
//
// Constructors start nothing. Each of Publisher.Run, Subscriber.Run,
// Central.Run and Relay.Run is one blocking goroutine that owns every
// socket of its component (pebbe/zmq4 sockets are not safe for concurrent
// use); sockets created by NewPublisher, NewCentral and NewRelay pass to
// Run when it starts. Run
// polls at least every 50 ms, returns ctx.Err() soon after ctx ends, and
// closes its sockets before returning. Publisher.Publish and Reset are safe
// for concurrent use and never block: they queue work for Run. Decode,
// Encode and the [Metrics] methods are safe for concurrent use.
//
// # Example
//
// A gateway following one replica:
//
//	sub, err := kvevents.NewSubscriber(zctx, kvevents.SubscriberConfig{
//		Replica:        "10.0.0.7:8000",
//		Endpoint:       "tcp://10.0.0.7:5557",
//		ReplayEndpoint: "tcp://10.0.0.7:5558",
//		Handler:        index, // Apply(replica, batch), ClearRank(replica, rank)
//		Metrics:        kvevents.NewMetrics(registry),
//		Logger:         logger,
//	})
//	if err != nil {
//		return err
//	}
//	group.Go(func() error { return sub.Run(ctx) })
package kvevents
