// Package bench measures what warmpath buys: offline, by replaying a
// request log through the gateway's own scoring code against simulated
// replica caches (Analyze), and live, by driving workloads through the real
// gateway in front of an in-process simulated fleet, once per routing policy
// on a fresh fleet (Run).
package bench
