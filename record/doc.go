// Package record writes the gateway's routed requests to disk, one JSON
// line each, for offline replay (warmpath analyze), and reads them back.
// Recording is opt-in.
//
// A line holds the request's time in milliseconds (timestamp), its tenant
// and session as keyed hashes (tenant, session), its prompt's block
// hashes at the prefix index's block size (hash_ids, each a uint64 block
// key written as the int64 of the same bits; block_tokens), its prompt and
// output lengths in tokens (input_length, output_length), the replica
// chosen (replica) and the cached tokens the replica reported
// (cached_tokens). The names of timestamp, input_length, output_length
// and hash_ids are the Mooncake trace's. No prompt or output text is ever
// written.
//
// # Concurrency model
//
// [Recorder.Record] is called on the request path and never blocks: it
// hands the entry to a bounded queue, or counts it dropped when the queue
// is full. [Recorder.Run], a goroutine the caller owns, is the only
// writer: it hashes the ids, appends the lines to the current file,
// flushes after each burst, rotates to a new file when the current one
// would pass [Config.MaxFileBytes], and keeps the newest [Config.Keep]
// files, named warmpath-record-NNNNNNNN.jsonl in [Config.Dir]. When its
// context ends it writes what is queued, closes the file and returns.
//
// # Reading
//
// [Read] and [ReadDir] parse recorded files; files are input from
// outside the process, so every line is validated (its size, field
// ranges) and a bad line is an error naming it, except a last line cut
// short by a crash, which is skipped. The writer clamps each entry into
// the ranges the reader accepts, so whatever it wrote reads back.
package record
