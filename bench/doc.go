// Package bench measures what warmpath buys: offline, by replaying a
// request log through the gateway's own scoring code against simulated
// replica caches (Analyze), and live, by driving workloads through the real
// gateway in front of an in-process simulated fleet, once per routing policy
// on a fresh fleet (Run).
//
// # Offline analysis
//
// Analyze replays a Trace: the Mooncake trace (512-token hash ids), a log
// of chat requests (tokenized with the simulator's tokenizer, 16-token
// blocks) or the gateway's own recording (package record; ReadRecordTrace
// adapts its entries, keeping the recorded block keys at the recording's
// block size and the recorded session hashes, and Trace.Recorded holds
// what the fleet actually got). Config.RecordDir has a live run record
// each policy's traffic, so that a run can be replayed and the two
// compared.
//
// # Live benchmark
//
// Run plans a Workload (shared-prefix, agentic, agentic-harness, trace or
// mixed-tenants; see Workloads) and, for each policy in turn, builds a fresh simulated
// fleet (vllmsim, same configuration and seed), a fresh in-process Redis
// (miniredis) and a fresh gateway with that policy, drives the workload
// through the gateway with streamed chat completions, collects the
// figures and tears everything down. Every policy faces the same requests
// at the same times. Instead of the simulated fleet, Run can route to
// external OpenAI-compatible replicas
// (Config.Fleet, their prefix caches reset between policies) or benchmark
// one running endpoint (Config.Target). Config.Gateways > 1 puts several
// gateways sharing the one Redis in front of the fleet, as a highly
// available deployment runs them, and spreads requests over them in turn.
//
// A workload is a list of sessions, each a Script of turns: one request for
// the open-loop workloads, an agent run whose next turn carries the reply
// of the previous one for agentic. Sessions carry a class, a tenant and
// headers for workloads that need them; a plan that names Tenants runs the
// gateway in API-keys mode with those tenants created in its store.
//
// # Mixed tenants
//
// mixed-tenants compares the gateway's admission queue instead of routing
// policies (routing is warmpath, or the one policy given): tenant A's
// interactive chat sessions alone (no-burst), then with tenant B's burst
// of background agent runs under fifo (queue disabled), strict and fair,
// and a shares part (two equal background bursts, weights 1 and 3), each
// on a fresh fleet with the engines under priority scheduling and the
// class passed to them (queue.vllm_priority) except under fifo. Its report
// (MixedReport) has its own table and JSON: interactive TTFT percentiles,
// each p99 against no-burst, background turns and output rate, the longest
// time a request waited in the queue while some replica had idle capacity
// (from engine samples every 100 simulated ms), the same counting only the
// replica the request was then routed to, and each tenant's share of
// the contested dispatches against its weight.
//
// # Scale and speed
//
// Everything runs in one process, so the benchmark shrinks the work without
// changing its queueing shape. Config.Scale s multiplies every token count
// (prompts, outputs, KV capacity, the step's token budget) and
// ScaledProfile dilates the simulated engine's costs to match: prefill per
// token ÷ s, step base and per-sequence cost ÷ s, per-context-token
// attention cost ÷ s². A request then spends as long in prefill, in decode
// and in the queue as at full size, so request rates, pauses and stage
// lengths are left at full size and every simulated time is a full-size
// time; only the number of engine steps and streamed tokens drops by s.
// The gateway's one token-denominated threshold
// (routing.max_inflight_prefill_tokens) is scaled by s as well. One thing
// does not scale: a dilated step is 1/s times longer, so a request that
// arrives mid-step waits 1/s times longer for it (this adds roughly half a
// scaled step, ~50 ms at s = 0.25, to every TTFT). warmpath's TTFT model
// has no token-denominated constants left: its prior is per token of the
// default profile, which a run at scale s and speed v sees as 1/(s·v)
// slower per scaled token in wall-clock time, and its calibration fits the
// difference from the first answered requests.
//
// Config.Speed runs simulated time that many times faster than real time.
// All reported times are simulated: wall-clock durations multiplied by
// Speed. The gateway's and the load generator's own wall-clock overhead
// (a few milliseconds per request on a loaded 2-core host) is multiplied
// too; Result.EngineTTFT* report the replicas' own TTFT on their simulated
// clocks for comparison, and Result.Outside breaks TTFT down into the
// engine's, the gateway's phases (its Server-Timing debug header) and
// the rest. The gateway's periodic work (metrics scrapes,
// health checks, speculative-entry lifetime) is scheduled at its defaults
// divided by Speed, so that it behaves in simulated time as deployed, and
// streams are coalesced to at most two chunks per simulated second
// (Config.StreamInterval), which delays only a stream's last chunk.
//
// # Figures
//
// TTFT is the time to the first content-bearing chunk of the stream;
// output tokens per second and requests per second divide by the makespan
// (first send to last completion); the cached fraction is Σ
// usage.prompt_tokens_details.cached_tokens ÷ Σ usage.prompt_tokens over
// the responses; the ceiling is Ceiling over the prompts actually sent
// (tokenized with the simulator's tokenizer and chat template, 16-token
// blocks, unlimited cache), and the LRU ceiling the same through one LRU
// cache the size of the whole fleet's; the imbalance is max ÷ mean of
// the prefill tokens each replica computed. Warm-up requests are left out
// of latency and throughput, not of the cache figures.
//
// # Goroutines
//
// Run is blocking. Per policy it runs the fleet (Fleet.Run), the gateway
// (Gateway.Run), miniredis's server, the driver's scheduler (in Run's
// goroutine), one goroutine per active session, and a progress redrawer
// when Config.Progress is set; all are joined before the next policy.
package bench
