package fairq_test

import (
	"context"
	"fmt"

	"github.com/warmpath/warmpath/tenancy/fairq"
)

// The gateway admits each request before routing it and ends the grant
// when the response ends. Here the fleet takes one request at a time.
func ExampleQueue_Admit() {
	capacity := fairq.CapacityFunc(func(model string, inflight int) bool { return inflight >= 1 })
	q, err := fairq.New(fairq.Config{}, capacity, nil, nil, nil)
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	first, _ := q.Admit(ctx, fairq.Ticket{Tenant: "acme", Model: "qwen3-32b", Cost: 1200})
	fmt.Println("first waited:", first.Waited())

	second := make(chan *fairq.Grant)
	go func() {
		g, _ := q.Admit(ctx, fairq.Ticket{Tenant: "acme", Model: "qwen3-32b", Session: "s1", Turn: 1, Cost: 40})
		second <- g
	}()
	first.Charge(250) // output tokens, as the stream reports them
	first.Done()      // frees the slot: the waiting turn is dispatched
	g := <-second
	fmt.Println("second admitted in class", g.Class())
	g.Done()
	// Output:
	// first waited: 0s
	// second admitted in class interactive
}
